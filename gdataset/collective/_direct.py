"""Direct connections between the tasks of a loop on the workers of one machine.

An all-gather through distributed's worker RPC wakes both workers' event loops (and the task's
thread) for every message and waits for a reply: ~2-4 ms a step on an idle 2-core machine, against
~0.07 ms for a round trip over a Unix socket. A loop of K-means or logistic regression all-gathers
once per iteration, so that latency is a visible share of its time. When every task of a loop runs in
its own worker process on the same host, the tasks connect to each other over Unix sockets (in a
directory only this user can enter) and their threads send and receive the values themselves.

The connections are made once, when the loop starts (:func:`connect`); any failure there (another
mount namespace, a path too long, no ``AF_UNIX``) makes every task keep distributed's path. Values go
as pickle protocol 5 frames (buffers out of band, not copied). A task waiting in a step wakes for its
peers' bytes, for the loop being stopped (:class:`Waker`, poked by the worker's mailbox) and for its
deadline.
"""

from __future__ import annotations

import os
import selectors
import shutil
import socket
import struct
import tempfile
import time
from typing import Any, Callable, Sequence

from distributed.protocol import pickle

from gdask.devices import BufferPool

__all__ = ["Direct", "DirectError", "LoopStopped", "PeerCancelled", "Waker", "connect", "frames", "listen",
           "same_host", "unlisten"]

_HEAD = struct.Struct("<qqq")  # step, number of frames, bytes of the frame lengths that follow
_CANCELLED = -1  # the step of the header a cancelled task sends its peers before it closes
_HELLO = struct.Struct("<q")  # the connecting task's rank
_SOCKET_BUFFER = 4 << 20  # bytes each connection asks the kernel to buffer each way
_CHUNK = 1 << 20  # bytes per send call (large frames go in pieces, so receiving and sending interleave)


class DirectError(ConnectionError):
    """A peer's connection broke, or a message was not what the protocol expects."""


class PeerCancelled(DirectError):
    """A peer's task was cancelled (the loop's client left or released it)."""


class LoopStopped(RuntimeError):
    """The loop was stopped (its mailbox says why) while this task waited for a step's values."""


def same_host(addresses: Sequence[str]) -> bool:
    """Whether ``addresses`` are distinct TCP workers of one host (the case direct connections serve)
    and this platform has Unix sockets."""
    if not hasattr(socket, "AF_UNIX"):
        return False
    hosts = set()
    for a in addresses:
        if not a.startswith("tcp://"):
            return False
        hosts.add(a[len("tcp://"):].rsplit(":", 1)[0])
    return len(hosts) == 1 and len(set(addresses)) == len(addresses)


class Waker:
    """A socket pair whose read end a waiting task selects on; :meth:`poke` wakes it (from any thread)."""

    def __init__(self) -> None:
        self.r, self.w = socket.socketpair()
        self.r.setblocking(False)
        self.w.setblocking(False)

    def poke(self) -> None:
        try:
            self.w.send(b"x")
        except (BlockingIOError, OSError):  # already poked (buffer full) or closed: the reader wakes anyway
            pass

    def drain(self) -> None:
        try:
            while self.r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        self.r.close()
        self.w.close()


def frames(value: Any) -> list[memoryview]:
    """``value`` as pickle protocol 5 frames: the pickle, then its buffers (not copied)."""
    buffers: list = []
    try:
        head = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        frames = [memoryview(head)] + [memoryview(b.raw()) for b in buffers]
    except (BufferError, ValueError):  # a buffer that is not contiguous: everything in band
        frames = [memoryview(pickle.dumps(value, protocol=5))]
    return [f.cast("B") if f.format != "B" or f.ndim != 1 else f for f in frames]


class _Out:
    """One message on its way to one peer: the header, the frame lengths, the frames."""

    def __init__(self, step: int, frames: list[memoryview]) -> None:
        lengths = struct.pack(f"<{len(frames)}q", *(f.nbytes for f in frames))
        self.parts = [memoryview(_HEAD.pack(step, len(frames), len(lengths))), memoryview(lengths), *frames]

    def send(self, sock: socket.socket) -> bool:
        """Send what the socket takes now; True once everything went."""
        while self.parts:
            part = self.parts[0]
            try:
                n = sock.send(part[:_CHUNK])
            except BlockingIOError:
                return False
            except OSError as e:
                raise DirectError(f"connection broke: {e!r}") from e
            if n < part.nbytes:
                self.parts[0] = part[n:]
                return False
            self.parts.pop(0)
        return True


