"""persist() of in-memory blocks through files in shared memory (gdask.gdataset._same_host)."""

from __future__ import annotations

import contextlib
import gc
import os
import time

import dask
import numpy as np
import pytest
from dask.base import tokenize
from distributed import Client, wait
from distributed.client import futures_of

import gdask
from gdask import _shm
from gdask.gdataset import _same_host


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """Files in ``tmp_path`` (readable by the workers: same host), for data of any size."""
    monkeypatch.setattr(_same_host, "MIN_BYTES", 0)
    with dask.config.set({"gdask.shared-memory-dir": str(tmp_path)}):
        yield tmp_path


def _files(d) -> list[str]:
    return sorted(p for p in os.listdir(d) if p.startswith("gdask-"))


def _wait_until(cond, what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.05)


def _loaders(client, P) -> set[str]:
    """The functions of the scheduler's tasks of persisted dataset ``P``'s blocks."""
    def names(keys, dask_scheduler=None):
        return {dask_scheduler.tasks[k].run_spec.func.__name__ for k in keys}

    wait(futures_of(P))  # (the graph and this call take different ways to the scheduler)
    return client.run_on_scheduler(names, P.__dask_keys__())


def _registered(client) -> int:
    def count(dask_scheduler=None):
        plugin = dask_scheduler.plugins.get(_same_host.PLUGIN_NAME)
        return 0 if plugin is None else sum(len(v) for v in [*plugin.files.values(), *plugin.expected.values()])

    return client.run_on_scheduler(count)


def test_blocks_go_through_files_that_go_when_the_blocks_do(bclient, shm_dir):
    x = np.random.default_rng(0).random((1000, 6))
    G = gdask.from_array(x, block_rows=300)
    P = G.persist()
    wait(futures_of(P))
    assert len(_files(shm_dir)) == 4
    assert _loaders(bclient, P) == {"load"}
    np.testing.assert_array_equal(P.compute(), x)  # the same bits, in the input's type
    np.testing.assert_array_equal(G.compute(), x)  # the lazy dataset is untouched
    del P
    _wait_until(lambda: not _files(shm_dir), "the files to be removed once the blocks are released")
    assert _registered(bclient) == 0


def test_the_same_blocks_persisted_again(client, shm_dir):
    """The same data gives the same keys. Persisted again while held, the scheduler keeps its tasks and
    the new files go at once; released and persisted at once again, the old files go with the old keys
    and the new tasks read the new files (the release and the new graph reach the scheduler in order)."""
    x = np.random.default_rng(6).random((900, 3))
    P = gdask.from_array(x, block_rows=300).persist()
    wait(futures_of(P))
    first = _files(shm_dir)
    Q = gdask.from_array(x, block_rows=300).persist()
    wait(futures_of(Q))
    _wait_until(lambda: _files(shm_dir) == first, "the unused files of the second persist to be removed")
    del P, Q
    for _ in range(3):
        P = gdask.from_array(x, block_rows=300).persist()
        np.testing.assert_array_equal(P.compute(), x)
        assert len(_files(shm_dir)) >= 3
        del P
    _wait_until(lambda: not _files(shm_dir), "the files to be removed once the blocks are released")
    assert _registered(client) == 0


def test_three_d_sequences_and_integers(client, shm_dir):
    seq = np.arange(5 * 3 * 2, dtype=np.float32).reshape(5, 3, 2)
    labels = np.arange(7, dtype=np.int64)
    P, L = gdask.from_array(seq, block_rows=2).persist(), gdask.from_array(labels, block_rows=3).persist()
    assert len(_files(shm_dir)) == 3 + 3
    np.testing.assert_array_equal(P.compute(), seq)
    np.testing.assert_array_equal(L.compute(), labels)


def test_the_graph_when_off_small_or_not_seen(client, shm_dir, monkeypatch):
    x = np.random.default_rng(1).random((400, 3))
    with dask.config.set({"gdask.gdataset.same-host-transfer": False}):
        P = gdask.from_array(x, block_rows=100).persist()
    assert not _files(shm_dir) and _loaders(client, P) == {"to_device"}
    monkeypatch.setattr(_same_host, "MIN_BYTES", x.nbytes + 1)
    P = gdask.from_array(x + 1, block_rows=100).persist()
    assert not _files(shm_dir) and _loaders(client, P) == {"to_device"}
    monkeypatch.setattr(_same_host, "MIN_BYTES", 0)
    # a worker that does not see the files (another /dev/shm): none are left, and the blocks go in the graph
    monkeypatch.setattr(_same_host, "run_sync", lambda client, f, *a, timeout: {"w": True, "v": False})
    P = gdask.from_array(x + 2, block_rows=100).persist()
    assert not _files(shm_dir) and _loaders(client, P) == {"to_device"}
    assert _registered(client) == 0
    np.testing.assert_array_equal(P.compute(), x + 2)


