"""The zeroed scratch kept per stream (_scratch.ScratchPool) and the launchers kept for repeat calls
(_launcher.LauncherCache), without a GPU: which calls share a buffer. Launches that share one count
arrivals in each other's scratch, so two streams that can run at once must never share; calls on one
stream must, or every call pays a fill again. A host thread's per-thread default stream is a stream
of its own, also after the thread id is reused. And the repeat-call path's keys: which calls replay
launches kept for an earlier one."""

from __future__ import annotations

import doctest
import threading

import numpy as np
import pytest
from checks import keep_recording_launcher

from portable_softmax import _launcher, _scratch, api
from portable_softmax._launcher import LauncherCache
from portable_softmax._scratch import PER_THREAD_DEFAULT_STREAM, ScratchPool


class FakeDevice:
    """The part of a DeviceArray that the pool and the cache use; each scratch() a new buffer."""

    vendor, device_index, dtype = "cuda", 0, "float32"

    def __init__(self, capturing=False):
        self.fills: list[int] = []
        self.is_capturing = capturing

    def scratch(self, nbytes, zeroed=True):
        if zeroed:
            self.fills.append(nbytes)
        buffer = bytearray(nbytes)
        return id(buffer), buffer

    def capturing(self):
        return self.is_capturing


class FakeRuntime:
    """The runtime adapter's synchronize_stream (records which host thread drained which stream) and
    prepare (a launcher that records its calls)."""

    def __init__(self, fails=False):
        self.drained: list[tuple[int, int, int]] = []
        self.fails = fails
        self.prepared: list[tuple] = []
        self.launched: list[tuple] = []

    def synchronize_stream(self, device, stream):
        if self.fails:
            raise RuntimeError("the runtime is gone")
        self.drained.append((device, stream, threading.get_native_id()))

    def prepare(self, plan, dtype, device, buffers=None, pointers=("x", "y")):
        self.prepared.append((plan, dtype, device, dict(buffers or {}), pointers))
        return lambda *args: self.launched.append(args)


