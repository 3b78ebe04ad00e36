"""One call path, without a GPU: the first call of a layout classifies, plans, builds a launcher in
the launcher cache and replays it; every later call replays it too (forward and gradient), and calls
the cache cannot keep launch once through the runtime. Stand-ins for cupy arrays, their classified
form and a runtime record what each call does."""

from __future__ import annotations

import numpy as np
import pytest
from checks import keep_recording_launcher

import portable_softmax as ps
from portable_softmax import _backward, _probe, api
from portable_softmax._scratch import PER_THREAD_DEFAULT_STREAM
from portable_softmax.planner import DeviceProfile


class Memory:
    def __init__(self, ptr: int, device_id: int):
        self.ptr, self.device_id = ptr, device_id


class FakeCupyArray:
    """What the repeat paths read of a cupy array: dtype, shape, byte strides and its memory."""

    _next = 1

    def __init__(self, shape, dtype="float32", strides=None, ptr=None, device=0):
        self.dtype, self.shape = np.dtype(dtype), tuple(shape)
        self.strides = strides or tuple(int(np.prod(shape[i + 1:])) * self.dtype.itemsize
                                        for i in range(len(shape)))
        if ptr is None:
            FakeCupyArray._next += 1
            ptr = FakeCupyArray._next << 24
        self.data = Memory(ptr, device)