class _In:
    """One message coming from one peer, read as it arrives (its frames in ``buffers``)."""

    def __init__(self, buffers: BufferPool | None = None) -> None:
        self.buffers = buffers
        self.head = bytearray(_HEAD.size)
        self.got = 0
        self.step = self.count = -1
        self.lengths: bytearray | None = None
        self.frames: list = []  # bytearrays, or leases of reused buffers
        self.index = -1  # -1: the header, 0: the lengths, 1..: frame index + 1

    def _target(self) -> bytearray:
        if self.index < 0:
            return self.head
        if self.index == 0:
            return self.lengths
        return self.frames[self.index - 1]

    def recv(self, sock: socket.socket) -> bool:
        """Read what has arrived; True once the message is whole. Raises :class:`DirectError` on EOF."""
        while True:
            buf = self._target()
            if self.got < len(buf):
                try:
                    n = sock.recv_into(memoryview(buf)[self.got:])
                except BlockingIOError:
                    return False
                except OSError as e:
                    raise DirectError(f"connection broke: {e!r}") from e
                if n == 0:
                    raise DirectError("connection closed")
                self.got += n
                if self.got < len(buf):
                    continue
            # this part is complete: move to the next
            if self.index < 0:
                self.step, self.count, nlen = _HEAD.unpack(self.head)
                if self.step == _CANCELLED:
                    raise PeerCancelled("its task was cancelled")
                if self.count < 1 or nlen != 8 * self.count:
                    raise DirectError(f"bad message header (step {self.step}, {self.count} frames)")
                self.lengths = bytearray(nlen)
            elif self.index == 0:
                sizes = struct.unpack(f"<{self.count}q", self.lengths)
                take = bytearray if self.buffers is None else self.buffers.take
                self.frames = [take(n) for n in sizes]
            if self.index == self.count:
                return True
            self.index += 1
            self.got = 0

    def value(self) -> Any:
        return pickle.loads(self.frames[0], buffers=self.frames[1:])


