"""The `baton` Python module against a second process (holder.py): real UCX
transfers over loopback, byte-exact, and every exception class."""
import asyncio
import contextlib
import gc
import hashlib
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

baton = pytest.importorskip("baton", reason="the baton module is not built (ninja -C build baton_python)")

HERE = pathlib.Path(__file__).resolve().parent
SIZE = 4 << 20


def pattern(n, seed):
    return ((np.arange(n, dtype=np.uint64) * 131 + seed) & 0xFF).astype(np.uint8)


class Holder:
    """holder.py in a child process."""

    def __init__(self, size=SIZE):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        self.proc = subprocess.Popen([sys.executable, str(HERE / "holder.py"), str(size)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        words = self.proc.stdout.readline().split()
        assert words and words[0] == "ready", f"holder did not start: {words}"
        self.address, self.handle, self.length = words[1], int(words[2]), int(words[3])

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().split()

    def stop(self):
        """SIGSTOPs the holder (it stops itself, between two commands)."""
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        time.sleep(0.2)

    def resume(self):
        self.proc.send_signal(18)  # SIGCONT

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def holder():
    h = Holder()
    yield h
    h.close()


@pytest.fixture
def engine():
    with baton.Engine() as e:
        yield e


def test_numpy_both_directions_byte_exact(holder, engine):
    peer = engine.connect(holder.address)
    assert [r.handle for r in peer.regions] == [holder.handle]
    assert peer.regions[0].length == SIZE
    assert peer.regions[0].staged is False  # host memory: reached by RMA or a same-host copy
    local = np.zeros(SIZE, dtype=np.uint8)
    region = engine.register(local)
    assert region.length == SIZE
    engine.read(local=region, peer=peer, remote=holder.handle, length=SIZE)
    assert np.array_equal(local, pattern(SIZE, 7))
    # Write a new pattern into the second half, then the holder's own bytes say it landed.
    local[:] = pattern(SIZE, 99)
    engine.write(local=region, local_offset=SIZE // 2, peer=peer, remote=peer.regions[0], remote_offset=SIZE // 2,
                 length=SIZE // 2, qos="hot_kv", deadline_ms=2000)
    expected = np.concatenate([pattern(SIZE, 7)[: SIZE // 2], pattern(SIZE, 99)[SIZE // 2:]])
    assert holder.ask("sum") == ["sum", hashlib.sha256(expected.tobytes()).hexdigest()]


def test_nics_give_rails_that_move_bytes_and_bad_nics_raise(holder):
    # Two rails on loopback (a UCP context each) against a holder with one:
    # every lane pairs with the holder's rail, over TCP (not the same-host copy).
    with baton.Engine(nics=["lo", "lo"], ucx_tls="tcp", same_host_copy=False) as e:
        peer = e.connect(holder.address)
        local = np.zeros(SIZE, dtype=np.uint8)
        region = e.register(local)
        e.read(local=region, peer=peer, remote=holder.handle, length=SIZE)
        assert np.array_equal(local, pattern(SIZE, 7))
    for nics, error in ([["no-such-nic0"], baton.InvalidArgument], [["lo", "lo", "lo"], baton.InvalidArgument],
                        [[""], ValueError]):
        with pytest.raises(error):
            baton.Engine(nics=nics)


def test_ucx_settings_list_what_baton_set_and_bad_tcp_settings_raise(holder):
    # Where TCP may open, Baton sets UCX's TCP segment and the sockets' receive
    # buffer (the latter only up to the kernel's cap), and says so.
    cap = int(pathlib.Path("/proc/sys/net/core/rmem_max").read_text())
    set_outside = [name for name in ("UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE", "UCX_TCP_RCVBUF") if name in os.environ]
    if set_outside:
        pytest.skip(f"the environment sets {set_outside} (UCX takes those from there; not listed)")
    with baton.Engine(ucx_tls="tcp", same_host_copy=False, tcp_segment_bytes=1 << 20,
                      tcp_receive_buffer_bytes=128 << 10) as e:
        settings = e.ucx_settings
        assert settings["UCX_TCP_TX_SEG_SIZE"] == settings["UCX_TCP_RX_SEG_SIZE"] == str(1 << 20)
        assert settings.get("UCX_TCP_RCVBUF") == (str(128 << 10) if cap >= 128 << 10 else None)
        peer = e.connect(holder.address)
        local = np.zeros(SIZE, dtype=np.uint8)
        e.read(local=e.register(local), peer=peer, remote=holder.handle, length=SIZE)
        assert np.array_equal(local, pattern(SIZE, 7))
    with baton.Engine(ucx_tls="tcp", tcp_receive_buffer_bytes=0) as e:
        assert "UCX_TCP_RCVBUF" not in e.ucx_settings  # 0: the kernel's autotuning
    closed = baton.Engine()
    closed.close()
    with pytest.raises(baton.Unavailable):
        closed.ucx_settings
    for bad in ({"tcp_receive_buffer_bytes": 1}, {"tcp_receive_buffer_bytes": -1}, {"tcp_segment_bytes": 1},
                {"tcp_segment_bytes": 1 << 40}):
        with pytest.raises(baton.InvalidArgument):
            baton.Engine(**bad)


def test_torch_tensors_and_engine_memory(holder, engine):
    torch = pytest.importorskip("torch")
    peer = engine.connect(holder.address)
    t = torch.zeros(SIZE // 2, dtype=torch.float16)  # SIZE bytes
    region = engine.register(t)
    assert region.length == SIZE
    engine.read(local=region, peer=peer, remote=holder.handle, length=SIZE, qos="decode_critical", deadline_ms=5000)
    assert torch.equal(t.view(torch.uint8), torch.from_numpy(pattern(SIZE, 7)))
    # And back: a tensor's bytes written into the holder's buffer.
    out = torch.from_numpy(pattern(SIZE, 42).copy())
    engine.write(local=engine.register(out), peer=peer, remote=holder.handle, length=SIZE)
    assert holder.ask("sum") == ["sum", hashlib.sha256(pattern(SIZE, 42).tobytes()).hexdigest()]
    block = engine.allocate(1 << 20)
    view = block.buffer
    assert isinstance(view, memoryview) and not view.readonly and len(view) == 1 << 20
    engine.read(local=block, peer=peer, remote=holder.handle, remote_offset=4096, length=1 << 20)
    assert bytes(view[:16]) == pattern(SIZE, 42)[4096:4096 + 16].tobytes()
    with pytest.raises(baton.FailedPrecondition):
        engine.unregister(block)  # the view still points into it
    view.release()
    engine.unregister(block)
    with pytest.raises(baton.NotFound):
        engine.unregister(block)


def test_batches_report_bytes_and_states(holder, engine):
    peer = engine.connect(holder.address)
    local = bytearray(SIZE)
    region = engine.register(local)
    reqs = [baton.Request(op="read", local=region, local_offset=i << 18, peer=peer, remote=holder.handle,
                          remote_offset=i << 18, length=1 << 18) for i in range(16)]
    batch = engine.submit(reqs, notification=b"sixteen landed")
    assert batch.bytes == 16 << 18
    batch.wait(timeout=30)
    assert batch.done and batch.status == "ok"
    assert batch.bytes_done == 16 << 18
    assert batch.states == ["completed"] * 16
    assert bytes(local) == pattern(SIZE, 7).tobytes()
    batch.release()
    with pytest.raises(baton.NotFound):
        batch.release()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        words = holder.ask("notes")
        if words[1] != "0":
            break
        time.sleep(0.05)
    assert words[1:] == ["1", "sixteen", "landed"]


@contextlib.contextmanager
def same_host_pair(size):
    """An engine reading from another one in this process that exports `size` allocated bytes."""
    with baton.Engine() as h, baton.Engine() as e:
        h.export(h.allocate(size))
        peer = e.connect(h.address)
        local = np.zeros(size, dtype=np.uint8)
        yield e, peer, e.register(local)


def test_a_timeout_stops_one_large_same_host_request_between_its_parts():
    """The copier copies a request above 4 MiB in parts: read(timeout=) ends it, cancelled, part way."""
    size = 256 << 20  # a copy of milliseconds anywhere; the timeout is a microsecond
    with same_host_pair(size) as (e, peer, region):
        with pytest.raises(baton.Timeout, match="read: not done within 1e-06 s; the request was cancelled"):
            e.read(local=region, peer=peer, remote=peer.regions[0], length=size, timeout=1e-6)
        batch = e.submit([baton.Request(op="read", local=region, peer=peer, remote=peer.regions[0], length=size)])
        batch.cancel()  # the first cancel is taken: parts are left
        with pytest.raises(baton.Cancelled):
            batch.wait(timeout=30)
        assert batch.states == ["cancelled"]
        assert batch.bytes_done < size and batch.bytes_done % (4 << 20) == 0  # whole parts, or none
        batch.release()


def test_a_deadline_that_cannot_be_met_runs_late_and_is_counted_missed():
    """No local-recompute path from Python: the request is not refused, it ends late, and says so."""
    size = 64 << 20
    with same_host_pair(size) as (e, peer, region):
        late = baton.Request(op="read", local=region, peer=peer, remote=peer.regions[0], length=size,
                             qos="hot_kv", deadline_ms=0.001)
        plain = baton.Request(op="read", local=region, peer=peer, remote=peer.regions[0], length=4096)
        batch = e.submit([late, plain])
        batch.wait(timeout=30)
        assert batch.status == "ok" and batch.states == ["completed", "completed"]
        assert batch.deadlines_missed == 1
        batch.release()
        assert 'baton_engine_deadlines_missed_total{qos="hot_kv"} 1' in e.metrics_text()


def test_a_same_host_batch_has_ended_when_submit_returns(holder):
    """The loop-free path: same-host batches are copied inside submit(); off, the scheduler carries them."""
    for limit, direct in ((16 << 20, 1), (0, 0)):
        with baton.Engine(direct_copy_max_bytes=limit) as e:
            peer = e.connect(holder.address)
            local = np.zeros(SIZE, dtype=np.uint8)
            region = e.register(local)
            batch = e.submit([baton.Request(op="read", local=region, peer=peer, remote=holder.handle, length=SIZE)])
            if direct:
                assert batch.done and batch.status == "ok"  # no wait needed
            batch.wait(timeout=30)
            assert np.array_equal(local, pattern(SIZE, 7))
            batch.release()
            assert ("baton_engine_direct_batches_total 1" in e.metrics_text()) == bool(direct)
    with pytest.raises(baton.InvalidArgument):
        baton.Engine(direct_copy_max_bytes=-1)


def test_copy_threads_carry_batches_that_take_the_loop(holder):
    """Same-host copies posted by the loop run on datapath threads when asked; the bytes are the same."""
    for threads in (0, 2):
        with baton.Engine(direct_copy_max_bytes=0, copy_threads=threads) as e:
            peer = e.connect(holder.address)
            local = np.zeros(SIZE, dtype=np.uint8)
            region = e.register(local)
            batch = e.submit([baton.Request(op="read", local=region, peer=peer, remote=holder.handle, length=SIZE)])
            batch.wait(timeout=30)
            assert batch.status == "ok"
            assert np.array_equal(local, pattern(SIZE, 7))
            batch.release()
    for bad in (-2, 65):
        with pytest.raises(baton.InvalidArgument):
            baton.Engine(copy_threads=bad)


def test_progress_threads_carry_tcp_slices(holder):
    """With a progress thread per NIC the same reads and writes over UCX's TCP are byte-exact."""
    held = pattern(SIZE, 7)  # what the holder's buffer holds
    for threads in (0, 1):
        with baton.Engine(ucx_tls="tcp", same_host_copy=False, progress_threads=threads) as e:
            peer = e.connect(holder.address)
            local = np.zeros(SIZE, dtype=np.uint8)
            region = e.register(local)
            e.read(local=region, peer=peer, remote=holder.handle, length=SIZE)
            assert np.array_equal(local, held)
            held = pattern(SIZE, 50 + threads)
            local[:] = held
            e.write(local=region, peer=peer, remote=holder.handle, length=SIZE)
            local[:] = 0
            e.read(local=region, peer=peer, remote=holder.handle, length=SIZE)
            assert np.array_equal(local, held)
    for bad in (-2, 2):
        with pytest.raises(baton.InvalidArgument):
            baton.Engine(progress_threads=bad)


def test_cancel_ends_the_batch(holder, engine):
    peer = engine.connect(holder.address)
    local = np.zeros(SIZE, dtype=np.uint8)
    region = engine.register(local)
    reqs = [baton.Request(op="read", local=region, peer=peer, remote=holder.handle, length=SIZE, qos="background")
            for _ in range(64)]
    batch = engine.submit(reqs)
    try:
        batch.cancel()
    except baton.InvalidArgument:
        pass  # everything had ended already
    try:
        batch.wait(timeout=30)
    except baton.Cancelled:
        pass
    assert batch.done
    assert set(batch.states) <= {"completed", "cancelled"}


def test_asyncio_awaits_batches_without_a_thread(holder, engine):
    peer = engine.connect(holder.address)
    local = np.zeros(SIZE, dtype=np.uint8)
    region = engine.register(local)

    async def main():
        batches = [engine.submit([baton.Request(op="read", local=region, local_offset=i << 20, peer=peer,
                                                remote=holder.handle, remote_offset=i << 20, length=1 << 20)])
                   for i in range(4)]
        threads_before = threading.active_count()
        await asyncio.gather(*batches)
        assert threading.active_count() == threads_before
        return [b.status for b in batches]

    assert asyncio.run(main()) == ["ok"] * 4
    assert np.array_equal(local, pattern(SIZE, 7))


def test_asyncio_raises_the_batch_failure(engine):
    other = baton.Engine()
    region = other.register(bytearray(4096))
    other.export(region)
    peer = engine.connect(other.address)
    local = engine.register(bytearray(4096))
    other.close()  # the peer goes away

    async def main():
        batch = engine.submit([baton.Request(op="read", local=local, peer=peer, remote=region.handle, length=4096)])
        await batch

    with pytest.raises((baton.Unavailable, baton.BatonError)):
        asyncio.run(main())


def test_many_threads_share_one_engine(holder, engine):
    peer = engine.connect(holder.address)
    local = np.zeros(SIZE, dtype=np.uint8)
    region = engine.register(local)
    errors = []

    def worker(k):
        try:
            for i in range(25):
                off = ((k * 25 + i) % 256) * 4096
                engine.read(local=region, local_offset=off, peer=peer, remote=holder.handle, remote_offset=off,
                            length=4096, qos="decode_critical", deadline_ms=1000)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert np.array_equal(local[: 200 * 4096], pattern(SIZE, 7)[: 200 * 4096])  # blocks 0..199, each once
    assert not local[200 * 4096:].any()


def test_every_exception_class_from_the_bad_input_that_raises_it(holder, engine):
    peer = engine.connect(holder.address)
    local = engine.register(bytearray(8192))
    # Built requests refuse bad values at once, as ValueError.
    for bad in [dict(op="move"), dict(qos="urgent"), dict(deadline_ms=-1), dict(length=-5), dict(length=0),
                dict(local_offset=-1), dict(timeout_ms=-3)]:
        kw = dict(op="read", local=local, peer=peer, remote=holder.handle, length=4096)
        kw.update(bad)
        with pytest.raises(ValueError):
            baton.Request(**kw)
        with pytest.raises(baton.InvalidArgument):
            baton.Request(**kw)
    # A size the engine cannot allocate names the parameter the caller passed.
    for n, said in ((0, "nbytes is 0"), (-1, "nbytes is -1")):
        with pytest.raises(baton.InvalidArgument, match=said):
            engine.allocate(n)
    # Unknown peer: LookupError.
    with pytest.raises(LookupError):
        engine.read(local=local, peer="127.0.0.1:1", remote=holder.handle, length=4096)
    with pytest.raises(baton.NotFound):
        engine.read(local=local, peer=peer, remote=12345, length=4096)
    # Outside the regions: IndexError.
    with pytest.raises(IndexError):
        engine.read(local=local, local_offset=8000, peer=peer, remote=holder.handle, length=4096)
    with pytest.raises(baton.OutOfRange):
        engine.read(local=local, peer=peer, remote=holder.handle, remote_offset=SIZE - 100, length=4096)
    # Past 64 bits too (a TypeError from the argument's type before), and past 2**63.
    for far in (dict(local_offset=2**64), dict(remote_offset=2**70), dict(length=2**64), dict(local_offset=2**63)):
        with pytest.raises(baton.OutOfRange):
            engine.read(**dict(dict(local=local, peer=peer, remote=holder.handle, length=16), **far))
    with pytest.raises(TypeError, match="length: expected an integer, not float"):
        baton.Request(op="read", local=local, peer=peer, remote=holder.handle, length=16.0)
    assert baton.Request(op="read", local=local, peer=peer, remote=holder.handle, length=np.int64(16)).length == 16
    with pytest.raises(baton.InvalidArgument, match="^prepare: the batch is empty"):
        engine.prepare([])
    # A read-only buffer cannot be registered: peers would write into it.
    with pytest.raises(ValueError):
        engine.register(b"read-only bytes")
    with pytest.raises(baton.InvalidArgument):
        engine.register(np.zeros(16, dtype=np.uint8)[::2])  # not contiguous
    # Python object pointers: a transfer into them crashed the interpreter.
    with pytest.raises(baton.InvalidArgument, match="Python objects"):
        engine.register(np.array([object() for _ in range(4)], dtype=object))
    with pytest.raises(baton.InvalidArgument, match="Python objects"):
        engine.register(np.zeros(4, dtype=[("a", np.uint8), ("b", object)]))
    # The wrong type altogether: TypeError, as Python's own calls raise.
    for wrong in (object(), None, 5, "abc"):
        with pytest.raises(TypeError, match="register: expected"):
            engine.register(wrong)
    with pytest.raises(TypeError, match="peer: expected"):
        baton.Request(op="read", local=local, peer=123, remote=holder.handle, length=16)
    with pytest.raises(TypeError, match="remote: expected"):
        baton.Request(op="read", local=local, peer=peer, remote=None, length=16)
    # A buffer numpy cannot export says why (the dtype), not only "read-only or not contiguous".
    with pytest.raises(baton.InvalidArgument, match="cannot be exported"):
        engine.register(np.zeros(4, dtype="datetime64[s]"))
    # Nobody listens: ConnectionError.
    with pytest.raises(ConnectionError):
        engine.connect("127.0.0.1:1")
    with pytest.raises(baton.InvalidArgument):
        engine.connect("not an address")
    # A secret that differs: PermissionError.
    with pytest.raises(ValueError):
        baton.Engine(listen="0.0.0.0:0")  # beyond loopback without a secret
    # A closed engine: ConnectionError (Unavailable) from every call.
    closed = baton.Engine()
    closed.close()
    closed.close()  # twice is fine
    assert closed.closed
    for call in (lambda: closed.address, lambda: closed.connect(holder.address), lambda: closed.allocate(4096),
                 lambda: closed.register(bytearray(16)), closed.take_notifications):
        with pytest.raises(baton.Unavailable):
            call()
    assert issubclass(baton.Unavailable, ConnectionError) and issubclass(baton.Timeout, TimeoutError)
    assert issubclass(baton.Cancelled, baton.BatonError) and issubclass(baton.DeadlineInfeasible, baton.BatonError)


def test_engine_closed_while_a_batch_waits(holder):
    engine = baton.Engine()
    peer = engine.connect(holder.address)
    local = np.zeros(SIZE, dtype=np.uint8)
    region = engine.register(local)
    batch = engine.submit([baton.Request(op="read", local=region, peer=peer, remote=holder.handle, length=SIZE,
                                         qos="background") for _ in range(256)])
    outcome = []

    def waiter():
        try:
            batch.wait(timeout=60)
            outcome.append("ok")
        except baton.BatonError as e:
            outcome.append(type(e).__name__)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    engine.close()
    t.join(timeout=30)
    assert not t.is_alive(), "the waiter hung after close()"
    assert outcome and outcome[0] in {"ok", "Cancelled", "Unavailable"}
    with pytest.raises(baton.Unavailable):
        batch.wait()
    with pytest.raises(baton.Unavailable, match="with: the engine is closed"):
        with engine:  # a closed engine is not entered again
            pass


def test_timeout_waiting_and_metrics(holder):
    # Over TCP the holder's loop answers reads; stopped, it cannot (a
    # same-host copy would need no CPU of the holder).
    engine = baton.Engine(same_host_copy=False)
    peer = engine.connect(holder.address)
    local = engine.register(np.zeros(SIZE, dtype=np.uint8))
    holder.stop()
    try:
        batch = engine.submit([baton.Request(op="read", local=local, peer=peer, remote=holder.handle, length=SIZE)])
        with pytest.raises(TimeoutError):
            batch.wait(timeout=0.2)
        assert not batch.done and batch.status is None
        # The synchronous call cancels what it gave up on, and says so.
        with pytest.raises(baton.Timeout, match="read: not done within 0.2.* s; the request was cancelled"):
            engine.read(local=local, peer=peer, remote=holder.handle, length=SIZE, timeout=0.2)
    finally:
        holder.resume()
    batch.wait(timeout=30)
    assert "baton_engine_batches_total" in engine.metrics_text()
    engine.close()


def test_importing_needs_no_gpu_library():
    code = ("import baton, pathlib; maps = pathlib.Path('/proc/self/maps').read_text(); "
            "bad = sorted({l.split()[-1] for l in maps.splitlines() if any(k in l for k in "
            "('libcudart', 'libcuda.so', 'libnvidia', 'libnvrtc'))}); print(bad)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_hangup_ends_the_program_or_is_ignored_as_it_was():
    # UCX takes SIGHUP as it loads, for its debug mode: a hang-up turned its
    # debug logging on (hundreds of lines) and the program ran on.
    code = ("import os, signal, time, baton; e = baton.Engine(); h = baton.Engine(); e.connect(h.address); "
            "os.kill(os.getpid(), signal.SIGHUP); time.sleep(0.5); print('survived', flush=True); "
            "e.close(); h.close()")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("UCX_DEBUG_SIGNO", None)
    # SIGHUP at its default, whatever this test runs under (nohup passes "ignored" on).
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    assert r.returncode == -signal.SIGHUP, (r.returncode, r.stdout, r.stderr[-2000:])
    # Under nohup (SIGHUP ignored from the start) it stays ignored.
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "survived"
    assert "DEBUG" not in r.stderr, r.stderr[-2000:]


class GpuArray:
    """A stand-in for a CUDA tensor: only __cuda_array_interface__ (host
    memory behind it, so the engine's CUDA check is what refuses it)."""

    def __init__(self, nbytes, strides=None, readonly=False):
        self.buffer = bytearray(nbytes)
        import ctypes
        address = ctypes.addressof((ctypes.c_char * nbytes).from_buffer(self.buffer))
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, readonly),
                                         "strides": strides, "version": 3}


def test_gpu_arrays_go_to_the_engine_as_vram(engine):
    # Without a GPU (or with host memory behind the interface) the engine
    # says why; a non-contiguous or read-only array is refused here.
    with pytest.raises((baton.Unavailable, baton.InvalidArgument)) as e:
        engine.register(GpuArray(4096))
    assert "CUDA" in str(e.value) or "device memory" in str(e.value)
    with pytest.raises(baton.InvalidArgument, match="not contiguous"):
        engine.register(GpuArray(4096, strides=(2,)))
    with pytest.raises(baton.InvalidArgument, match="read-only"):
        engine.register(GpuArray(4096, readonly=True))


def test_no_peer_means_between_this_engines_own_regions_over_its_gpus(engine):
    # peer=None with another of this engine's regions: a copy over the
    # host's GPU paths. Without a GPU the engine has none and says so; a
    # region of another engine is refused before that.
    a = engine.register(np.zeros(4096, dtype=np.uint8))
    b = engine.register(np.zeros(4096, dtype=np.uint8))
    with pytest.raises(baton.FailedPrecondition, match="gpu_paths is off"):
        engine.write(local=a, peer=None, remote=b, length=4096)
    # Asked for where there is no GPU (the probe finds none here), the
    # engine does not start.
    if not os.path.exists("/dev/nvidia0"):
        with pytest.raises((baton.FailedPrecondition, baton.Unavailable), match="gpu_paths"):
            baton.Engine(gpu_paths=True)
    with baton.Engine() as other:
        c = other.register(np.zeros(4096, dtype=np.uint8))
        with pytest.raises(baton.InvalidArgument, match="another engine"):
            engine.write(local=a, peer=None, remote=c, length=4096)
    with pytest.raises(TypeError, match="or None"):
        engine.write(local=a, peer=7, remote=b, length=4096)
    # Ours with a peer, or a bare handle with no peer: which region is meant?
    with pytest.raises(baton.InvalidArgument, match="peer=None"):
        engine.write(local=a, peer="127.0.0.1:1", remote=b, length=4096)
    with pytest.raises(baton.InvalidArgument, match="peer=None"):
        engine.write(local=a, peer=None, remote=b.handle, length=4096)


def test_views_of_allocated_memory_stay_valid_and_regions_stay_with_their_engine(holder):
    # A view of allocate()'s memory keeps it mapped after close(), and after
    # the Engine object itself is gone; unregister refuses while one lives.
    e = baton.Engine()
    a = e.allocate(4096)
    view = a.buffer
    view[:4] = b"kept"
    arr = np.frombuffer(a.buffer, dtype=np.uint8)
    with pytest.raises(baton.FailedPrecondition, match="still alive"):
        e.unregister(a)
    e.close()
    view[4] = 7
    assert bytes(view[:5]) == b"kept\x07" and arr[4] == 7
    with pytest.raises(baton.Unavailable):
        a.buffer
    del view, arr

    def make():
        engine = baton.Engine()
        return engine.allocate(4096)

    orphan = make()
    gc.collect()
    orphan.buffer[0] = 1  # its engine lives on with the region
    assert orphan.buffer[0] == 1

    e = baton.Engine()
    a = e.allocate(4096)
    view = a.buffer
    view.release()
    e.unregister(a)  # no view left: unregistered, the memory freed
    with pytest.raises(baton.FailedPrecondition):
        a.buffer
    e.close()

    # A region (or a request over one) of another engine is refused, not
    # looked up by its handle number in this one.
    with baton.Engine() as e1, baton.Engine() as e2:
        mine = np.zeros(1 << 20, dtype=np.uint8)
        theirs = np.zeros(1 << 20, dtype=np.uint8)
        r1, r2 = e1.register(mine), e2.register(theirs)
        assert r1.handle != r2.handle  # unique in the process (they were the same number in each engine)
        peer = e1.connect(holder.address)
        with pytest.raises(baton.InvalidArgument, match="another engine"):
            e1.read(local=r2, peer=peer, remote=holder.handle, length=16)
        with pytest.raises(baton.InvalidArgument, match="another engine"):
            e1.submit([baton.Request(op="read", local=r2, peer=peer, remote=holder.handle, length=16)])
        for call in (lambda: e1.export(r2), lambda: e1.unregister(r2)):
            with pytest.raises(baton.InvalidArgument, match="another engine"):
                call()
        assert not mine.any() and not theirs.any()
        e1.read(local=r1, peer=peer, remote=holder.handle, length=16)  # its own still works
        assert mine[:16].tobytes() == pattern(16, 7).tobytes()  # the holder's pattern


def test_timeouts_lanes_and_export_names_are_checked(holder, engine):
    peer = engine.connect(holder.address)
    for bad in (-1.0, float("nan"), float("inf"), 1e300):
        with pytest.raises(baton.InvalidArgument, match="timeout is"):
            engine.refresh(peer, timeout=bad)
    with pytest.raises(baton.InvalidArgument, match="round trip"):
        engine.refresh(peer, timeout=0)
    engine.refresh(peer, timeout=5)
    local = engine.register(bytearray(4096))
    batch = engine.submit([baton.Request(op="read", local=local, peer=peer, remote=holder.handle, length=4096)])
    for bad in (-1.0, float("nan"), 1e300):
        with pytest.raises(baton.InvalidArgument, match="timeout is"):
            batch.wait(timeout=bad)
    batch.wait(timeout=30)
    for bad in ("garbage", "127.0.0.1:99999", "127.0.0.1:0", "host:port:x"):
        with pytest.raises(baton.InvalidArgument, match="listen address"):
            engine.export(local, peers=[bad])
    engine.export(local, peers=["10.1.2.3:7000"])
    # An empty list is not "every peer" (the engine's empty list): it names nobody.
    with pytest.raises(baton.InvalidArgument, match="names no peer"):
        engine.export(local, peers=[])
    # A NUL would end the host for the resolver, or the path for the system calls.
    for bad in ("127.0.0.1\0evil.example:80", "127.0.0.1:80\0junk"):
        with pytest.raises(baton.InvalidArgument, match="NUL"):
            engine.connect(bad)
    with pytest.raises(baton.InvalidArgument, match="NUL"):
        baton.Engine(listen="127.0.0.1\0junk:0")
    with pytest.raises(baton.InvalidArgument, match="NUL"):
        baton.Engine(policy_file="/dev/null\0.yaml")
    for lanes in (0, 65, 1 << 30):
        with pytest.raises(baton.InvalidArgument, match=rf"Engine: lanes={lanes} \(expected 1\.\.64\)"):
            baton.Engine(lanes=lanes)
    with pytest.raises(baton.InvalidArgument, match=r"lanes=1 for 2 nics"):
        baton.Engine(lanes=1, nics=["lo", "lo"])
    with pytest.raises(baton.InvalidArgument, match="direct_copy_max_bytes is -1"):
        baton.Engine(direct_copy_max_bytes=-1)
    kw = dict(op="read", local=local, peer=peer, remote=holder.handle)
    for length in (0, -1):
        with pytest.raises(baton.InvalidArgument, match=r"expected > 0"):
            baton.Request(length=length, **kw)
    with pytest.raises(baton.InvalidArgument, match=r"1e\+300 ms"):
        baton.Request(length=16, deadline_ms=1e300, **kw)


def test_the_batch_event_fd_counts_a_batch_that_ended_within_submit(holder):
    import select
    with baton.Engine() as e:
        peer = e.connect(holder.address)
        local = e.register(np.zeros(SIZE, dtype=np.uint8))
        batch = e.submit([baton.Request(op="read", local=local, peer=peer, remote=holder.handle, length=SIZE)])
        assert batch.done  # copied inside submit: before anyone watched the fd
        fd = e.batch_event_fd
        assert select.select([fd], [], [], 0)[0] == [fd]
        assert int.from_bytes(os.read(fd, 8), "little") >= 1
        assert select.select([fd], [], [], 0)[0] == []
        batch.release()


def test_an_unregistered_region_is_not_found_and_listening_wide_needs_a_secret_or_consent(holder):
    with baton.Engine() as e:
        peer = e.connect(holder.address)
        gone = e.register(np.zeros(4096, dtype=np.uint8))
        e.unregister(gone)
        with pytest.raises(baton.NotFound, match="an unregistered region"):
            e.read(local=gone, peer=peer, remote=holder.handle, length=16)
        with pytest.raises(baton.NotFound, match="an unregistered region"):
            e.export(gone)
        with pytest.raises(baton.NotFound):
            e.unregister(gone)
    with pytest.raises(baton.InvalidArgument, match="without a secret"):
        baton.Engine(listen="0.0.0.0:0")
    # "" is an unset variable, not the default None asks for: secret_file=""
    # gave an engine with no secret at all.
    for name in ("secret_file", "policy_file", "metrics_address", "ucx_tls", "topology_model"):
        with pytest.raises(baton.InvalidArgument, match=name + '=""'):
            baton.Engine(**{name: ""})
    with baton.Engine(listen="0.0.0.0:0", allow_unauthenticated=True) as open_engine:
        assert open_engine.address


def test_await_ends_when_its_engine_closes_and_a_later_engine_still_wakes(holder):
    # close() frees the engine's event fd, whose number a later engine is
    # likely to get: the await on the closed engine ends, and the later
    # engine's awaits are woken by their own fd.
    async def main():
        engine = baton.Engine(same_host_copy=False)  # TCP: 1 GiB takes far longer than the 50 ms below
        peer = engine.connect(holder.address)
        region = engine.register(np.zeros(SIZE, dtype=np.uint8))
        batch = engine.submit([baton.Request(op="read", local=region, peer=peer, remote=holder.handle, length=SIZE,
                                             qos="background") for _ in range(256)])

        async def wait():
            await batch

        task = asyncio.ensure_future(wait())
        await asyncio.sleep(0.05)
        assert not task.done()
        engine.close()
        with pytest.raises(baton.Unavailable, match="await: the engine was closed"):
            await asyncio.wait_for(task, 10)
        for _ in range(3):  # each engine likely on the fd number of the one before
            with baton.Engine(same_host_copy=False) as later:
                peer = later.connect(holder.address)
                local = np.zeros(SIZE, dtype=np.uint8)
                region = later.register(local)
                batch = later.submit([baton.Request(op="read", local=region, peer=peer, remote=holder.handle,
                                                    length=SIZE)])
                await asyncio.wait_for(_awaited(batch), 10)
                assert batch.status == "ok" and np.array_equal(local, pattern(SIZE, 7))

    asyncio.run(main())


async def _awaited(batch):
    await batch


def _interrupt_in(seconds):
    """SIGINT to this process after `seconds`: what Ctrl-C sends."""
    import signal
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_interrupts_a_blocked_wait_and_read(holder):
    # The holder stopped, a TCP read cannot end; Ctrl-C still comes through.
    # A batch's wait returns at once and leaves the batch running; the
    # synchronous read cancels its request and raises once nothing more
    # can land.
    engine = baton.Engine(same_host_copy=False)
    peer = engine.connect(holder.address)
    for_batch, for_read = np.zeros(SIZE, dtype=np.uint8), np.zeros(SIZE, dtype=np.uint8)
    batch_region, read_region = engine.register(for_batch), engine.register(for_read)
    holder.stop()
    try:
        batch = engine.submit([baton.Request(op="read", local=batch_region, peer=peer, remote=holder.handle,
                                             length=SIZE)])
        _interrupt_in(0.3)
        with pytest.raises(KeyboardInterrupt):
            batch.wait()
        assert not batch.done  # interrupted, not ended: the batch runs on, the caller decides
        _interrupt_in(0.3)
        with pytest.raises(KeyboardInterrupt):
            engine.read(local=read_region, peer=peer, remote=holder.handle, length=SIZE)
        batch.cancel()
    finally:
        holder.resume()
    with pytest.raises(baton.Cancelled):
        batch.wait(timeout=30)  # a slice under way may land before it ends; nothing after
    landed = for_batch.copy()
    time.sleep(0.3)  # the holder answers what it was asked before it stopped
    assert np.array_equal(for_batch, landed) and not for_read.any()
    engine.close()


def test_a_second_ctrl_c_from_a_python_handler_raises_it_not_a_system_error(holder):
    # The first interrupt cancels the read, which waits for its slices to
    # end; a handler run while its exception was still set gave SystemError.
    engine = baton.Engine(same_host_copy=False)
    peer = engine.connect(holder.address)
    region = engine.register(np.zeros(SIZE, dtype=np.uint8))

    def handler(signum, frame):
        raise KeyboardInterrupt("from the handler")

    previous = signal.signal(signal.SIGINT, handler)
    holder.stop()
    try:
        _interrupt_in(0.3)
        second = _interrupt_in(0.8)
        with pytest.raises(KeyboardInterrupt, match="from the handler"):
            engine.read(local=region, peer=peer, remote=holder.handle, length=SIZE)
        second.join()
    finally:
        signal.signal(signal.SIGINT, previous)
        holder.resume()
    engine.close()


class FakeTensor:
    """What register() reads off a CPU torch tensor (data_ptr, numel,
    element_size), with resize_() moving its storage as torch's does when
    it grows."""

    def __init__(self, n):
        self.array = np.zeros(n, dtype=np.uint8)

    def data_ptr(self):
        return self.array.ctypes.data

    def numel(self):
        return self.array.size

    def element_size(self):
        return 1

    def is_contiguous(self):
        return True

    def resize_(self, n):
        self.array = np.zeros(n, dtype=np.uint8)


def test_a_tensor_whose_storage_moved_is_refused_at_submit(holder, engine):
    peer = engine.connect(holder.address)
    t = FakeTensor(SIZE)
    region = engine.register(t)
    engine.read(local=region, peer=peer, remote=holder.handle, length=SIZE)
    assert np.array_equal(t.array, pattern(SIZE, 7))
    t.resize_(2 * SIZE)  # the registered memory is freed
    with pytest.raises(baton.FailedPrecondition, match="moved or changed size since register"):
        engine.read(local=region, peer=peer, remote=holder.handle, length=SIZE)
    with pytest.raises(baton.FailedPrecondition, match="resize_"):
        engine.submit([baton.Request(op="read", local=region, peer=peer, remote=holder.handle, length=SIZE)])
    assert not t.array.any()
    engine.unregister(region)
    region = engine.register(t)  # registered again: its new storage
    engine.read(local=region, peer=peer, remote=holder.handle, length=SIZE)
    assert np.array_equal(t.array[:SIZE], pattern(SIZE, 7))


def test_a_numpy_array_resized_past_its_reference_check_is_refused_at_submit(holder, engine):
    # resize(refcheck=False) moves the data despite the engine's export: the
    # next read had written into freed memory (a segfault, "malloc(): invalid size").
    peer = engine.connect(holder.address)
    a = np.zeros(SIZE, dtype=np.uint8)
    region = engine.register(a)
    engine.read(local=region, peer=peer, remote=holder.handle, length=SIZE)
    assert np.array_equal(a, pattern(SIZE, 7))
    a.resize(4 * SIZE, refcheck=False)
    with pytest.raises(baton.FailedPrecondition, match="buffer of region .* moved or changed size since register"):
        engine.read(local=region, peer=peer, remote=holder.handle, length=SIZE)
    engine.unregister(region)
    region = engine.register(a)  # registered again: its new memory
    engine.read(local=region, local_offset=SIZE, peer=peer, remote=holder.handle, length=SIZE)
    assert np.array_equal(a[SIZE:2 * SIZE], pattern(SIZE, 7))


def test_a_tensor_that_claims_an_impossible_size_or_address_is_invalid_argument(engine):
    # numel * element_size wrapped: 2^62 + 1 elements of 4 bytes registered 4 bytes.
    class Claims(FakeTensor):
        def __init__(self, **claims):
            super().__init__(16)
            self.claims = claims

        def __getattribute__(self, name):
            claims = object.__getattribute__(self, "claims")
            return (lambda: claims[name]) if name in claims else object.__getattribute__(self, name)

    for claims, said in (
        (dict(numel=2 ** 62 + 1, element_size=4), "more than 2\\^64 bytes"),
        (dict(numel=-1), r"numel\(\) is -1"),
        (dict(data_ptr=-4096), r"data_ptr\(\) is -4096"),
        (dict(numel=2 ** 64), r"numel\(\) is 18446744073709551616"),
        (dict(element_size=1.5), r"element_size\(\) is 1.5"),
    ):
        with pytest.raises(baton.InvalidArgument, match=said):
            engine.register(Claims(**claims))
    region = engine.register(Claims(numel=np.int64(16)))  # what says it is an int is one
    assert region.length == 16


@pytest.mark.parametrize("name", ["Region", "RemoteRegion", "Peer", "Batch", "PreparedBatch"])
def test_objects_only_the_engine_makes_cannot_be_made_bare_with_new(name):
    # X.__new__(X) skipped the C++ constructor: .regions segfaulted, .wait()
    # aborted, .length read garbage. Run in a child: the old way crashes.
    code = f"""
import baton
try:
    baton.{name}.__new__(baton.{name})
    print("made")
except TypeError as err:
    print("refused:", err)
"""
    r = run_child(code, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == f"refused: baton.{name} objects are made by the engine, not by {name}.__new__()"


def test_an_engine_or_request_made_bare_with_new_refuses_every_call_and_subclasses_still_work():
    # Engine.__new__ and Request.__new__ stay (callers subclass both), but
    # what they made without __init__ read uninitialized memory: .closed
    # hung on a garbage mutex, submitting such a request segfaulted. Run in
    # a child: the old way crashes.
    code = """
import baton
e = baton.Engine.__new__(baton.Engine)
for call in (lambda: e.address, lambda: e.closed, lambda: e.close(), lambda: e.register(bytearray(8))):
    try:
        call()
        print("ran")
    except TypeError as err:
        print("refused:", err)
r = baton.Request.__new__(baton.Request)
try:
    r.length
except TypeError as err:
    print("refused:", err)
class Mine(baton.Engine):
    def __init__(self, listen):
        self.listen = listen  # its own attribute, set before the engine's part is built
        assert not hasattr(self, "no_such_attribute")
        super().__init__(listen=self.listen)
with Mine("127.0.0.1:0") as real:
    for call in (real.submit, real.prepare):
        try:
            call([r])
        except TypeError as err:
            print("refused:", err)
    print("subclass:", real.address.startswith("127.0.0.1:"))
"""
    r = run_child(code, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[:4] == [f"refused: Engine.{name}: this Engine was made by Engine.__new__() without __init__(): it has "
                         "nothing behind it" for name in ("address", "closed", "close", "register")]
    assert lines[4] == ("refused: Request.length: this Request was made by Request.__new__() without __init__(): it "
                        "has nothing behind it")
    assert lines[5:] == ["refused: submit: requests[0] was made by Request.__new__() without __init__()",
                         "refused: prepare: requests[0] was made by Request.__new__() without __init__()",
                         "subclass: True"]


def test_nul_bytes_empty_peers_and_tiny_timeouts_are_taken_as_given(holder):
    engine = baton.Engine(same_host_copy=False)
    local = engine.allocate(4096)
    # A NUL in a value is quoted whole (the message was cut at it), and a
    # NIC name with one is refused (if_nametoindex read "lo\0junk" as "lo").
    with pytest.raises(baton.InvalidArgument) as err:
        baton.Request(op="read\0x", local=local, peer=None, remote=local, length=16)
    assert str(err.value) == 'op "read\0x": expected "read" or "write"'
    with pytest.raises(baton.InvalidArgument, match=re.escape('NIC "lo\\x00junk" is not a device name')):
        baton.Engine(nics=["lo\0junk"])
    # An empty peer is an unset variable, not None (this engine's own regions).
    with pytest.raises(baton.InvalidArgument, match=re.escape('peer: "" (None means')):
        baton.Request(op="read", local=local, peer="", remote=0, length=16)
    # Below a nanosecond is still a time: rounded up, not 0 (the policy's
    # 60 s), so a read from a holder that stopped ends at once.
    peer = engine.connect(holder.address)
    holder.stop()
    try:
        batch = engine.submit([baton.Request(op="read", local=local, peer=peer, remote=holder.handle, length=4096,
                                             timeout_ms=1e-7)])
        give_up = time.monotonic() + 10
        while batch.states == ["running"] and time.monotonic() < give_up:
            time.sleep(0.01)
        assert batch.states in (["cancelling"], ["timeout"])
    finally:
        holder.resume()
    with pytest.raises(baton.Timeout):
        batch.wait(timeout=30)
    batch.release()
    with pytest.raises(TypeError, match="submit: requests: expected a list of Request, not str"):
        engine.submit("read")
    with pytest.raises(TypeError, match="prepare: requests\\[1\\]: expected a Request, not int"):
        engine.prepare([baton.Request(op="read", local=local, peer=None, remote=local, length=16), 5])
    engine.close()


def test_register_or_allocate_racing_close_leaves_no_region_registered():
    # close() takes the regions it knows; one registered by another thread
    # as it ran said registered, its buffer held, until the Engine went.
    for trial in range(30):
        engine = baton.Engine()
        made = []

        def register():
            for i in range(200):
                try:
                    made.append(engine.register(bytearray(4096)) if i % 2 else engine.allocate(4096))
                except baton.Unavailable:  # closed before, during or after the call
                    return

        thread = threading.Thread(target=register)
        thread.start()
        time.sleep(0.001 * (trial % 5))
        engine.close()
        thread.join()
        assert not [r for r in made if r.registered], f"trial {trial}"


def test_a_peers_region_goes_with_that_peer_and_handles_are_integers(holder, engine):
    other = Holder(size=SIZE)
    try:
        a, b = engine.connect(holder.address), engine.connect(other.address)
        theirs = a.regions[0]
        # Each process numbers its regions from a random start (a restarted
        # peer's are not its predecessor's); a handle is still only a number,
        # which at another peer may name another region.
        assert theirs.peer == a.address and b.regions[0].handle != theirs.handle
        assert repr(theirs).startswith(f'RemoteRegion(peer="{a.address}"')
        local = np.zeros(SIZE, dtype=np.uint8)
        region = engine.register(local)
        with pytest.raises(baton.InvalidArgument, match="is peer .*'s, not"):
            engine.read(local=region, peer=b, remote=theirs, length=SIZE)
        with pytest.raises(baton.InvalidArgument, match="is peer .*'s, not"):
            baton.Request(op="read", local=region, peer=b.address, remote=theirs, length=SIZE)
        assert not local.any()
        engine.read(local=region, peer=a.address, remote=theirs, length=16)  # its peer by address is that peer
        engine.read(local=region, peer=a, remote=np.int64(holder.handle), length=SIZE)  # anything with __index__
        assert np.array_equal(local, pattern(SIZE, 7))
        for bad in (2 ** 70, -1, 2 ** 32):
            with pytest.raises(baton.InvalidArgument, match="remote handle"):
                engine.read(local=region, peer=a, remote=bad, length=16)
        with pytest.raises(TypeError, match="expected a region handle"):
            engine.read(local=region, peer=a, remote=1.0, length=16)
    finally:
        other.close()


def test_an_unregistered_region_says_so_instead_of_handle_zero(engine):
    region = engine.register(bytearray(4096))
    assert region.registered and region.handle > 0 and region.length == 4096
    engine.unregister(region)
    assert not region.registered and repr(region) == "Region(unregistered)"
    for attribute in ("handle", "length", "address", "buffer"):
        with pytest.raises(baton.FailedPrecondition, match="unregistered"):
            getattr(region, attribute)


def test_a_malformed_gpu_array_interface_is_invalid_argument(engine):
    def array(**cai):
        a = GpuArray(4096)
        a.__cuda_array_interface__ = dict(a.__cuda_array_interface__, **cai)
        return a

    bad = [array(data=None), array(data=(1,)), array(shape=("x",)), array(typestr="|u"), array(typestr="<fx"),
           array(shape=(1 << 40, 1 << 40)), array(shape=(1 << 62,), typestr="<f8")]
    missing = GpuArray(4096)
    del missing.__cuda_array_interface__["data"]
    not_a_dict = GpuArray(4096)
    not_a_dict.__cuda_array_interface__ = 7
    for a in bad + [missing, not_a_dict]:
        with pytest.raises(baton.InvalidArgument, match="register: "):
            engine.register(a)


def test_asyncio_loops_in_two_threads_await_batches_of_one_engine(holder):
    # Both loops watch the engine's one event counter; the one that reads it
    # first passes the wake-up on, so neither loop's await is left waiting.
    # (Through the loop: a batch copied inside submit is done before its await.)
    engine = baton.Engine(direct_copy_max_bytes=0)
    peer = engine.connect(holder.address)
    errors = []

    def run(index):
        local = np.zeros(1 << 20, dtype=np.uint8)
        region = engine.register(local)

        async def main():
            for _ in range(20):
                batch = engine.submit([baton.Request(op="read", local=region, peer=peer, remote=holder.handle,
                                                     length=1 << 20, qos="hot_kv")])
                await asyncio.wait_for(_awaited(batch), 10)
                batch.release()

        try:
            asyncio.run(main())
            assert np.array_equal(local, pattern(SIZE, 7)[:1 << 20])
        except BaseException as e:  # reported to the test's thread
            errors.append(f"loop {index}: {type(e).__name__} {e}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    engine.close()
    assert not any(t.is_alive() for t in threads) and errors == []


def run_child(code, timeout=120):
    """`code` in a fresh interpreter: what it does wrong may be a crash."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.parametrize("how", ["del", "exit"])
def test_an_engine_dropped_with_a_batch_running_stops_before_its_buffers_go(holder, how):
    # The buffers went first and the loop kept copying into freed memory: a segfault.
    code = f"""
import baton, numpy as np
e = baton.Engine()
p = e.connect("{holder.address}")
buf = e.register(np.zeros(256 << 20, np.uint8))
rq = [baton.Request(op="read", local=buf, local_offset=i << 20, peer=p, remote={holder.handle},
                    remote_offset=(i % 4) << 20, length=1 << 20) for i in range(256)]
b = e.submit(rq * 8)
print("running" if not b.done else "ended", flush=True)
if "{how}" == "del":
    del buf, e, b
    import gc; gc.collect()
print("survived", flush=True)
"""
    r = run_child(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "survived"


@pytest.mark.parametrize("blocked_in", ["wait", "read"])
def test_a_daemon_thread_blocked_in_a_call_does_not_abort_the_exit(blocked_in):
    # CPython ends a daemon thread that takes the GIL back during finalization
    # with pthread_exit; its unwind through pybind11's GIL guard aborted the
    # process at every exit ("terminate called without an active exception").
    code = f"""
import baton, numpy as np, threading, time
h = baton.Engine(same_host_copy=False); h.export(h.register(np.ones(64 << 20, np.uint8)))
e = baton.Engine(same_host_copy=False); p = e.connect(h.address)
buf = e.register(np.zeros(64 << 20, np.uint8))
def wait_long():
    e.submit([baton.Request(op="read", local=buf, peer=p, remote=p.regions[0], length=64 << 20)
              for _ in range(100)]).wait()
def read_forever():
    while True:
        e.read(local=buf, peer=p, remote=p.regions[0], length=64 << 20)
threading.Thread(target={{"wait": wait_long, "read": read_forever}}["{blocked_in}"], daemon=True).start()
time.sleep(0.2)
print("main returns", flush=True)
"""
    for _ in range(3):  # the exit races the thread's return to the GIL
        r = run_child(code, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "terminate" not in r.stderr and r.stdout.split()[-1] == "returns"


def test_a_child_of_fork_is_refused_its_parents_engine_and_exits():
    # The child copies the engine but not its threads: every call, and the
    # interpreter's exit, waited forever on a loop that was not there.
    code = """
import baton, numpy as np, os, sys
h = baton.Engine(); h.export(h.register(np.ones(1 << 20, np.uint8)))
e = baton.Engine(); p = e.connect(h.address)
buf = e.register(np.zeros(1 << 20, np.uint8))
pid = os.fork()
if pid == 0:
    try:
        e.read(local=buf, peer=p, remote=p.regions[0], length=1 << 20)
        print("child: read ran", flush=True)
    except baton.FailedPrecondition as err:
        print("child: refused", "fork()" in str(err), flush=True)
    for call in (e.metrics_text, e.take_notifications):  # they answered "" and []
        try:
            call()
            print("child: answered", call.__name__, flush=True)
        except baton.FailedPrecondition as err:
            pass
    sys.exit(0)  # the interpreter's exit drops both engines
_, status = os.waitpid(pid, 0)
e.read(local=buf, peer=p, remote=p.regions[0], length=1 << 20)
print("parent:", os.waitstatus_to_exitcode(status), int(np.frombuffer(buf.buffer, np.uint8).min()), flush=True)
"""
    r = run_child(code, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["child: refused True", "parent: 0 1"]


def test_a_child_forked_while_an_engine_is_open_is_refused_its_own_and_a_spawned_one_is_not(tmp_path):
    # UCX's event thread does not survive fork: a child's own engine missed
    # its peers' connections (6 of 8 children). It is refused now, with the
    # way out in the message; a spawned child (a fresh process) connects.
    code = """
import baton, multiprocessing as mp, numpy as np, os, sys

def spawned(address):
    with baton.Engine() as e:
        p = e.connect(address)
        buf = e.register(np.zeros(1 << 16, np.uint8))
        e.read(local=buf, peer=p, remote=p.regions[0], length=1 << 16)
        return int(np.frombuffer(buf.buffer, np.uint8).min())

if __name__ == "__main__":
    h = baton.Engine(); h.export(h.register(np.ones(1 << 16, np.uint8)))
    pid = os.fork()
    if pid == 0:
        try:
            baton.Engine()
            print("child: created", flush=True)
        except baton.FailedPrecondition as err:
            print("child: refused", "fork()" in str(err) and "spawn" in str(err), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    with mp.get_context("spawn").Pool(1) as pool:
        print("spawned:", pool.apply(spawned, (h.address,)), flush=True)
"""
    script = tmp_path / "fork_and_spawn.py"  # a file: a spawned child imports its main module
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["child: refused True", "spawned: 1"]


def test_unregister_races_neither_a_new_view_nor_another_threads_call():
    # A view taken while unregister() ran pointed at unmapped memory, and the
    # region's last reference, dropped under the engine's mutex, released the
    # GIL to a thread waiting for that mutex: a deadlock.
    code = """
import threading, baton
e = baton.Engine()
stop = False
def poller():
    while not stop:
        e.address
threading.Thread(target=poller, daemon=True).start()
taken_while_unregistering = 0
for i in range(300):
    r = e.allocate(1 << 16)
    r.buffer.release()
    go = threading.Event(); got = []
    def grab():
        go.wait()
        try:
            got.append(r.buffer)
        except baton.BatonError as x:
            got.append(x)
    t = threading.Thread(target=grab); t.start(); go.set()
    try:
        e.unregister(r)
        unregistered = True
    except baton.FailedPrecondition:
        unregistered = False  # the view came first
    t.join()
    view = got[0]
    if isinstance(view, memoryview):
        assert not unregistered, "unregister() returned while a view of the region lived"
        view.release()
        e.unregister(r)
print("ok", flush=True)
stop = True
e.close()
"""
    r = run_child(code, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ok" in r.stdout


def held(engine):
    for line in engine.metrics_text().splitlines():
        if line.startswith("baton_engine_batches_held "):
            return int(float(line.split()[1]))
    raise AssertionError("no baton_engine_batches_held")


def test_a_batch_dropped_without_release_is_released_once_it_ended(holder, engine):
    peer = engine.connect(holder.address)
    local = engine.register(bytearray(4096))
    rq = baton.Request(op="read", local=local, peer=peer, remote=holder.handle, length=4096)
    batches = [engine.submit([rq]) for _ in range(50)]
    for b in batches:
        b.wait()
    del batches, b  # never released
    gc.collect()
    assert held(engine) == 50  # the engine cannot know yet
    last = engine.submit([rq])  # each submit releases the dropped batches that ended
    last.wait()
    assert held(engine) == 1
    last.release()
    assert held(engine) == 0
    # release() once, then the drop: nothing left to release, nothing raised.
    b = engine.submit([rq])
    b.wait()
    b.release()
    del b
    gc.collect()
    engine.submit([rq]).wait()
    assert held(engine) == 1  # the batch just dropped, until the next submit


def test_a_closed_engines_regions_are_no_longer_registered():
    e = baton.Engine()
    region = e.register(bytearray(4096))
    assert region.registered
    e.close()
    assert not region.registered


def connected_with_two_buffers(holder, engine):
    """The peer, and two registered buffers of SIZE: one to send from, one to check into."""
    peer = engine.connect(holder.address)
    local = np.zeros(SIZE, dtype=np.uint8)
    check = np.zeros(SIZE, dtype=np.uint8)
    return peer, local, engine.register(local), check, engine.register(check)


def test_a_prepared_batch_is_submitted_many_times_with_submits_answers(holder, engine):
    """Engine.prepare(): checked once, each submit moves that moment's bytes, a moved tensor and a gone region still raise."""
    peer, local, region, check, check_region = connected_with_two_buffers(holder, engine)
    block = 4096
    writes = [baton.Request(op="write", local=region, local_offset=i * block, peer=peer, remote=holder.handle,
                            remote_offset=i * block, length=block, deadline_ms=(1000 if i == 0 else None))
              for i in range(8)]
    prepared = engine.prepare(writes)
    assert len(prepared) == 8 and prepared.bytes == 8 * block
    for round in range(6):
        local[:8 * block] = pattern(8 * block, 100 + round)
        batch = prepared.submit()
        batch.wait(timeout=30)
        assert batch.status == "ok" and batch.bytes_done == 8 * block
        batch.release()
        engine.read(local=check_region, peer=peer, remote=holder.handle, length=8 * block)
        assert np.array_equal(check[:8 * block], pattern(8 * block, 100 + round)), round
    # Without a deadline, the same bytes the loop-free way.
    reads = engine.prepare([baton.Request(op="read", local=check_region, peer=peer, remote=holder.handle,
                                          length=8 * block)])
    check[:] = 0
    reads.submit().wait(timeout=30)
    assert np.array_equal(check[:8 * block], pattern(8 * block, 105))
    # What every submit would raise, prepare raises once; what depends on
    # the moment (a region gone), each submit raises.
    with pytest.raises(baton.InvalidArgument, match="the batch is empty"):
        engine.prepare([])
    engine.unregister(region)
    with pytest.raises(baton.NotFound):
        prepared.submit()
    with pytest.raises(baton.NotFound):
        engine.submit(writes)
    t = FakeTensor(SIZE)
    moved = engine.prepare([baton.Request(op="read", local=engine.register(t), peer=peer, remote=holder.handle,
                                          length=block)])
    moved.submit().wait(timeout=30)
    t.resize_(2 * SIZE)
    with pytest.raises(baton.FailedPrecondition, match="resize_"):
        moved.submit()
    engine.close()
    with pytest.raises(baton.Unavailable):
        reads.submit()


def test_a_prepared_batch_runs_many_times_and_raises_what_submit_raises(holder, engine):
    """PreparedBatch.run(): submit, wait and release in one call, each run that moment's bytes; failures raise."""
    peer, local, region, check, check_region = connected_with_two_buffers(holder, engine)
    block = 4096
    writes = engine.prepare([baton.Request(op="write", local=region, local_offset=i * block, peer=peer,
                                           remote=holder.handle, remote_offset=i * block, length=block,
                                           deadline_ms=(1000 if i == 0 else None)) for i in range(4)])
    reads = engine.prepare([baton.Request(op="read", local=check_region, peer=peer, remote=holder.handle,
                                          length=4 * block)])
    for round in range(6):
        local[:4 * block] = pattern(4 * block, 200 + round)
        assert writes.run(timeout=30) is None
        check[:] = 0
        reads.run()
        assert np.array_equal(check[:4 * block], pattern(4 * block, 200 + round)), round
    with pytest.raises(baton.InvalidArgument):
        reads.run(timeout=-1)
    with pytest.raises(baton.InvalidArgument, match="4097 bytes"):
        engine.prepare([baton.Request(op="read", local=check_region, peer=peer, remote=holder.handle, length=1)],
                       notification=b"x" * 4097)
    assert isinstance(reads, baton.PreparedBatch) and "PreparedBatch" in baton.__all__
    with pytest.raises(baton.OutOfRange):  # what submit refuses, prepare refuses
        engine.prepare([baton.Request(op="read", local=check_region, peer=peer, remote=holder.handle,
                                      remote_offset=SIZE - 1, length=2)])
    engine.unregister(check_region)
    with pytest.raises(baton.NotFound):
        reads.run()
    engine.close()
    with pytest.raises(baton.Unavailable):
        writes.run()


def test_a_read_past_its_timeout_from_a_stopped_peer_ends_with_the_stall_timeout_and_says_so(holder):
    # A slice on the wire to a peer that stopped answering ends only when the
    # path fails (stall_timeout): the read waits for that, so that nothing
    # lands afterwards, and its Timeout says how long it took and why.
    with pytest.raises(baton.InvalidArgument, match="stall_timeout"):
        baton.Engine(stall_timeout=-1)
    with pytest.raises(baton.InvalidArgument, match="stall_timeout"):
        baton.Engine(stall_timeout=float("nan"))
    # Two engines reading from the same stopped holder: the one with the
    # shorter stall timeout gives up first (an ordering, not a time).
    engines = {t: baton.Engine(same_host_copy=False, stall_timeout=t) for t in (1, 4)}
    peers = {t: e.connect(holder.address) for t, e in engines.items()}
    buffers = {t: np.zeros(SIZE, dtype=np.uint8) for t in engines}
    regions = {t: engines[t].register(buffers[t]) for t in engines}
    ended, raised = [], {}

    def read(t):
        try:
            engines[t].read(local=regions[t], peer=peers[t], remote=holder.handle, length=SIZE, timeout=0.2)
        except baton.BatonError as e:
            raised[t] = e
        ended.append(t)

    holder.stop()
    try:
        threads = [threading.Thread(target=read, args=(t,)) for t in engines]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
    finally:
        holder.resume()
    assert ended == [1, 4]
    later = {}
    for t in engines:
        assert isinstance(raised[t], baton.Timeout), raised[t]
        said = re.search(r"not done within 0.2 s; the request was cancelled ([0-9.]+) s later.*stall_timeout.*"
                         r"nothing more lands", str(raised[t]))
        assert said, str(raised[t])
        later[t] = float(said.group(1))
    assert later[4] > 2 * later[1], later  # each waited its own stall timeout
    # What ended them was the stall timeout: the path failed, and stays
    # failed though the holder runs again; nothing landed after the read.
    with pytest.raises(baton.Unavailable):
        engines[1].read(local=regions[1], peer=peers[1], remote=holder.handle, length=SIZE, timeout=5)
    landed = {t: b.copy() for t, b in buffers.items()}
    time.sleep(0.3)  # the holder, running again, answers what it was asked before it stopped
    for t in engines:
        assert np.array_equal(buffers[t], landed[t])
        engines[t].close()


def test_an_await_given_up_lets_a_dropped_engine_close(holder):
    # asyncio.wait_for's timeout cancels the await: the waker lets go of the
    # engine at once, so an engine dropped afterwards still closes.
    engine = baton.Engine(same_host_copy=False)
    address = engine.address
    peer = engine.connect(holder.address)
    region = engine.register(np.zeros(SIZE, dtype=np.uint8))
    holder.stop()
    try:
        batch = engine.submit([baton.Request(op="read", local=region, peer=peer, remote=holder.handle, length=SIZE)])

        async def main():
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(_awaited(batch), 0.05)

        asyncio.run(main())
        assert not any(of is engine for _, of in baton._wakers)
        batch.cancel()
    finally:
        holder.resume()
    with pytest.raises(baton.Cancelled):
        batch.wait(timeout=30)
    batch.release()
    del engine, peer, region, batch
    gc.collect()
    with baton.Engine() as probe:
        with pytest.raises(baton.Unavailable):
            probe.connect(address)


def test_help_shows_the_engines_keywords_and_defaults():
    doc = baton.Engine.__init__.__doc__ or ""
    for keyword in ("listen: str = '127.0.0.1:0'", "secret_file", "same_host_copy: bool = True", "lanes: int = 2"):
        assert keyword in doc, doc