def test_files_written_at_once_and_none_left_when_one_fails(client, shm_dir, monkeypatch):
    """The blocks' files are written by several threads at once; when one cannot be written (the
    directory filled up), the files of the others are removed and the blocks go in the graph."""
    import threading

    x = np.random.default_rng(4).random((800, 4))
    writers, calls, lock = set(), [], threading.Lock()
    real = _shm.write
    expected = min(_same_host.WRITERS, os.cpu_count() or 1)
    meet = threading.Barrier(min(expected, 2), timeout=60)  # the first two writes wait for each other

    def write(arrays, where, order="C", fail_at=None):
        with lock:
            calls.append(1)
            n = len(calls)
        writers.add(threading.current_thread().name)
        if fail_at is None and n <= 2:
            meet.wait()  # a writer that waited alone (one at a time) breaks it: BrokenBarrierError
        return None if n == fail_at else real(arrays, where, order=order)

    monkeypatch.setattr(_shm, "write", write)
    P = gdask.from_array(x, block_rows=100).persist()
    assert _loaders(client, P) == {"load"} and len(_files(shm_dir)) == 8
    assert min(expected, 2) <= len(writers) <= expected
    np.testing.assert_array_equal(P.compute(), x)
    calls.clear()
    monkeypatch.setattr(_shm, "write", lambda arrays, where, order="C": write(arrays, where, order, fail_at=5))
    Q = gdask.from_array(x + 1, block_rows=100).persist()
    assert _loaders(client, Q) == {"to_device"}
    np.testing.assert_array_equal(Q.compute(), x + 1)
    assert len(_files(shm_dir)) == 8  # P's alone
    del P
    _wait_until(lambda: not _files(shm_dir), "the files to be removed once the blocks are released")


def test_not_without_a_cluster_or_under_another_scheduler(client, shm_dir):
    x = np.random.default_rng(2).random((200, 2))
    P = gdask.from_array(x, block_rows=100).persist(scheduler="sync")
    np.testing.assert_array_equal(P.compute(scheduler="sync"), x)
    assert not _files(shm_dir)


def test_tokens_name_the_block_not_the_file():
    a = _same_host.SharedBlock(_shm.SharedArrays("/dev/shm/gdask-a", (("<f8", 6, 0),)), (3, 2), "('x', 0)")
    b = _same_host.SharedBlock(_shm.SharedArrays("/dev/shm/gdask-b", (("<f8", 6, 0),)), (3, 2), "('x', 0)")
    c = _same_host.SharedBlock(_shm.SharedArrays("/dev/shm/gdask-a", (("<f8", 6, 0),)), (3, 2), "('x', 1)")
    assert tokenize(a) == tokenize(b) != tokenize(c)


def test_a_missing_file_is_an_error_that_says_why(tmp_path):
    block = _same_host.SharedBlock(_shm.SharedArrays(str(tmp_path / "gdask-gone"), (("<f8", 6, 0),)), (3, 2), "k")
    with pytest.raises(FileNotFoundError, match="is not there: this worker is on another host"):
        _same_host.load(block)


@contextlib.contextmanager
def _cluster_of_its_own():
    """The current client of a new cluster (for a test that kills a worker or closes the scheduler)."""
    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as c, c.as_current():
        yield c


def _persisted_through_files(x, block_rows: int, shm_dir):
    P = gdask.from_array(x, block_rows=block_rows).persist()
    wait(futures_of(P))
    assert len(_files(shm_dir)) == P.nblocks  # one file a block
    return P


def test_a_block_lost_with_its_worker_is_read_again_from_its_file(shm_dir):
    x = np.random.default_rng(3).random((2000, 4))
    with _cluster_of_its_own() as c:
        P = _persisted_through_files(x, 500, shm_dir)
        held = c.who_has(futures_of(P))
        victim = next(iter(held[P.__dask_keys__()[0]]))
        c.run(os._exit, 1, workers=[victim], on_error="ignore")  # the process dies; its nanny starts another
        np.testing.assert_array_equal(P.compute(), x)
        assert len(_files(shm_dir)) == 4
        del P
        _wait_until(lambda: not _files(shm_dir), "the files to be removed once the blocks are released")


def test_files_left_when_the_scheduler_closes_are_removed(shm_dir):
    x = np.random.default_rng(4).random((300, 2))
    with _cluster_of_its_own() as c:
        P = _persisted_through_files(x, 100, shm_dir)
        c.publish_dataset(kept=P)  # the scheduler keeps the blocks after this client leaves
    assert not _files(shm_dir)


