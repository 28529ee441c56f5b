"""Baton: a topology-aware, deadline-driven KV-cache transfer engine.

    import baton, numpy as np
    with baton.Engine() as e:
        kv = e.register(np.zeros(1 << 20, dtype=np.uint8))
        peer = e.connect("127.0.0.1:7000")
        e.read(local=kv, peer=peer, remote=peer.regions[0], length=kv.length, qos="decode_critical", deadline_ms=5)

docs/python.md has the walkthrough. Everything here is the compiled
`baton._baton`; this file adds `await batch` for asyncio.
"""
import asyncio
import os

from ._baton import (  # noqa: F401  (re-exported)
    AlreadyExists,
    Batch,
    BatonError,
    Cancelled,
    DeadlineInfeasible,
    Engine,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    Peer,
    PermissionDenied,
    Region,
    RemoteRegion,
    Request,
    ResourceExhausted,
    Timeout,
    Unavailable,
)

__all__ = [
    "AlreadyExists", "Batch", "BatonError", "Cancelled", "DeadlineInfeasible", "Engine", "FailedPrecondition",
    "InvalidArgument", "NotFound", "OutOfRange", "Peer", "PermissionDenied", "Region", "RemoteRegion", "Request",
    "ResourceExhausted", "Timeout", "Unavailable",
]


class _Waker:
    """Resolves the futures of one engine's awaited batches when its batch
    event fd turns readable: no thread, no polling."""

    def __init__(self, loop, fd):
        self.loop = loop
        self.fd = fd
        self.waiting = []  # (batch, future)
        loop.add_reader(fd, self._ready)

    def _ready(self):
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass
        self.check()

    def check(self):
        still = []
        for batch, future in self.waiting:
            if future.done():
                continue
            try:
                if not batch.done:
                    still.append((batch, future))
                    continue
                batch.wait(0)
                future.set_result(None)
            except BaseException as e:  # the batch's failure, or a closed engine
                future.set_exception(e)
        self.waiting = still
        if not still:
            self.loop.remove_reader(self.fd)
            _wakers.pop((id(self.loop), self.fd), None)


_wakers = {}


def _await_batch(self):
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    fd = self._engine_fd()
    key = (id(loop), fd)
    waker = _wakers.get(key)
    if waker is None:
        waker = _wakers[key] = _Waker(loop, fd)
    waker.waiting.append((self, future))
    waker.check()  # it may have ended already
    return future.__await__()


Batch.__await__ = _await_batch
