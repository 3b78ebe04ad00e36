"""The zeroed scratch kept per stream (api._zeroed_scratch), without a GPU: which calls share a
buffer. Launches that share one count arrivals in each other's scratch, so two streams that can
run at once must never share; calls on one stream must, or every call pays a fill again. A host
thread's per-thread default stream is a stream of its own, also after the thread id is reused.
And the repeat-call path's keys: which calls replay launches kept for an earlier one."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from portable_softmax import api


class FakeDevice:
    """The part of a DeviceArray that _zeroed_scratch uses; each scratch() a new zeroed buffer."""

    vendor, device_index = "cuda", 0

    def __init__(self):
        self.fills: list[int] = []

    def scratch(self, nbytes, zeroed=True):
        assert zeroed, "the kept scratch must start zeroed"
        self.fills.append(nbytes)
        buffer = bytearray(nbytes)
        return id(buffer), buffer


class FakeRuntime:
    """The runtime adapter's synchronize_stream: records which host thread drained which stream."""

    def __init__(self, fails=False):
        self.drained: list[tuple[int, int, int]] = []
        self.fails = fails

    def synchronize_stream(self, device, stream):
        if self.fails:
            raise RuntimeError("the runtime is gone")
        self.drained.append((device, stream, threading.get_native_id()))


@pytest.fixture
def kept(monkeypatch):
    monkeypatch.setattr(api, "_zeroed", {})
    monkeypatch.setattr(api, "_outgrown", [])
    monkeypatch.setattr(api, "_idle", {})
    return FakeDevice()


RT = FakeRuntime()


def _in_new_thread(call):
    """call() on a new host thread, which then ends; (its result, the thread's native id)."""
    result = []
    worker = threading.Thread(target=lambda: result.append((call(), threading.get_native_id())))
    worker.start()
    worker.join()
    return result[0]


def _pointer_in_new_thread(device, nbytes, stream, rt=RT):
    return _in_new_thread(lambda: api._zeroed_scratch(device, nbytes, stream, rt))[0]


def test_calls_on_one_stream_share_one_fill(kept):
    ordinary = 0x5A5A00
    first = api._zeroed_scratch(kept, 4096, ordinary, RT)
    assert api._zeroed_scratch(kept, 1024, ordinary, RT) == first
    # An ordinary handle names one stream in every host thread: its launches are ordered.
    assert _pointer_in_new_thread(kept, 4096, ordinary) == first
    assert len(kept.fills) == 1


def test_two_streams_never_share(kept):
    assert api._zeroed_scratch(kept, 4096, 0x100, RT) != api._zeroed_scratch(kept, 4096, 0x200, RT)
    assert len(kept.fills) == 2


def test_the_per_thread_default_stream_is_a_stream_a_thread(kept):
    """cudaStreamPerThread / hipStreamPerThread: one handle, a different stream in each thread,
    whose launches may run at the same time as this thread's."""
    per_thread = api.PER_THREAD_DEFAULT_STREAM
    here = api._zeroed_scratch(kept, 4096, per_thread, RT)
    there = _pointer_in_new_thread(kept, 4096, per_thread)
    assert here != there
    assert api._zeroed_scratch(kept, 4096, per_thread, RT) == here  # this thread's again: no new fill
    assert len(kept.fills) == 2
    assert api.stream_key(per_thread) != per_thread and api.stream_key(0x100) == 0x100


def test_a_larger_call_grows_the_buffer_and_keeps_the_outgrown_one(kept):
    small = api._zeroed_scratch(kept, 4096, 0x100, RT)
    large = api._zeroed_scratch(kept, 1 << 20, 0x100, RT)
    assert large != small and kept.fills[-1] >= 1 << 20
    # launches queued before the larger call may still use the smaller buffer: it stays alive
    assert len(api._outgrown) == 1
    assert api._zeroed_scratch(kept, 4096, 0x100, RT) == large


def test_a_thread_id_used_again_is_another_stream():
    """Thread ids come back once their thread ends, while the ended thread's last launches may still
    run on its per-thread stream: the key is a token a thread, never given twice."""
    per_thread = api.PER_THREAD_DEFAULT_STREAM
    seen = [_in_new_thread(lambda: (threading.get_ident(), api.stream_key(per_thread)))[0] for _ in range(20)]
    idents, keys = zip(*seen)
    assert len(set(keys)) == len(keys)
    assert len(set(idents)) < len(idents), "no thread id came back in 20 threads: the case is untested"
    assert api.stream_key(per_thread) == api.stream_key(per_thread)  # stable within a thread


def test_an_ended_threads_scratch_is_reused_once_its_stream_has_drained(kept):
    per_thread = api.PER_THREAD_DEFAULT_STREAM
    rt = FakeRuntime()
    first, first_thread = _in_new_thread(lambda: api._zeroed_scratch(kept, 4096, per_thread, rt))
    # drained by the ended thread itself (its handle names its own stream), on its device
    assert rt.drained == [(0, per_thread, first_thread)]
    assert not any(key[2] != per_thread and key[2][0] == per_thread for key in api._zeroed)
    # the next thread takes the drained buffer, still zero (launches leave it so): no fill
    assert _pointer_in_new_thread(kept, 2048, per_thread, rt) == first
    assert len(kept.fills) == 1
    # larger than any idle buffer: a fill of its own
    assert _pointer_in_new_thread(kept, 1 << 20, per_thread, rt) != first
    assert len(kept.fills) == 2


