"""Reading the caller's array cheaply, and making results of the caller's type.

Each adapter answers: where the data lives (host, or a GPU of a vendor), its
pointer, shape, element strides, dtype name and the caller's current stream,
and how to allocate an output or scratch of the same library on the same device.
Nothing here copies or wraps the caller's array on the hot path.
"""

from __future__ import annotations

import sys

import numpy as np

from ._dtypes import host_dtype, itemsize, storage_name

#: DLPack device types
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_ROCM = 1, 2, 3, 10
#: Python values taken as numpy would take them (array_like): numbers and nested lists / tuples
ARRAY_LIKE = (list, tuple, int, float, complex)
MASKED_ARRAY_ERROR = ("numpy masked arrays are not supported: the mask would be ignored. Pass "
                      "x.filled(-numpy.inf) to give masked elements zero weight, or x.data to use every element")


def array_like(x) -> np.ndarray | np.generic:
    """A Python number or (nested) list as numpy: a float64 scalar or array where numpy would make
    integers or bools of it (as scipy.special.softmax takes them); complex is refused later."""
    try:
        a = np.asarray(x)
    except ValueError as e:  # ragged lists
        raise TypeError(f"cannot make an array of this {type(x).__name__}: {e}") from None
    if a.dtype.kind in "iub":
        a = a.astype(np.float64)
    elif a.dtype.kind not in "fc":
        raise TypeError(f"expected an array or numbers, got a {type(x).__name__} of {a.dtype} "
                        f"(as numpy reads it); supported: float32, float16, bfloat16, float64 arrays")
    return a[()] if a.ndim == 0 else a


def cast(x, name: str):
    """``x`` in dtype ``name`` (the ``dtype=`` keyword): torch's .to (autograd goes through it),
    the others' astype; a bare DLPack producer comes back as numpy or its own type."""
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        import torch

        return x.to(getattr(torch, name))
    if hasattr(x, "astype"):
        return x.astype(host_dtype(name) if module != "cupy" else name)
    src = classify(x)
    return src.wrap(src.array.astype(host_dtype(name)))


class Host:
    """A numpy array (torch CPU tensors and host DLPack producers arrive as one)."""

    on_device = False

    def __init__(self, array: np.ndarray, wrap=None):
        self.array = array
        self.wrap = wrap or (lambda a: a)
        dtype = array.dtype
        # an out= of the other byte order is written with a conversion; inputs are converted before
        self.dtype = storage_name(dtype if dtype.isnative else dtype.newbyteorder("="))
        self.shape = array.shape


class DeviceArray:
    """A GPU array of cupy or torch, read without wrapping it."""

    on_device = True
    vendor: str  # "cuda" | "hip"
    device_index: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    ptr: int

    def empty(self, shape):  # an output of the caller's library, C-contiguous
        raise NotImplementedError

    def scratch(self, nbytes: int, zeroed: bool = True):  # (pointer, keep-alive object) of device memory
        raise NotImplementedError

    def capturing(self) -> bool:  # whether the current stream is capturing a graph
        raise NotImplementedError

    def stream(self) -> int:
        raise NotImplementedError

    def contiguous(self) -> DeviceArray:
        raise NotImplementedError

    def copy_into(self, target) -> None:  # target[...] = self
        raise NotImplementedError

    def result(self, y):
        return y

    def fill_empty_rows(self, y, axis: int, value: float) -> None:
        """Set y's rows (along ``axis``) where this input is all -inf to ``value``, on its stream."""
        raise NotImplementedError


def torch_current_stream(torch, device_index: int) -> int:
    """torch's current stream on a device, as a raw handle (no Stream object per call)."""
    return torch_stream_reader(torch)(device_index)