class FakePlan:
    """A plan's scratch: its bytes, buffer offsets and whether its launches leave it zero."""

    def __init__(self, scratch=0, zeroed=True):
        self.scratch, self.scratch_zeroed = scratch, zeroed

    def scratch_layout(self):
        return self.scratch, {"sums": 0, "counts": self.scratch // 2}


@pytest.fixture
def pool():
    return ScratchPool()


@pytest.fixture
def kept():
    return FakeDevice()


RT = FakeRuntime()


def _in_new_thread(call):
    """call() on a new host thread, which then ends; (its result, the thread's native id)."""
    result = []
    worker = threading.Thread(target=lambda: result.append((call(), threading.get_native_id())))
    worker.start()
    worker.join()
    return result[0]


def _pointer_in_new_thread(pool, device, nbytes, stream, rt=RT):
    return _in_new_thread(lambda: pool.zeroed(device, nbytes, stream, rt))[0]


def test_calls_on_one_stream_share_one_fill(pool, kept):
    ordinary = 0x5A5A00
    first = pool.zeroed(kept, 4096, ordinary, RT)
    assert pool.zeroed(kept, 1024, ordinary, RT) == first
    # An ordinary handle names one stream in every host thread: its launches are ordered.
    assert _pointer_in_new_thread(pool, kept, 4096, ordinary) == first
    assert len(kept.fills) == 1 and kept.fills[0] >= ScratchPool.MIN_BYTES
    assert pool.held_streams() == [ordinary]


def test_two_streams_never_share(pool, kept):
    assert pool.zeroed(kept, 4096, 0x100, RT) != pool.zeroed(kept, 4096, 0x200, RT)
    assert len(kept.fills) == 2
    assert sorted(pool.held("cuda", 0)) == [0x100, 0x200] and pool.held("cuda", 1) == {}


def test_the_per_thread_default_stream_is_a_stream_a_thread(pool, kept):
    """cudaStreamPerThread / hipStreamPerThread: one handle, a different stream in each thread,
    whose launches may run at the same time as this thread's."""
    here = pool.zeroed(kept, 4096, PER_THREAD_DEFAULT_STREAM, RT)
    there = _pointer_in_new_thread(pool, kept, 4096, PER_THREAD_DEFAULT_STREAM)
    assert here != there
    assert pool.zeroed(kept, 4096, PER_THREAD_DEFAULT_STREAM, RT) == here  # this thread's again: no new fill
    assert len(kept.fills) == 2
    assert pool.stream_key(PER_THREAD_DEFAULT_STREAM) != PER_THREAD_DEFAULT_STREAM
    assert pool.stream_key(0x100) == 0x100


def test_a_larger_call_grows_the_buffer_and_keeps_the_outgrown_one(pool, kept):
    small = pool.zeroed(kept, 4096, 0x100, RT)
    large = pool.zeroed(kept, 1 << 20, 0x100, RT)
    assert large != small and kept.fills[-1] >= 1 << 20
    # launches queued before the larger call may still use the smaller buffer: it stays alive
    assert pool.kept_alive() == 1
    assert pool.zeroed(kept, 4096, 0x100, RT) == large


def test_every_thread_gets_a_token_of_its_own():
    """Thread ids come back once their thread ends, while the ended thread's last launches may still
    run on its per-thread stream: the key is a token a thread, never given twice, whatever the ids."""
    pool = ScratchPool()
    keys = [_in_new_thread(lambda: pool.stream_key(PER_THREAD_DEFAULT_STREAM))[0] for _ in range(20)]
    assert len(set(keys)) == len(keys)
    assert pool.stream_key(PER_THREAD_DEFAULT_STREAM) == pool.stream_key(PER_THREAD_DEFAULT_STREAM)  # stable
    # a thread that gets the id of an ended one still gets a new token: the key is not the id
    ident = threading.get_ident()
    assert all(key[1] != ident for key in keys)


def test_an_ended_threads_scratch_is_reused_once_its_stream_has_drained(pool, kept):
    rt = FakeRuntime()
    first, first_thread = _in_new_thread(lambda: pool.zeroed(kept, 4096, PER_THREAD_DEFAULT_STREAM, rt))
    # drained by the ended thread itself (its handle names its own stream), on its device
    assert rt.drained == [(0, PER_THREAD_DEFAULT_STREAM, first_thread)]
    assert pool.held_streams() == [] and [b[0] for b in pool.idle("cuda", 0)] == [first]
    # the next thread takes the drained buffer, still zero (launches leave it so): no fill
    assert _pointer_in_new_thread(pool, kept, 2048, PER_THREAD_DEFAULT_STREAM, rt) == first
    assert len(kept.fills) == 1 and pool.idle("cuda", 0) != []  # it ended too: idle again
    # larger than any idle buffer: a fill of its own
    assert _pointer_in_new_thread(pool, kept, 1 << 20, PER_THREAD_DEFAULT_STREAM, rt) != first
    assert len(kept.fills) == 2


def test_a_drained_buffer_goes_to_the_next_new_stream_of_its_device(pool, kept):
    """An ended thread's buffer serves any stream new to the pool (not only another thread's
    per-thread one), and only on its own device."""
    first = _pointer_in_new_thread(pool, kept, 4096, PER_THREAD_DEFAULT_STREAM)
    other_device = FakeDevice()
    other_device.device_index = 1
    assert pool.zeroed(other_device, 4096, 0x300, RT) != first and len(other_device.fills) == 1
    assert pool.zeroed(kept, 4096, 0x300, RT) == first and len(kept.fills) == 1
    assert pool.idle("cuda", 0) == []


def test_an_ended_threads_scratch_that_cannot_be_drained_is_never_reused(pool, kept):
    failing = FakeRuntime(fails=True)
    first = _pointer_in_new_thread(pool, kept, 4096, PER_THREAD_DEFAULT_STREAM, failing)
    assert pool.kept_alive() == 1 and not pool.idle("cuda", 0)  # kept alive for its launches
    assert _pointer_in_new_thread(pool, kept, 4096, PER_THREAD_DEFAULT_STREAM, failing) != first
    assert len(kept.fills) == 2


def test_ordinary_streams_are_not_drained_at_thread_end(pool, kept):
    rt = FakeRuntime()
    _pointer_in_new_thread(pool, kept, 4096, 0x100, rt)
    assert rt.drained == [] and 0x100 in pool.held("cuda", 0)


@pytest.mark.parametrize("module", [_scratch, _launcher], ids=lambda m: m.__name__)
def test_the_modules_examples_run(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


# ---- the launcher cache -----------------------------------------------------------------------------
def test_an_entry_without_scratch_is_built_once_and_replays_on_any_stream(pool, kept):
    cache, rt = LauncherCache(pool), FakeRuntime()
    entry = cache.build("key", rt, kept, FakePlan(), 0x100)
    launcher, contiguous, bound_to, keep, device, windows = entry
    assert cache.get("key") is entry and "key" in cache and len(cache) == 1
    assert (contiguous, bound_to, keep, device, windows) == (True, None, None, ("cuda", 0), ())
    assert rt.prepared == [(rt.prepared[0][0], "float32", 0, {}, ("x", "y"))]
    launcher(1, 2, 0x200)
    assert rt.launched == [(1, 2, 0x200)] and kept.fills == []


def test_an_entry_with_scratch_owns_it_and_is_bound_to_its_stream(pool, kept):
    cache, rt = LauncherCache(pool), FakeRuntime()
    _, _, bound_to, keep, _, windows = cache.build("key", rt, kept, FakePlan(256), 0x100, ("dy", "y", "dx"), False,
                                                   ((-8, 8, True), (-16, 4, False)))
    assert windows == ((-8, 8, True), (-16, 4, False))  # kept as given, for the repeat paths
    assert bound_to == 0x100 and len(keep) == 256 and kept.fills == [256]  # zeroed once, its own
    buffers, pointers = rt.prepared[0][3], rt.prepared[0][4]
    assert buffers == {"sums": id(keep), "counts": id(keep) + 128} and pointers == ("dy", "y", "dx")
    assert cache.bound_to(0x100) == ["key"] and cache.bound_to(0x200) == []
    # kept for another stream: the key keeps its entry, another stream launches one-off
    assert cache.build("key", rt, kept, FakePlan(256), 0x200) is None and cache.get("key")[2] == 0x100
    # a plan whose launches do not leave their scratch zero gets it unfilled
    cache.build("split", rt, kept, FakePlan(512, zeroed=False), 0x100)
    assert kept.fills == [256]


def test_no_entry_with_scratch_is_built_while_the_stream_captures_a_graph(pool):
    cache, rt = LauncherCache(pool), FakeRuntime()
    capturing = FakeDevice(capturing=True)
    assert cache.build("key", rt, capturing, FakePlan(256), 0x100) is None and len(cache) == 0
    assert cache.build("key", rt, capturing, FakePlan(), 0x100) is not None  # no scratch: nothing to fill


def test_the_cache_starts_again_past_its_limit(pool, kept, monkeypatch):
    cache, rt = LauncherCache(pool), FakeRuntime()
    monkeypatch.setattr(LauncherCache, "LIMIT", 3)
    for key in range(5):
        cache.build(key, rt, kept, FakePlan(), 0x100)
    assert sorted(cache.entries) == [3, 4]


def test_entries_bound_to_an_ended_threads_stream_are_dropped_once_drained(pool, kept):
    """An entry with scratch replays only on the stream it was built on; an ended thread's key is
    never seen again, so its entries go (their scratch freed after the drain)."""
    cache, rt = LauncherCache(pool), FakeRuntime()
    cache.build("ordinary", rt, kept, FakePlan(64), 0x100)
    (key, thread_key), _ = _in_new_thread(
        lambda: (cache.build("mine", rt, kept, FakePlan(64), PER_THREAD_DEFAULT_STREAM) and "mine",
                 pool.stream_key(PER_THREAD_DEFAULT_STREAM)))
    assert key not in cache and "ordinary" in cache and cache.bound_to(thread_key) == []
    assert [d[:2] for d in rt.drained] == [(0, PER_THREAD_DEFAULT_STREAM)] and pool.kept_alive() == 0


def test_entries_of_a_thread_that_cannot_be_drained_keep_their_scratch_alive(pool, kept):
    cache, failing = LauncherCache(pool), FakeRuntime(fails=True)
    _in_new_thread(lambda: cache.build("mine", failing, kept, FakePlan(64), PER_THREAD_DEFAULT_STREAM))
    assert "mine" not in cache and pool.kept_alive() == 1


def test_an_out_call_replays_the_launches_kept_for_its_and_outs_layout(torch_repeat_path):
    torch = torch_repeat_path
    x, out = torch.randn(4, 8), torch.empty(4, 8)
    launched = keep_recording_launcher(api._prepared_key(x, -1, "softmax", False, out))
    import portable_softmax as ps

    assert ps.softmax(x, out=out) is out  # the public entry point takes them, and returns out itself
    assert launched == [(x.data_ptr(), out.data_ptr(), 7)]
    fresh = torch.empty(4, 8)  # a new out laid out alike: the same launches, its pointer
    assert api._run_prepared(x, -1, "softmax", fresh, False) is fresh
    assert launched[-1] == (x.data_ptr(), fresh.data_ptr(), 7)
    # what the full path would have to plan or check again: not these launches
    for other_out in (torch.empty(8, 4).t(),  # other strides
                      torch.empty(4, 9)[:, :8],  # rows 9 apart
                      torch.empty(33)[1:].view(4, 8),  # 4 bytes past a 16-byte boundary
                      torch.empty(4, 8, dtype=torch.float64),
                      torch.empty(4, 8).requires_grad_(),
                      np.empty((4, 8), np.float32)):
        assert api._run_prepared(x, -1, "softmax", other_out, False) is None, other_out
    assert api._run_prepared(x, -1, "softmax", None, False) is None  # kept for out= calls only
    assert api._run_prepared(x, -1, "log_softmax", out, False) is None
    assert len(launched) == 2


def test_an_out_calls_launches_with_scratch_replay_only_on_their_stream(torch_repeat_path, monkeypatch):
    torch = torch_repeat_path
    x, out = torch.randn(4, 8), torch.empty(4, 8)
    launched = keep_recording_launcher(api._prepared_key(x, 1, "log_softmax", False, out), bound_to=api.stream_key(5))
    assert api._run_prepared(x, 1, "log_softmax", out, False) is None  # the current stream is 7
    monkeypatch.setattr(api, "_current_stream", lambda device: 5)
    assert api._run_prepared(x, 1, "log_softmax", out, False) is out
    assert launched == [(x.data_ptr(), out.data_ptr(), 5)]


class FakeCupyMemory:
    """A cupy MemoryPointer's two fields the repeat path reads."""

    def __init__(self, ptr: int, device_id: int):
        self.ptr, self.device_id = ptr, device_id


class FakeCupyArray:
    """What the repeat path reads of a cupy array: dtype, shape, byte strides and its memory."""

    def __init__(self, shape, strides=None, ptr=1 << 20, device=0, dtype="float32"):
        self.dtype, self.shape = np.dtype(dtype), tuple(shape)
        self.strides = strides or tuple(int(np.prod(shape[i + 1:])) * self.dtype.itemsize
                                        for i in range(len(shape)))
        self.data = FakeCupyMemory(ptr, device)


class FakeCupyStream:
    """A cupy Stream's handle."""

    def __init__(self, ptr: int):
        self.ptr = ptr


@pytest.fixture
def prepared_cupy(monkeypatch):
    """api's repeat-call path with cupy seen (FakeCupyArray standing in for cupy.ndarray), an empty
    launcher cache, device 0 current and stream 7 current on it; returns the list of arrays that the
    stand-in cupy.empty allocated."""
    allocated: list[FakeCupyArray] = []

    class FakeCupy:
        @staticmethod
        def empty(shape, dtype):
            allocated.append(FakeCupyArray(shape, ptr=(2 + len(allocated)) << 20, dtype=dtype))
            return allocated[-1]

    api.launchers.clear()
    monkeypatch.setattr(api, "_CUPY", FakeCupy)
    monkeypatch.setattr(api, "_CUPY_NDARRAY", FakeCupyArray)
    monkeypatch.setattr(api, "_cupy_device", lambda: 0)
    monkeypatch.setattr(api, "_cupy_current_stream", lambda: FakeCupyStream(7))
    yield allocated
    api.launchers.clear()


def test_a_cupy_repeat_call_replays_the_launches_kept_for_its_layout(prepared_cupy):
    import portable_softmax as ps

    x = FakeCupyArray((4, 8))
    assert api._preparable(x, None) and api._preparable(x, FakeCupyArray((4, 8)))
    assert not api._preparable(x, np.empty((4, 8), np.float32))  # an out the full path copies into
    launched = keep_recording_launcher(api._prepared_key(x, -1, "softmax", False))
    y = ps.softmax(x)  # the public entry point takes them
    assert prepared_cupy == [y] and y.shape == (4, 8) and y.dtype == np.float32
    assert launched == [(x.data.ptr, y.data.ptr, 7)]
    same_layout = FakeCupyArray((4, 8), ptr=9 << 20)
    assert api._run_prepared_cupy(same_layout, -1, "softmax", None, False) is prepared_cupy[-1]
    assert launched[-1] == (9 << 20, prepared_cupy[-1].data.ptr, 7)
    # what the full path would have to plan again: not these launches
    for other in (FakeCupyArray((4, 8), strides=(4, 16)),  # the transpose of an 8x4 array
                  FakeCupyArray((4, 8), strides=(36, 4)),  # rows 9 apart
                  FakeCupyArray((4, 8), ptr=(1 << 20) + 4),  # 4 bytes past a 16-byte boundary
                  FakeCupyArray((4, 8), dtype="float64"),
                  FakeCupyArray((8, 4)),
                  FakeCupyArray((4, 8), device=1)):
        assert api._run_prepared_cupy(other, -1, "softmax", None, False) is None, vars(other)
    assert api._run_prepared_cupy(x, 1, "softmax", None, False) is None  # keyed by the axis as written
    assert api._run_prepared_cupy(x, np.int64(-1), "softmax", None, False) is None  # the checked way
    assert api._run_prepared_cupy(x, -1, "log_softmax", None, False) is None
    assert api._run_prepared_cupy(x, -1, "softmax", None, True) is None
    assert len(launched) == 2 and len(prepared_cupy) == 2


def test_a_cupy_array_on_a_device_not_current_takes_the_full_path(prepared_cupy, monkeypatch):
    x = FakeCupyArray((4, 8), device=1)
    launched = keep_recording_launcher(api._prepared_key(x, -1, "softmax", False))
    assert api._run_prepared_cupy(x, -1, "softmax", None, False) is None  # cupy would allocate on device 0
    monkeypatch.setattr(api, "_cupy_device", lambda: 1)
    y = api._run_prepared_cupy(x, -1, "softmax", None, False)
    assert launched == [(x.data.ptr, y.data.ptr, 7)]


def test_a_cupy_out_call_replays_only_for_out_laid_out_alike_and_on_its_stream(prepared_cupy, monkeypatch):
    x, out = FakeCupyArray((4, 8)), FakeCupyArray((4, 8), ptr=3 << 20)
    launched = keep_recording_launcher(api._prepared_key(x, 0, "log_softmax", False, out), bound_to=api.stream_key(5))
    assert api._run_prepared_cupy(x, 0, "log_softmax", out, False) is None  # the current stream is 7
    monkeypatch.setattr(api, "_cupy_current_stream", lambda: FakeCupyStream(5))
    assert api._run_prepared_cupy(x, 0, "log_softmax", out, False) is out
    fresh = FakeCupyArray((4, 8), ptr=5 << 20)
    assert api._run_prepared_cupy(x, 0, "log_softmax", fresh, False) is fresh
    assert launched == [(x.data.ptr, out.data.ptr, 5), (x.data.ptr, fresh.data.ptr, 5)]
    assert prepared_cupy == []  # out= calls allocate nothing
    for other_out in (FakeCupyArray((4, 8), strides=(4, 16), ptr=5 << 20),
                      FakeCupyArray((4, 8), ptr=(5 << 20) + 8),
                      FakeCupyArray((4, 8), dtype="float16", ptr=5 << 20),
                      FakeCupyArray((4, 8), ptr=5 << 20, device=1),
                      np.empty((4, 8), np.float32)):
        assert api._run_prepared_cupy(x, 0, "log_softmax", other_out, False) is None
    assert api._run_prepared_cupy(x, 0, "log_softmax", None, False) is None  # kept for out= calls only
    assert len(launched) == 2
