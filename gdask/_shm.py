"""Arrays handed to workers on the client's own host through files in shared memory.

A graph or ``client.scatter`` sends arrays through sockets: on one machine every byte is serialised,
copied through the kernel and reassembled while an event loop waits for it (240 MB of graph took
0.2-0.6 s on a 2-core machine; a GDataSet's blocks in a graph also pass through the scheduler). A
worker on the client's host reads a file in a memory file system (``/dev/shm``) instead, mapped
copy-on-write: one copy, made by the client, without the worker's involvement. Which worker is on
this host is a guess from its address (loopback or one of this host's interfaces); callers check that
the worker sees the file (a worker in a container of its own sees another ``/dev/shm``) and send the
arrays the usual way when it does not.

Users: PageRank's graph on one block (config ``gdask.ml.same-host-transfer``) and the blocks of a
persisted GDataSet made from in-memory arrays (``gdask.gdataset.same-host-transfer``). Config
``gdask.shared-memory-dir`` names the directory (default ``/dev/shm`` where it exists; else the
transfer is not used). A file is written only when the directory has room for it and the host's
available memory is at least twice its size (a memory file system holds it in memory).
"""

from __future__ import annotations

import mmap
import os
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from gdask import config
from gdask._devices._buffers import copy_into

__all__ = ["SharedArrays", "directory", "on_this_host", "out_file", "read", "read_out", "remove", "room", "write",
           "write_out"]

_ALIGN = 64


@dataclass(frozen=True)
class SharedArrays:
    """Where the arrays are: the file, and each array's dtype, length and byte offset in it."""

    path: str
    specs: tuple[tuple[str, int, int], ...]


def directory(switch: str = "ml.same-host-transfer") -> str | None:
    """The directory of the files (config ``shared-memory-dir``), or None: the transfer is off (config
    ``switch``) or has nowhere to go."""
    if not bool(config.get(switch, True)) or not hasattr(mmap, "MAP_PRIVATE"):  # (Windows: no)
        return None
    d = config.get("shared-memory-dir", None)
    d = d or "/dev/shm"
    return d if os.path.isdir(d) and os.access(d, os.W_OK) else None


def _local_hosts() -> set[str]:
    hosts = {"127.0.0.1", "::1", "localhost"}
    for addrs in psutil.net_if_addrs().values():
        hosts.update(a.address.split("%")[0] for a in addrs)
    return hosts


def on_this_host(addr: str, info: dict | None = None) -> bool:
    """Whether worker ``addr`` (its scheduler ``info``) listens on an address of this host (a guess:
    see the module doc)."""
    host = (info or {}).get("host") or addr.rsplit("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in _local_hosts()


def room(nbytes: int, where: str) -> bool:
    """Whether ``where`` has room for ``nbytes`` more (64 MiB to spare) and the host has twice that free."""
    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize >= nbytes + (64 << 20) and psutil.virtual_memory().available >= 2 * nbytes


def write(arrays: list[np.ndarray], where: str, order: str = "C") -> SharedArrays | None:
    """``arrays`` into a new file in ``where``, each laid out in ``order`` ("F": a 2-D array column after
    column, as a device block is); None (and no file) when there is no room for it or writing it failed
    (the caller sends the arrays the usual way)."""
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', got {order!r}")
    specs, offset = [], 0
    for a in arrays:
        specs.append((a.dtype.str, int(a.size), offset))
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    if not room(offset, where):
        return None
    path = os.path.join(where, f"gdask-{uuid.uuid4().hex}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "wb") as f:
            for a, (_, _, off) in zip(arrays, specs):
                if not a.size:
                    continue  # (read makes it anew)
                if order == "F" and a.ndim == 2 and not a.flags.f_contiguous:
                    f.flush()  # (buffered writes before, positioned writes here)
                    _write_columns(f.fileno(), a, off)
                else:
                    f.seek(off)
                    f.write(memoryview(np.ascontiguousarray(a.T if order == "F" and a.ndim == 2 else a)).cast("B"))
            f.truncate(offset)
    except OSError:  # the directory filled up meanwhile, say: a write error, not a crash (no mapping yet)
        remove(path)
        return None
    return SharedArrays(path, tuple(specs))


#: bytes of a 2-D array that :func:`write` lays out column after column at a time: a tile of rows and at
#: most :data:`_TILE_COLUMNS` columns is made feature-major in a buffer of this size, then written a
#: column at a time
_TILE_BYTES = 2 << 20
_TILE_COLUMNS = 64


def _write_columns(fd: int, a: np.ndarray, offset: int) -> None:
    """``a`` (2-D, not feature-major) into file ``fd`` at ``offset`` in column-major order, a tile at a
    time: each column of a tile goes out as one segment (64 KiB for 32 float64 columns), and no copy
    of the whole array is made."""
    n, d = a.shape
    size = a.itemsize
    cols = min(d, _TILE_COLUMNS)
    rows = min(n, max(1, _TILE_BYTES // (cols * size)))
    tile = np.empty((rows, cols), a.dtype, order="F")
    for j0 in range(0, d, cols):
        for i in range(0, n, rows):
            part = a[i:i + rows, j0:j0 + cols]
            t = tile[:part.shape[0], :part.shape[1]]
            copy_into(t, part)
            for j in range(t.shape[1]):
                os.pwrite(fd, t[:, j], offset + ((j0 + j) * n + i) * size)


def read(shared: SharedArrays) -> list[np.ndarray] | None:
    """(On the worker) the arrays, mapped copy-on-write (writable, as arrays the kernels take), or
    None when the file is not there (another host, or another ``/dev/shm``)."""
    try:
        fd = os.open(shared.path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        length = os.fstat(fd).st_size
        # private, copy-on-write: writable arrays (as the kernels take them) that write nothing back, and
        # share the file's pages while only read (populating the map up front copied them all: 28 ms on 24 MB)
        mm = mmap.mmap(fd, length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE) if length else None
    finally:
        os.close(fd)
    return [np.frombuffer(mm, dtype=dtype, count=size, offset=off) if size else np.empty(0, dtype)
            for dtype, size, off in shared.specs]


def out_file(where: str) -> str:
    """A new empty file in ``where`` for a result the worker writes (:func:`write_out`,
    :func:`read_out`)."""
    path = os.path.join(where, f"gdask-{uuid.uuid4().hex}")
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return path


def write_out(path: str, a: np.ndarray) -> bool:
    """(On the worker) ``a`` into the file :func:`out_file` made; False when it could not be written
    (then it goes back as a result), or the file is gone (the caller stopped waiting and removed it:
    nothing is left behind)."""
    if not room(a.nbytes, os.path.dirname(path)):
        return False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
    except OSError:
        return False
    return True


def read_out(path: str, dtype: Any, size: int) -> np.ndarray:
    """The result the worker wrote into ``path``."""
    out = np.fromfile(path, dtype=dtype)
    if out.size != size:
        raise RuntimeError(f"the result file {path} holds {out.size} values, not {size}")
    return out


def remove(path: str | SharedArrays | None) -> None:
    """Remove a file (of :func:`write` or :func:`out_file`) if it is there."""
    if isinstance(path, SharedArrays):
        path = path.path
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