def torch_stream_reader(torch):
    """device_index -> torch's current raw stream handle on that device, as cheap as torch has it."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device_index: torch.cuda.current_stream(device_index).cuda_stream


class TorchDevice(DeviceArray):
    def __init__(self, t):
        import torch

        self.torch, self.array = torch, t
        self.vendor = "hip" if torch.version.hip else "cuda"
        self.device_index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        self.dtype = storage_name(t.dtype)
        self.shape = tuple(t.shape)
        self.strides = tuple(t.stride())
        self.ptr = t.data_ptr()

    def empty(self, shape):
        return self.torch.empty(shape, dtype=self.array.dtype, device=self.array.device)

    def scratch(self, nbytes, zeroed=True):
        make = self.torch.zeros if zeroed else self.torch.empty
        buf = make(nbytes, dtype=self.torch.uint8, device=self.array.device)
        return buf.data_ptr(), buf

    def capturing(self):
        return self.torch.cuda.is_current_stream_capturing()

    def stream(self):
        return torch_current_stream(self.torch, self.device_index)

    def contiguous(self):
        return TorchDevice(self.array.contiguous())

    def copy_into(self, target):
        target.copy_(self.array)

    def fill_empty_rows(self, y, axis, value):
        y.masked_fill_(self.torch.isneginf(self.array).all(axis, keepdim=True), value)


class CupyDevice(DeviceArray):
    def __init__(self, a, wrap=None):
        import cupy

        self.cupy, self.array = cupy, a
        self.vendor = "hip" if cupy.cuda.runtime.is_hip else "cuda"
        self.device_index = a.device.id
        self.dtype = storage_name(a.dtype)
        self.shape = a.shape
        self.strides = tuple(s // a.itemsize for s in a.strides)
        self.ptr = a.data.ptr
        self.wrap = wrap

    def empty(self, shape):
        with self.cupy.cuda.Device(self.device_index):
            return self.cupy.empty(shape, dtype=self.array.dtype)

    def scratch(self, nbytes, zeroed=True):
        with self.cupy.cuda.Device(self.device_index):
            buf = (self.cupy.zeros if zeroed else self.cupy.empty)(nbytes, dtype=self.cupy.uint8)
        return buf.data.ptr, buf

    def capturing(self):
        with self.cupy.cuda.Device(self.device_index):
            stream = self.cupy.cuda.get_current_stream()
        is_capturing = getattr(stream, "is_capturing", None)  # CuPy 10 and newer
        return bool(is_capturing()) if is_capturing is not None else False

    def stream(self):
        return self.cupy.cuda.get_current_stream(self.device_index).ptr

    def contiguous(self):
        with self.cupy.cuda.Device(self.device_index):
            return CupyDevice(self.cupy.ascontiguousarray(self.array), self.wrap)

    def copy_into(self, target):
        target[...] = self.array

    def fill_empty_rows(self, y, axis, value):
        with self.cupy.cuda.Device(self.device_index):
            self.cupy.copyto(y, value, where=self.cupy.isneginf(self.array).all(axis=axis, keepdims=True))

    def result(self, y):
        return self.wrap(y) if self.wrap else y


def _namespace_of(x):
    ns = getattr(x, "__array_namespace__", None)
    return ns() if ns else sys.modules.get(type(x).__module__.split(".")[0])


def classify(x, writes: bool = False) -> Host | DeviceArray:
    """The adapter for ``x``; raises TypeError for what is not an array. A numpy input of the other
    byte order is converted (a copy); one written into (``writes``, an out=) is kept as it is."""
    if isinstance(x, np.ndarray):
        if type(x) is not np.ndarray and isinstance(x, np.ma.MaskedArray):
            raise TypeError(MASKED_ARRAY_ERROR)
        if not writes and not x.dtype.isnative and x.dtype.kind == "f":
            x = x.astype(x.dtype.newbyteorder("="))
        return Host(x)
    if isinstance(x, (np.generic,)):
        return Host(np.asarray(x), wrap=lambda a: a[()])
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        if x.device.type == "cpu":
            return _torch_host(x)
        if x.device.type == "cuda":
            return TorchDevice(x)
        raise TypeError(f"torch tensors on {x.device.type} are not supported; use a CPU or CUDA/ROCm tensor")
    if module == "cupy":
        return CupyDevice(x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _from_dlpack(x)
    if isinstance(x, ARRAY_LIKE):
        return Host(np.asarray(array_like(x)), wrap=lambda a: a if isinstance(x, (list, tuple)) else a[()])
    raise TypeError(
        f"expected an array (numpy, cupy, torch, or a __dlpack__ producer) or numbers, got {type(x).__name__}"
    )


def _torch_host(t) -> Host:
    import torch

    name = storage_name(t.dtype)
    if name == "bfloat16":  # numpy has no bfloat16: share the bits through ml_dtypes
        arr = t.detach().view(torch.int16).numpy().view(host_dtype("bfloat16"))
        return Host(arr, wrap=lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16))
    return Host(t.detach().numpy(), wrap=torch.from_numpy)


def _from_dlpack(x) -> Host | DeviceArray:
    dev_type, _ = x.__dlpack_device__()
    xp = _namespace_of(x)
    if dev_type in (KDL_CPU, KDL_CUDA_HOST):
        host = _host_from_dlpack(x)
        # back to the producer's library; numpy where it names none that can take it
        back = getattr(xp, "asarray", None) or getattr(xp, "from_dlpack", None)
        return Host(host, wrap=back)
    if dev_type in (KDL_CUDA, KDL_ROCM):
        import cupy

        arr = cupy.from_dlpack(x)
        back = getattr(xp, "from_dlpack", None)
        return CupyDevice(arr, wrap=back)
    raise TypeError(f"DLPack device type {dev_type} is not supported (CPU, CUDA and ROCm are)")


def _host_from_dlpack(x) -> np.ndarray:
    """A host DLPack producer as numpy, zero-copy. numpy imports no bfloat16 over DLPack; a producer
    that also has ``__array__`` (JAX, ...) gives its bfloat16 as ml_dtypes' instead."""
    try:
        return np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        if hasattr(x, "__array__"):
            return np.asarray(x)  # its dtype is checked with every input's
        raise TypeError(f"numpy cannot import this {type(x).__name__} over DLPack ({e}); "
                        "pass a numpy, torch or cupy array instead") from e


