"""The CUDA simulator's shared arrays are one per thread block and call site, even when the block's
threads race to create them (the cause of a rare wrong count in the K-means pass under load)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from numba import cuda
from numba.core import config

pytestmark = [pytest.mark.cudasim,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]


class _SlowEmpty:
    """numpy, as the simulator sees it, with an ``empty`` that yields the interpreter for a while: every
    thread of the block arrives at the creation of a shared array before the first one stores it."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(*args, **kwargs):
        time.sleep(0.002)
        return np.empty(*args, **kwargs)


def test_shared_array_created_once_per_block_when_threads_race(monkeypatch):
    from numba import int32

    from gdask.ml.kernels import _cuda_common as cuc

    cuc.numba_cuda()  # makes the simulator's shared-array creation atomic
    from numba.cuda.simulator import kernelapi

    monkeypatch.setattr(kernelapi, "np", _SlowEmpty())

    @cuda.jit
    def count(out):
        hits = cuda.shared.array(1, int32)
        total = cuda.shared.array(2, int32)
        if cuda.threadIdx.x == 0:
            hits[0] = 0
            total[0] = 0
            total[1] = 0
        cuda.syncthreads()
        cuda.atomic.add(hits, 0, 1)
        cuda.atomic.add(total, 1, cuda.threadIdx.x)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            out[cuda.blockIdx.x, 0] = hits[0]
            out[cuda.blockIdx.x, 1] = total[1]

    out = np.zeros((3, 2), np.int32)
    count[3, 16](out)
    assert out.tolist() == [[16, sum(range(16))]] * 3