def test_a_fit_on_blocks_sent_through_files_has_the_same_bits(client, shm_dir, monkeypatch):
    from gdask.ml import KMeans, LogisticRegression

    sent = []
    through_files = _same_host._persist_files
    monkeypatch.setattr(_same_host, "_persist_files", lambda G, *a: sent.append(G.name) or through_files(G, *a))
    rng = np.random.default_rng(5)
    x = rng.random((3000, 5)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 1).astype(np.int64)
    fits = []
    for on in (True, False):
        gc.collect()  # the blocks of the first fits are gone: the others are not handed them (held)
        with dask.config.set({"gdask.gdataset.same-host-transfer": on}):
            km = KMeans(4, random_state=0, n_init=1).fit(x)
            lr = LogisticRegression().fit(x, y)
        assert len(sent) >= 2 if on else not sent  # the X and y (or weights) of both fits
        sent.clear()
        fits.append((km.cluster_centers_, km.labels_, lr.coef_))
    for a, b in zip(*fits):
        np.testing.assert_array_equal(a, b)
    assert type(fits[0][0]) is np.ndarray


def _block_memory(dask_worker=None):
    """(On a worker) per block it holds: whether its memory is a file's mapping, and its layout."""
    import mmap

    from gdask._devices._emulated import _root

    def mapped(v) -> bool:
        return isinstance(getattr(_root(v).base, "obj", None), mmap.mmap)  # (frombuffer's base: a memoryview)

    return {str(k): (mapped(v), v.flags.f_contiguous, v.flags.writeable)
            for k, v in dask_worker.data.items() if isinstance(v, np.ndarray)}


def test_blocks_are_their_files_feature_major_without_a_copy_on_emulated_devices(client, shm_dir):
    """A 2-D block's file holds it feature-major, as the device does: an emulated device keeps the
    file's (private, writable) mapping as the block instead of copying it; 1-D blocks too."""
    rng = np.random.default_rng(6)
    x, y = rng.random((900, 5)), rng.integers(0, 3, 900)
    P, Y = gdask.from_array(x, block_rows=200).persist(), gdask.from_array(y, block_rows=200).persist()
    wait(futures_of(P) + futures_of(Y))
    # this test's blocks only: the previous test's blocks may still be on their way out of the workers
    # (released as its fits returned; under load the workers drop them after this call)
    mine = {str(f.key) for f in futures_of(P) + futures_of(Y)}
    blocks = {k: v for d in client.run(_block_memory).values() for k, v in d.items() if k in mine}
    assert len(blocks) == 10 and all(all(v) for v in blocks.values()), blocks
    np.testing.assert_array_equal(P.compute(), x)
    np.testing.assert_array_equal((P * 2).compute(), 2 * x)  # kernels read (and may write) the mapping
    np.testing.assert_array_equal(Y.compute(), y)


def test_blocks_held_already_are_not_written_or_sent_again(client, shm_dir, monkeypatch):
    """Persisting blocks that the client holds already (the same arrays persisted again) hands back the
    futures it holds: no file is written and no graph sent. Blocks that failed go the usual way."""
    x = np.random.default_rng(7).random((800, 3))
    G = gdask.from_array(x, block_rows=200)
    P = G.persist()
    wait(futures_of(P))
    writes = []
    real = _shm.write
    monkeypatch.setattr(_shm, "write", lambda *a, **k: writes.append(1) or real(*a, **k))
    Q = G.persist()
    assert not writes and {f.key for f in futures_of(Q)} == {f.key for f in futures_of(P)}
    del P
    np.testing.assert_array_equal(Q.compute(), x)  # Q holds the blocks alone now
    assert len(_files(shm_dir)) == 4
    del Q
    _wait_until(lambda: not _files(shm_dir), "the files to be removed once the blocks are released")

    def boom(b):
        raise RuntimeError("no block")

    B = gdask.from_array(x, block_rows=200).map_blocks(boom, dtype=x.dtype, ncols=3)
    failed = B.persist()
    wait(futures_of(failed))
    assert _same_host.held(B, {}) is None  # (failed blocks: the usual persist, which fails again)
    with pytest.raises(RuntimeError, match="no block"):
        B.persist().compute()
    assert _same_host.held(G, {}) is None  # (released: nothing held)


def test_files_are_feature_major_only_where_every_device_keeps_them():
    """Rows go feature-major into the files only for workers whose emulated devices keep the files'
    mappings; a GPU (it reorders on the device), a strict device (it copies), a worker without a device
    or any mix gets rows."""
    from gdask import protocol

    def workers(*backends):
        return {f"tcp://127.0.0.1:{i}": {"metrics": {} if b is None else {protocol.METRIC_DEVICE: {"backend": b}}}
                for i, b in enumerate(backends)}

    assert _same_host.file_order(workers("emulated", "emulated")) == "F"
    for mixed in [("emulated", "cuda"), ("cuda",), ("emulated-strict", "emulated"), ("emulated", None), ()]:
        assert _same_host.file_order(workers(*mixed)) == "C", mixed