class Direct:
    """The connected sockets of one task to each other task of its loop (``socks[r]``, None for itself)."""

    def __init__(self, rank: int, socks: dict[int, socket.socket]) -> None:
        self.rank = rank
        self.socks = socks
        # receive buffers reused from step to step: a large frame comes into a lease of a kept buffer, and the
        # value unpickled from it holds the lease (fresh memory for every large frame cost its page faults:
        # 2.5 ms per 4 MiB frame in a worker process, twice the frame's time on the socket)
        self.buffers = BufferPool()
        for s in socks.values():
            s.setblocking(False)
            for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):  # megabyte values in a few calls (the
                try:                                            # kernel caps it at its maximum)
                    s.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)
                except OSError:
                    pass

    def allgather(self, step: int, frames: list[memoryview], value: Any, size: int, waker: Waker,
                  deadline: float | None, stopped: Callable[[], str | None]) -> list[Any]:
        """Send ``frames`` (:func:`frames` of what the peers get) to every peer and receive theirs of
        step ``step``; values in rank order, ``value`` in this task's place.

        A step whose values all came completes even if the loop was stopped meanwhile; until then
        ``stopped()`` (the reason, or None) is checked whenever the waker is poked. Raises
        :class:`DirectError` (a peer's connection broke), ``TimeoutError`` naming the ranks still
        missing at ``deadline`` (``time.monotonic``), or :class:`LoopStopped` with the stop reason."""
        outs = {r: _Out(step, frames) for r in self.socks}
        ins = {r: _In(self.buffers) for r in self.socks}
        got: dict[int, Any] = {self.rank: value}
        sel = selectors.DefaultSelector()
        try:
            sel.register(waker.r, selectors.EVENT_READ, None)
            for r, s in self.socks.items():
                sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, r)
            left: float | None = 0.0  # first what has arrived already, then wait
            while len(got) < size or outs:
                for key, mask in sel.select(left):
                    r = key.data
                    if r is None:
                        waker.drain()
                        continue
                    s = self.socks[r]
                    if mask & selectors.EVENT_READ and r not in got:
                        try:
                            done = ins[r].recv(s)
                        except DirectError as e:
                            raise type(e)(f"rank {r}: {e}") from None
                        if done:
                            if ins[r].step != step:
                                raise DirectError(f"rank {r} sent step {ins[r].step} during step {step}")
                            got[r] = ins[r].value()
                    try:
                        if mask & selectors.EVENT_WRITE and r in outs and outs[r].send(s):
                            del outs[r]
                    except DirectError as e:
                        raise _why(r, s, e, at_boundary=r in got) from None
                    events = (0 if r in got else selectors.EVENT_READ) | (selectors.EVENT_WRITE if r in outs else 0)
                    if events:
                        sel.modify(s, events, r)
                    else:
                        sel.unregister(s)
                if len(got) < size:  # a step whose values all came completes, stopped or not
                    reason = stopped()
                    if reason is not None:
                        raise LoopStopped(reason)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0 and (len(got) < size or outs):
                    missing = sorted(set(range(size)) - set(got))
                    raise TimeoutError(f"no value from rank(s) {missing} of {size}" if missing
                                       else f"rank(s) {sorted(outs)} did not take this step's value")
        finally:
            sel.close()
        return [got[r] for r in range(size)]

    def notify_cancelled(self) -> None:
        """Tell every peer (best effort, without waiting) that this task was cancelled."""
        head = _HEAD.pack(_CANCELLED, 0, 0)
        for s in self.socks.values():
            try:
                s.send(head)
            except OSError:  # a full buffer (the peer reads no more) or a closed peer: it learns otherwise
                pass

    def close(self) -> None:
        for s in self.socks.values():
            try:
                s.close()
            except OSError:
                pass
        self.socks = {}


def _why(rank: int, sock: socket.socket, err: DirectError, at_boundary: bool) -> DirectError:
    """The error to raise for a peer whose connection broke while this task sent to it: a peer that
    was cancelled sent that word before it closed (after its value of the step, which came whole)."""
    if at_boundary:
        try:
            _In().recv(sock)
        except PeerCancelled as e:
            return PeerCancelled(f"rank {rank}: {e}")
        except DirectError:
            pass
    return DirectError(f"rank {rank}: {err}")


def listen() -> tuple[socket.socket, str]:
    """A Unix socket listening in a fresh directory only this user can enter: (socket, path)."""
    folder = tempfile.mkdtemp(prefix="gdask-loop-")
    path = os.path.join(folder, "s")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(path)
        srv.listen(64)
    except OSError:
        srv.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return srv, path


def unlisten(srv: socket.socket | None, path: str | None) -> None:
    if srv is not None:
        srv.close()
    if path:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def connect(rank: int, paths: Sequence[str | None], srv: socket.socket, timeout: float) -> Direct:
    """Connect to every task of higher rank (``paths[r]``), accept every one of lower rank on ``srv``;
    each connection starts with the connecting task's rank. Raises ``OSError`` / :class:`DirectError`
    when a connection cannot be made within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    socks: dict[int, socket.socket] = {}
    try:
        for r in range(rank + 1, len(paths)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            socks[r] = s
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            s.connect(paths[r])
            s.sendall(_HELLO.pack(rank))
        while len(socks) < len(paths) - 1:
            srv.settimeout(max(deadline - time.monotonic(), 0.001))
            s, _ = srv.accept()
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            hello = b""
            while len(hello) < _HELLO.size:
                chunk = s.recv(_HELLO.size - len(hello))
                if not chunk:
                    raise DirectError("a peer closed its connection before saying its rank")
                hello += chunk
            (peer,) = _HELLO.unpack(hello)
            if not 0 <= peer < rank or peer in socks:
                s.close()
                raise DirectError(f"unexpected connection from rank {peer}")
            socks[peer] = s
    except BaseException:
        for s in socks.values():
            s.close()
        raise
    return Direct(rank, socks)