class Classified:
    """A FakeCupyArray as api.classify gives a device array: what the full path reads and calls."""

    on_device, vendor = True, "cuda"
    world: World  # the test's, set by the fixture

    def __init__(self, array: FakeCupyArray):
        self.array = array
        self.device_index = array.data.device_id
        self.dtype = array.dtype.name
        self.shape = array.shape
        self.strides = tuple(s // array.dtype.itemsize for s in array.strides)
        self.ptr = array.data.ptr

    def empty(self, shape):
        return FakeCupyArray(shape, self.array.dtype)

    def scratch(self, nbytes, zeroed=True):
        self.world.scratch.append((nbytes, zeroed))
        buffer = bytearray(nbytes)
        return id(buffer), buffer

    def capturing(self):
        return False

    def stream(self):
        return self.world.stream

    def result(self, y):
        return y

    def fill_empty_rows(self, y, axis, value):
        self.world.filled.append((y, axis, value))

    def copy_into(self, target):
        self.world.copied.append((self.array, target))


class World:
    """The stand-in runtime and what it saw: one-off launches, prepared launchers and their calls."""

    vendor, device_count = "cuda", 1

    def __init__(self):
        self.stream = 7
        self.launched: list[tuple] = []  # one-off launches: (tier, buffers, stream)
        self.prepared: list[tuple] = []  # (tier, pointers)
        self.replayed: list[tuple] = []  # launcher calls
        self.scratch: list[tuple] = []
        self.filled: list[tuple] = []
        self.copied: list[tuple] = []  # (computed apart, out) of outputs copied into out=

    def profile(self, device):
        return DeviceProfile.h100()

    def launch(self, plan, dtype, buffers, stream, device):
        self.launched.append((plan.tier, dict(buffers), stream))

    def prepare(self, plan, dtype, device, buffers=None, pointers=("x", "y")):
        self.prepared.append((plan.tier, pointers))
        return lambda *args: self.replayed.append(args)

    def synchronize_stream(self, device, stream):
        pass


@pytest.fixture
def world(monkeypatch):
    """cupy seen (FakeCupyArray standing in for cupy.ndarray), device 0 current, the stand-in runtime
    behind the vendor 'cuda', and an empty launcher cache."""
    here = World()

    class FakeCupy:
        @staticmethod
        def empty(shape, dtype):
            return FakeCupyArray(shape, dtype)

    def classify(x, writes=False):
        assert isinstance(x, FakeCupyArray), type(x)
        return Classified(x)

    api.launchers.clear()
    monkeypatch.setattr(Classified, "world", here, raising=False)
    monkeypatch.setattr(api, "_CUPY", FakeCupy)
    monkeypatch.setattr(api, "_CUPY_NDARRAY", FakeCupyArray)
    monkeypatch.setattr(api, "_cupy_device", lambda: 0)
    monkeypatch.setattr(api, "_cupy_current_stream", lambda: Memory(here.stream, 0))
    monkeypatch.setattr(api, "classify", classify)
    monkeypatch.setattr(_backward, "classify", classify)
    monkeypatch.setattr(_probe, "runtime", lambda vendor: here)
    yield here
    api.launchers.clear()
    api.scratch_pool.clear()  # the stand-in buffers of one-off launches


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_the_first_call_builds_the_launcher_and_every_call_replays_it(world, op):
    call = getattr(ps, op)
    x = FakeCupyArray((4, 8))
    y = call(x)
    assert world.launched == [] and world.prepared == [("warp", ("x", "y"))]
    assert world.replayed == [(x.data.ptr, y.data.ptr, 7)]
    x2 = FakeCupyArray((4, 8))  # the same layout, other memory: the repeat path
    y2 = call(x2)
    assert len(world.prepared) == 1 and world.replayed[-1] == (x2.data.ptr, y2.data.ptr, 7)
    out = FakeCupyArray((4, 8))  # out= is a key of its own, built once, replayed after
    assert call(x, out=out) is out and call(x2, out=out) is out
    assert len(world.prepared) == 2 and world.replayed[-2:] == [(x.data.ptr, out.data.ptr, 7),
                                                              (x2.data.ptr, out.data.ptr, 7)]
    assert world.launched == [] and len(api.launchers) == 2


def test_safe_log_softmax_launches_once_and_keeps_nothing(world):
    """Its rows of all -inf are filled after the launch: a replay would skip that; so every call
    takes the full path (as the repeat path never finds its key)."""
    x = FakeCupyArray((4, 8))
    for _ in range(2):
        y = ps.log_softmax(x, safe=True)
    assert [t for t, _, _ in world.launched] == ["warp", "warp"] and world.prepared == []
    assert len(world.filled) == 2 and world.filled[-1] == (y, 1, -np.inf) and len(api.launchers) == 0
    assert ps.softmax(x, safe=True) is not None and world.prepared == [("warp", ("x", "y"))]  # kept


def test_an_entry_with_scratch_replays_only_on_the_stream_it_was_built_on(world):
    """Other streams launch once, with the pool's scratch of their own stream."""
    x = FakeCupyArray((8, 1 << 20))
    ps.softmax(x)
    assert world.prepared == [("cached", ("x", "y"))] and world.scratch == [(8448, True)]  # zeroed once
    ((_, _, bound_to, _, _, _),) = api.launchers.entries.values()
    assert bound_to == 7
    ps.softmax(x)
    assert len(world.replayed) == 2 and world.launched == []
    world.stream = 5
    ps.softmax(x)
    assert len(world.replayed) == 2 and [(t, s) for t, _, s in world.launched] == [("cached", 5)]
    assert 5 in api.scratch_pool.held("cuda", 0)


def test_the_per_thread_default_streams_entry_is_its_threads(world):
    world.stream = PER_THREAD_DEFAULT_STREAM
    ps.softmax(FakeCupyArray((8, 1 << 20)))
    ((_, _, bound_to, _, _, _),) = api.launchers.entries.values()
    assert bound_to == api.stream_key(PER_THREAD_DEFAULT_STREAM) != PER_THREAD_DEFAULT_STREAM


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_a_gradients_first_call_builds_a_three_pointer_launcher_that_repeat_calls_replay(world, op):
    backward = getattr(ps, f"{op}_backward")
    dy, y = FakeCupyArray((4, 8)), FakeCupyArray((4, 8))
    dx = backward(dy, y)
    assert world.launched == [] and world.prepared == [("warp", ("dy", "y", "dx"))]
    assert world.replayed == [(dy.data.ptr, y.data.ptr, dx.data.ptr, 7)]
    dy2, y2 = FakeCupyArray((4, 8)), FakeCupyArray((4, 8))
    dx2 = backward(dy2, y2)
    assert len(world.prepared) == 1 and world.replayed[-1] == (dy2.data.ptr, y2.data.ptr, dx2.data.ptr, 7)
    out = FakeCupyArray((4, 8))
    assert backward(dy, y, out=out) is out and backward(dy2, y2, out=out) is out
    assert len(world.prepared) == 2 and world.replayed[-1] == (dy2.data.ptr, y2.data.ptr, out.data.ptr, 7)
    # a forward of the same layout is a key of its own
    ps.softmax(dy)
    assert world.prepared[-1] == ("warp", ("x", "y")) and len(api.launchers) == 3


def test_a_gradient_call_that_differs_in_what_the_plan_or_the_checks_read_misses(world):
    dy, y = FakeCupyArray((4, 8)), FakeCupyArray((4, 8))
    ps.softmax_backward(dy, y)
    key = _backward._repeat_key(dy, y, -1, "softmax")
    assert key in api.launchers and len(key) == 12
    for other_y in (FakeCupyArray((4, 8), strides=(64, 4)),  # rows 16 apart
                    FakeCupyArray((4, 8), ptr=(9 << 24) + 4),  # 4 bytes past a 16-byte boundary
                    FakeCupyArray((4, 8), dtype="float64"),
                    FakeCupyArray((8, 4)),
                    FakeCupyArray((4, 8), device=1)):
        assert _backward._repeat_cupy(dy, other_y, -1, "softmax", None) is None, vars(other_y)
    assert _backward._repeat_cupy(dy, y, 1, "softmax", None) is None  # keyed by the axis as written
    assert _backward._repeat_cupy(dy, y, -1, "log_softmax", None) is None
    assert _backward._repeat_cupy(dy, np.empty((4, 8), np.float32), -1, "softmax", None) is None
    with pytest.raises(TypeError, match="dy and y must have one dtype"):  # the full path's check, unchanged
        ps.softmax_backward(dy, FakeCupyArray((4, 8), dtype="float64"))
    with pytest.raises(ValueError, match="dy and y must have one shape"):
        ps.softmax_backward(dy, FakeCupyArray((8, 4)))


def test_a_gradients_scratch_is_its_entrys_own_and_bound_to_its_stream(world):
    dy, y = FakeCupyArray((1, 1 << 22)), FakeCupyArray((1, 1 << 22))
    ps.softmax_backward(dy, y)
    assert world.prepared == [("split", ("dy", "y", "dx"))] and world.scratch == [(16384, False)]
    world.stream = 5
    ps.softmax_backward(dy, y)
    assert len(world.replayed) == 1 and [(t, s) for t, b, s in world.launched] == [("split", 5)]
    assert set(world.launched[0][1]) == {"dy", "y", "dx", "sums"}


def test_the_repeat_paths_keys_are_the_key_builders(world):
    """The repeat paths build their keys inline; they find what the full path kept under the key
    builders' keys (forward: api._prepared_key, gradient: _backward._repeat_key)."""
    x, out = FakeCupyArray((4, 8), strides=(64, 4)), FakeCupyArray((4, 8))
    ps.softmax(x, 0, out=out)
    assert list(api.launchers.entries) == [api._prepared_key(x, 0, "softmax", False, out)]
    api.launchers.clear()
    ps.log_softmax_backward(x, out, 0, out=FakeCupyArray((4, 8), ptr=3 << 24))
    assert list(api.launchers.entries) == [_backward._repeat_key(x, out, 0, "log_softmax",
                                                                 FakeCupyArray((4, 8), ptr=3 << 24))]


def test_a_torch_gradients_repeat_call_replays_the_launcher_kept_for_its_layouts(torch_repeat_path, monkeypatch):
    torch = torch_repeat_path
    dy, y = torch.randn(4, 8), torch.randn(4, 8)
    launched = keep_recording_launcher(_backward._repeat_key(dy, y, -1, "softmax"))
    dx = ps.softmax_backward(dy, y)
    assert dx.shape == (4, 8) and dx.dtype == dy.dtype and dx.is_contiguous()
    assert launched == [(dy.data_ptr(), y.data_ptr(), dx.data_ptr(), 7)]
    out = torch.empty(4, 8)
    with_out = keep_recording_launcher(_backward._repeat_key(dy, y, -1, "softmax", out), bound_to=5)
    assert _backward._repeat_torch(dy, y, -1, "softmax", out) is None  # bound to stream 5, the current is 7
    monkeypatch.setattr(api, "_current_stream", lambda device: 5)
    assert ps.softmax_backward(dy, y, out=out) is out and with_out == [(dy.data_ptr(), y.data_ptr(), out.data_ptr(), 5)]
    # what the full path would check or plan again: not these launchers
    for other_y in (torch.randn(8, 4).t(), torch.randn(4, 9)[:, :8], torch.randn(33)[1:].view(4, 8),
                    torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 8).requires_grad_(), np.ones((4, 8))):
        assert _backward._repeat_torch(dy, other_y, -1, "softmax", None) is None, other_y
    assert _backward._repeat_torch(dy, y, 1, "softmax", None) is None  # keyed by the axis as written
    assert _backward._repeat_torch(dy, y, -1, "log_softmax", None) is None
    assert _backward._repeat_torch(dy.requires_grad_(), y, -1, "softmax", None) is None
    assert len(launched) == 1


