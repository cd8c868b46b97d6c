import pathlib
import sys

import numpy as np
import pytest

# Worker processes unpickle functions defined in test modules by importing those modules: put the
# repository on the path (``pytest``, unlike ``python -m pytest``, does not); spawned workers start
# with this process's sys.path
_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)


def _xps():
    out = [pytest.param(np, id="numpy")]
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        out.append(pytest.param(cupy, id="cupy", marks=pytest.mark.gpu))
    except Exception:  # noqa: BLE001 - no usable GPU
        pass
    return out


@pytest.fixture(params=_xps())
def xp(request):
    """Array module: numpy always, cupy where a GPU exists (tests marked gpu)."""
    return request.param


@pytest.fixture(scope="module")
def client():
    from distributed import Client

    import gdask

    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="512MiB",
                               dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c