def test_an_ended_threads_scratch_that_cannot_be_drained_is_never_reused(kept):
    per_thread = api.PER_THREAD_DEFAULT_STREAM
    failing = FakeRuntime(fails=True)
    first = _pointer_in_new_thread(kept, 4096, per_thread, failing)
    assert len(api._outgrown) == 1 and not api._idle.get(("cuda", 0))  # kept alive for its launches
    assert _pointer_in_new_thread(kept, 4096, per_thread, failing) != first
    assert len(kept.fills) == 2


def test_ordinary_streams_are_not_drained_at_thread_end(kept):
    rt = FakeRuntime()
    _pointer_in_new_thread(kept, 4096, 0x100, rt)
    assert rt.drained == [] and ("cuda", 0, 0x100) in api._zeroed


def test_prepared_launches_bound_to_an_ended_threads_stream_are_dropped_once_drained(kept, monkeypatch):
    """The repeat-call path keeps launches with scratch for the stream they were made on; an ended
    thread's key is never seen again, so they go (their scratch freed after the drain)."""
    per_thread = api.PER_THREAD_DEFAULT_STREAM
    monkeypatch.setattr(api, "_prepared", {})
    rt = FakeRuntime()
    other = ("float32", (4, 4), (4, 1), 0, -1, "softmax", False, 0)
    api._prepared[other] = ("launcher", True, 0x100, bytearray(8))

    def prepare_here():
        key = ("float32", (8, 8), (8, 1), 0, -1, "softmax", False, 0)
        with_out = key + ("float32", (8, 8), (8, 1), 0, 0)  # an out= call's launches
        for k in (key, with_out):
            api._prepared[k] = ("launcher", True, api.stream_key(per_thread), bytearray(8))
        api._watch_thread_stream(kept, rt)
        return key, with_out

    (key, with_out), _ = _in_new_thread(prepare_here)
    assert key not in api._prepared and with_out not in api._prepared and other in api._prepared
    assert [d[:2] for d in rt.drained] == [(0, per_thread)]


@pytest.fixture
def prepared_torch(monkeypatch):
    """api's repeat-call path with torch seen, an empty _prepared, and the current stream 7 on every
    device (torch's reader needs a GPU); CPU tensors stand in for CUDA ones."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    monkeypatch.setattr(api, "_prepared", {})
    monkeypatch.setattr(api, "_TORCH", torch)
    monkeypatch.setattr(api, "_TORCH_TENSOR", torch.Tensor)
    monkeypatch.setattr(api, "_torch_is_compiling", torch.compiler.is_compiling)
    monkeypatch.setattr(api, "_TORCH_FORWARD_AD", torch.autograd.forward_ad)
    monkeypatch.setattr(api, "_current_stream", lambda device: 7)
    return torch


def _keep(key, bound_to=None):
    """A recording launcher kept under key, as _prepare keeps one."""
    launched = []
    api._prepared[key] = (lambda *pointers: launched.append(pointers), True, bound_to, None)
    return launched


def test_an_out_call_replays_the_launches_kept_for_its_and_outs_layout(prepared_torch):
    torch = prepared_torch
    x, out = torch.randn(4, 8), torch.empty(4, 8)
    launched = _keep(api._prepared_key(x, -1, "softmax", False, out))
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


def test_an_out_calls_launches_with_scratch_replay_only_on_their_stream(prepared_torch, monkeypatch):
    torch = prepared_torch
    x, out = torch.randn(4, 8), torch.empty(4, 8)
    launched = _keep(api._prepared_key(x, 1, "log_softmax", False, out), bound_to=api.stream_key(5))
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
    _prepared, device 0 current and stream 7 current on it; returns the list of arrays that the
    stand-in cupy.empty allocated."""
    allocated: list[FakeCupyArray] = []

    class FakeCupy:
        @staticmethod
        def empty(shape, dtype):
            allocated.append(FakeCupyArray(shape, ptr=(2 + len(allocated)) << 20, dtype=dtype))
            return allocated[-1]

    monkeypatch.setattr(api, "_prepared", {})
    monkeypatch.setattr(api, "_CUPY", FakeCupy)
    monkeypatch.setattr(api, "_CUPY_NDARRAY", FakeCupyArray)
    monkeypatch.setattr(api, "_cupy_device", lambda: 0)
    monkeypatch.setattr(api, "_cupy_current_stream", lambda: FakeCupyStream(7))
    return allocated


def test_a_cupy_repeat_call_replays_the_launches_kept_for_its_layout(prepared_cupy):
    import portable_softmax as ps

    x = FakeCupyArray((4, 8))
    assert api._preparable(x, None) and api._preparable(x, FakeCupyArray((4, 8)))
    assert not api._preparable(x, np.empty((4, 8), np.float32))  # an out the full path copies into
    launched = _keep(api._prepared_key(x, -1, "softmax", False))
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
    launched = _keep(api._prepared_key(x, -1, "softmax", False))
    assert api._run_prepared_cupy(x, -1, "softmax", None, False) is None  # cupy would allocate on device 0
    monkeypatch.setattr(api, "_cupy_device", lambda: 1)
    y = api._run_prepared_cupy(x, -1, "softmax", None, False)
    assert launched == [(x.data.ptr, y.data.ptr, 7)]


def test_a_cupy_out_call_replays_only_for_out_laid_out_alike_and_on_its_stream(prepared_cupy, monkeypatch):
    x, out = FakeCupyArray((4, 8)), FakeCupyArray((4, 8), ptr=3 << 20)
    launched = _keep(api._prepared_key(x, 0, "log_softmax", False, out), bound_to=api.stream_key(5))
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