def test_a_torch_gradient_of_a_transposed_dy_gets_a_contiguous_dx(torch_repeat_path):
    """A non-contiguous dy's entry (contiguous False) allocates the C-contiguous dx it was planned for."""
    torch = torch_repeat_path
    dy, y = torch.randn(8, 4).t(), torch.randn(4, 8)
    launched = keep_recording_launcher(_backward._repeat_key(dy, y, -1, "log_softmax"), contiguous=False)
    dx = ps.log_softmax_backward(dy, y)
    assert dx.is_contiguous() and launched == [(dy.data_ptr(), y.data_ptr(), dx.data_ptr(), 7)]


# ---- out= sharing bytes with an input ------------------------------------------------------------
def test_an_out_that_overlaps_its_input_partly_is_computed_apart_and_copied_in(world):
    """out one row past x shares three of x's rows: writing it directly would change rows of x
    still to be read. It is computed into an array of its own and copied in, and nothing is kept."""
    x = FakeCupyArray((4, 8), ptr=1 << 30)
    out = FakeCupyArray((4, 8), ptr=(1 << 30) + 32)
    assert ps.softmax(x, out=out) is out
    ((tier, buffers, _),) = world.launched
    assert buffers["x"] == x.data.ptr and buffers["y"] not in (x.data.ptr, out.data.ptr)
    assert [b for _, b in world.copied] == [out] and world.prepared == [] and len(api.launchers) == 0
    # the same memory in another layout (rows 8 apart read, 16 apart written): apart as well
    wide = FakeCupyArray((4, 8), strides=(64, 4), ptr=x.data.ptr)
    assert ps.log_softmax(x, out=wide) is wide and [b for _, b in world.copied] == [out, wide]


