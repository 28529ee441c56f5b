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
import atexit
import functools
import os
import weakref

# UCX takes SIGHUP as it loads, for its debug mode: a hang-up (a closed
# terminal or ssh session) then turned UCX's debug logging on and the
# program ran on, where Python's default ends it and nohup's ignores it.
# Unless the caller set it, UCX leaves SIGHUP alone (inherited by children).
os.environ.setdefault("UCX_DEBUG_SIGNO", "0")

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
    PreparedBatch,
    Region,
    RemoteRegion,
    Request,
    ResourceExhausted,
    Timeout,
    Unavailable,
)

__all__ = [
    "AlreadyExists", "Batch", "BatonError", "Cancelled", "DeadlineInfeasible", "Engine", "FailedPrecondition",
    "InvalidArgument", "NotFound", "OutOfRange", "Peer", "PermissionDenied", "PreparedBatch", "Region",
    "RemoteRegion", "Request", "ResourceExhausted", "Timeout", "Unavailable",
]


class _Waker:
    """Resolves the futures of one engine's awaited batches on one asyncio
    loop when the engine's batch event fd turns readable, or when the engine
    closes: no thread, no polling. It watches a dup of the fd, so a number
    the engine's close() frees and a later engine reuses is never confused
    with it."""

    def __init__(self, loop, engine, fd):
        self.loop = loop
        self.engine = engine
        self.fd = os.dup(fd)
        self.waiting = []  # (batch, future)
        loop.add_reader(self.fd, self._ready)

    def _ready(self):
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass
        # The read reset the counter for every watcher of this engine: the
        # wakers on other loops (other threads) may not have seen it.
        _wake(self.engine, but=self)
        self.check()

    def check(self):
        still = []
        for batch, future in self.waiting:
            if future.done():
                continue
            try:
                try:
                    done = batch.done
                except Unavailable as closed:  # its record went with the engine
                    raise Unavailable("await: the engine was closed before the batch's end was seen "
                                      "(close() cancels the batches that run)") from closed
                if not done:
                    still.append((batch, future))
                    continue
                batch.wait(0)
                future.set_result(None)
            except BaseException as e:  # the batch's failure, or a closed engine
                future.set_exception(e)
        self.waiting = still
        if not still:
            self.stop()

    def forget_cancelled(self):
        self.waiting = [(b, f) for b, f in self.waiting if not f.cancelled()]
        if not self.waiting:
            self.stop()

    def stop(self):
        if self.fd < 0:
            return  # stopped already (a check queued by close() came after)
        if _wakers.get((self.loop, self.engine)) is self:
            del _wakers[(self.loop, self.engine)]
        if not self.loop.is_closed():
            self.loop.remove_reader(self.fd)
        os.close(self.fd)
        self.fd = -1


_wakers = {}  # (asyncio loop, Engine) -> _Waker, while something awaits


def _wake(engine, but=None):
    """Has every waker of `engine` (but `but`) look at its batches, on its
    own loop's thread."""
    for (loop, of), waker in list(_wakers.items()):
        if of is engine and waker is not but:
            try:
                loop.call_soon_threadsafe(waker.check)
            except RuntimeError:  # its loop is closed: nothing awaits there any more
                waker.stop()


def _await_batch(self):
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    engine = self._engine
    waker = _wakers.get((loop, engine))
    if waker is None:
        waker = _wakers[(loop, engine)] = _Waker(loop, engine, self._engine_fd())
    waker.waiting.append((self, future))
    # An await given up (asyncio.wait_for's timeout, a cancelled task) lets
    # go of the waker at once: a waker left in _wakers holds the engine.
    future.add_done_callback(lambda f: f.cancelled() and waker.forget_cancelled())
    waker.check()  # it may have ended already
    return future.__await__()


def _close(self):
    """Shuts the engine down: running batches are cancelled, peers see it go;
    later calls raise Unavailable. An `await` on one of its batches ends
    (with Unavailable, or the batch's own end), from any thread."""
    try:
        _close_engine(self)
    finally:
        _wake(self)


def _exit(self, *exc):
    self.close()
    return False


_live = weakref.WeakSet()  # every engine not yet closed, for the exit
_engine_init = Engine.__init__


@functools.wraps(_engine_init)  # help(baton.Engine) shows the keywords
def _init(self, *args, **kwargs):
    _engine_init(self, *args, **kwargs)
    _live.add(self)


@atexit.register
def _close_at_exit():
    """Closes the engines still open as the interpreter exits, before it
    finalizes: a daemon thread inside a call holds its engine, which then
    never closed, its loop and UCX still running while the process ended."""
    for engine in list(_live):
        engine.close()


_close_engine = Engine.close
Batch.__await__ = _await_batch
Engine.__init__ = _init
Engine.close = _close
Engine.__exit__ = _exit