def host_view(a: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """shape and element strides of a numpy array."""
    return a.shape, tuple(s // a.itemsize for s in a.strides)


def element_misalign(ptr: int, dtype: str) -> int:
    size = itemsize(dtype)
    return (ptr // size) % (16 // size)


def byte_span(shape: tuple[int, ...], strides: tuple[int, ...], size: int) -> tuple[int, int]:
    """The bytes a strided array's elements take, as offsets [low, high) from its pointer."""
    low = high = 0
    for n, stride in zip(shape, strides):
        reach = (n - 1) * stride * size
        if reach < 0:
            low += reach
        else:
            high += reach
    return low, high + size


def write_window(read: DeviceArray, written: DeviceArray) -> tuple[int, int, bool]:
    """Where ``written`` may start, relative to ``read``'s pointer, and share bytes with it:
    ``(low, high, same)`` says they share bytes when ``low < written.ptr - read.ptr < high``, and
    that at offset 0 ``written`` is ``read`` itself (the same elements in the same layout) where
    ``same``. Arrays of one shape and dtype; a window depends on their layouts only, so the
    repeat-call paths keep it with the launcher of those layouts.

    >>> class A:  # 2 rows of 4 float32 elements, rows 4 apart
    ...     shape, strides, dtype = (2, 4), (4, 1), "float32"
    >>> write_window(A(), A())
    (-32, 32, True)
    """
    size = itemsize(read.dtype)
    read_low, read_high = byte_span(read.shape, read.strides, size)
    low, high = byte_span(written.shape, written.strides, size)
    same = all(a == b for n, a, b in zip(read.shape, read.strides, written.strides) if n > 1)
    return read_low - high, read_high - low, same


def shares_bytes(window: tuple[int, int, bool], delta: int) -> bool:
    """Whether an output ``delta`` bytes past an input's pointer shares bytes with it without being
    it, by the input's `write_window` (the repeat-call paths make this test inline)."""
    low, high, same = window
    return low < delta < high and (delta != 0 or not same)


def overlaps_partly(read: DeviceArray, written: DeviceArray) -> bool:
    """Whether writing ``written`` could change elements of ``read`` other than its own (a view
    that shares bytes with the input but is not the input itself): such an output is computed
    apart and copied in. Writing over the input itself (in place) is allowed."""
    return shares_bytes(write_window(read, written), written.ptr - read.ptr)