def test_in_place_is_written_directly_and_kept(world):
    x = FakeCupyArray((4, 8))
    assert ps.softmax(x, out=x) is x and ps.softmax(x, out=x) is x
    assert world.copied == [] and world.prepared == [("warp", ("x", "y"))]
    assert world.replayed == [(x.data.ptr, x.data.ptr, 7)] * 2


def test_a_repeat_call_whose_out_overlaps_its_input_takes_the_full_path(world):
    """The launcher kept for (x, out) of one layout is not replayed for a later call of the same
    layouts whose out shares bytes with x: the key holds layouts, not where out lies."""
    x, out = FakeCupyArray((4, 8), ptr=1 << 30), FakeCupyArray((4, 8), ptr=2 << 30)
    ps.softmax(x, out=out)
    assert len(world.prepared) == 1 and world.replayed == [(x.data.ptr, out.data.ptr, 7)]
    for shift in (32, -32, 112, -112):  # a row after or before; the last row on the first and back
        near = FakeCupyArray((4, 8), ptr=x.data.ptr + shift)
        assert api._run_prepared_cupy(x, -1, "softmax", near, False) is None, shift
        assert ps.softmax(x, out=near) is near and world.copied[-1][1] is near
    far = FakeCupyArray((4, 8), ptr=x.data.ptr + 128)  # just past x's last byte: replayed
    assert ps.softmax(x, out=far) is far and world.replayed[-1] == (x.data.ptr, far.data.ptr, 7)
    assert len(world.prepared) == 1 and len(world.copied) == 4


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_a_gradients_out_may_be_dy_or_y_but_not_partly_either(world, op):
    backward = getattr(ps, f"{op}_backward")
    dy, y = FakeCupyArray((4, 8), ptr=1 << 30), FakeCupyArray((4, 8), ptr=2 << 30)
    assert backward(dy, y, out=dy) is dy and backward(dy, y, out=y) is y  # in place: direct, one launcher
    assert world.copied == [] and world.replayed == [(dy.data.ptr, y.data.ptr, dy.data.ptr, 7),
                                                     (dy.data.ptr, y.data.ptr, y.data.ptr, 7)]
    for base in (dy, y):
        near = FakeCupyArray((4, 8), ptr=base.data.ptr + 32)
        assert _backward._repeat_cupy(dy, y, -1, op, near) is None
        assert backward(dy, y, out=near) is near and world.copied[-1][1] is near
    assert len(world.prepared) == 1 and len(world.launched) == 2  # one key: dy, y and out of one layout


def _element_bytes(ptr, shape, strides, size):
    return {ptr + sum(i * s for i, s in zip(index, strides)) + b
            for index in np.ndindex(*shape) for b in range(size)}


def test_write_windows_find_every_shared_byte():
    """Against the bytes themselves, over small layouts with padded, negative and zero-length
    dims: an out that shares a byte with the input, other than being the input itself, is always
    found; an out clear of the input's first and last bytes never is."""
    from portable_softmax._arrays import byte_span, overlaps_partly

    class View:
        def __init__(self, ptr, shape, strides):
            self.ptr, self.shape, self.strides, self.dtype = ptr, shape, strides, "float32"

    rng = np.random.default_rng(5)
    found = 0
    for _ in range(3000):
        shape = tuple(int(n) for n in rng.integers(1, 4, size=int(rng.integers(1, 4))))
        layouts = [tuple(int(s) for s in rng.choice([-9, -4, -3, -1, 1, 2, 3, 4, 9], size=len(shape)))
                   for _ in range(2)]
        read = View(4096, shape, layouts[0])
        written = View(4096 + 4 * int(rng.integers(-20, 21)), shape, layouts[rng.integers(2)])
        shared = _element_bytes(read.ptr, shape, read.strides, 4) & _element_bytes(
            written.ptr, shape, written.strides, 4)
        itself = written.ptr == read.ptr and all(  # the same elements: strides of 1-long dims aside
            a == b for n, a, b in zip(shape, read.strides, written.strides) if n > 1)
        low, high = byte_span(shape, read.strides, 4)
        w_low, w_high = byte_span(shape, written.strides, 4)
        clear = written.ptr + w_low >= read.ptr + high or written.ptr + w_high <= read.ptr + low
        if shared and not itself:
            assert overlaps_partly(read, written), (shape, read.strides, written.ptr - read.ptr, written.strides)
            found += 1
        if clear or itself:
            assert not overlaps_partly(read, written), (shape, read.strides, written.ptr - read.ptr)
    assert found > 200  # the sample holds many shared layouts
