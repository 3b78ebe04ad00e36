"""softmax and log_softmax over an axis that is sharded across the ranks of a torch.distributed group.

Each rank passes its slice of the tensor (the same shape on every rank except along ``axis``, where
slices may differ in width, down to zero) and gets back its slice of the result, with autograd::

    import torch.distributed as dist
    from portable_softmax import distributed

    dist.init_process_group("nccl")              # "gloo" for CPU tensors; on ROCm "nccl" is RCCL
    logits = lm_head(h)                          # (tokens, vocab / world): this rank's vocabulary slice
    probs = distributed.softmax(logits, axis=-1) # this rank's slice of softmax over the whole vocabulary
    probs.backward(grad)                         # the backward makes one all_reduce

How it works. The pair (m, d) of a row's slice, m = max, d = sum(exp(x - m)), merges with another
by a monoid: (m1, d1) + (m2, d2) = (M, d1 exp(m1 - M) + d2 exp(m2 - M)) with M = max(m1, m2). So the
forward is: each rank takes its slices' pairs; ONE ``all_gather`` of the pairs (2 floats a row a
rank); each rank merges the gathered pairs into the row's (M, D) and finishes its slice,
exp(x - M) / D, or x - M - log D. The backward needs the row sum s = sum(dy * y) (softmax) or
sum(dy) (log_softmax) over the whole axis: ONE ``all_reduce`` of a float64 a row, then
dx = y * (dy - s), or dy - exp(y) * s.

Why an all_gather of pairs, not an all_reduce(MAX) of m then an all_reduce(SUM) of the rescaled d
(torch's ``loss_parallel``; DTensor's softmax on a sharded axis all-gathers the whole tensor instead):

* one collective instead of two: the second all_reduce cannot start before the first has ended
  and the local pass between them (the sum of exp(x - M), which reads x again) has run, so the
  latency is paid twice and x is read three times instead of twice; for the small per-row buffers
  of a softmax, collectives cost latency rather than bandwidth;
* bytes: a rank receives 2 (world - 1) floats a row from the gather, against about
  4 (world - 1) / world from two ring all_reduces of a float a row: the same at 2 ranks, 2x at 4,
  and growing with the group; but the buffers are small (8192 rows at 8 ranks: 448 KiB gathered),
  which keeps the collective's time its latency, and the gather pays that latency once;
* the merge is exact in any order: every rank folds the same gathered pairs in the same order, so
  every rank computes bit-identical (M, D), whatever order the collective delivered them in.

The local passes (the pairs and the normalisation; the gradient's row sums and dx) are the
package's two-pass split kernels, one chunk a row, on rows along the last axis of contiguous CUDA
or ROCm tensors where the package's runtime opens (``PORTABLE_SOFTMAX_SHARDED_LOCAL=torch`` asks
for torch operations instead), and torch operations elsewhere, float16/bfloat16 computed in
float32; the merge of the gathered pairs is torch operations. The gradient's row sums are float64.

Semantics follow the single-GPU call: NaN anywhere in a row makes the row NaN on every rank; a slice
of all -inf on some ranks is fine; a row of all -inf on every rank gives NaN, or with ``safe=True``
0 (softmax) / -inf (log_softmax) and a zero gradient. float16/bfloat16 compute in float32, float64
in float64.

What is checked across ranks, at no extra collective: a header rides in the gathered buffer with
each rank's shape (all dims but ``axis``), ``axis``, dtype, op and ``safe``; after the gather every
rank compares the headers and raises the same ``ValueError`` naming each rank's shape when they
differ (``check=False`` skips reading them: on a GPU the read waits for the gather). Ranks whose
row counts differ send buffers of different sizes, which no header can catch: gloo then aborts the
process and NCCL's result is undefined; run with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (torch then
checks every collective's shapes across ranks at the cost of an extra collective) to find such a
call.

DTensor. A DTensor sharded on ``axis`` (``Shard(axis)`` on one mesh dimension) may be passed
directly: its local tensor runs this path on that mesh dimension's group, and the result is a
DTensor of the same placements. ``torch.distributed.tensor.experimental.register_sharding`` does
not fit: it tells DTensor how to redistribute inputs to an op whose *local* computation is right
as it stands, and softmax on a shard is not; the call for a DTensor is therefore::

    y = distributed.softmax(dt, axis=-1)       # or, by hand, on the local tensor:
    y = DTensor.from_local(distributed.softmax(dt.to_local(), -1, group=dt.device_mesh.get_group(0)),
                           dt.device_mesh, dt.placements, shape=dt.shape, stride=dt.stride())

Example (one process, a group of one):

>>> import os, tempfile, torch, torch.distributed as dist
>>> from portable_softmax import distributed
>>> store = os.path.join(tempfile.mkdtemp(), "store")
>>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
>>> x = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
>>> y = distributed.softmax(x)
>>> torch.allclose(y, torch.softmax(x, -1))
True
>>> y[0, 0].backward()
>>> torch.allclose(x.grad, torch.func.grad(lambda t: torch.softmax(t, -1)[0, 0])(x.detach()))
True
>>> dist.destroy_process_group()
"""

from __future__ import annotations

import zlib
from typing import Any

from . import _sharded
from .layout import normalize_axis

__all__ = ["softmax", "log_softmax"]

Tensor = Any  # torch.Tensor (or a DTensor); torch is imported lazily

_MAGIC = 0x5053_4D58  # marks a header of this module, so a collective of another kind is not read as one
_HEADER_WORDS = 16  # int64 words: magic, op, safe, dtype, ndim, axis, rows, shape crc, cols, 7 dims
_SHOWN_DIMS = 7
_DTYPES = ("float16", "bfloat16", "float32", "float64")
_OPS = ("softmax", "log_softmax")


def softmax(x: Tensor, axis: int = -1, *, group: Any = None, safe: bool = False, check: bool = True) -> Tensor:
    """softmax over ``axis`` of the tensor whose slices along ``axis`` the ranks of ``group`` hold.

    Args:
        x: this rank's slice, a torch tensor (float16, bfloat16, float32 or float64), or a DTensor
            sharded on ``axis``. Every rank's slice has the same shape except along ``axis``.
        axis: the softmax axis (numpy's rule for negative values).
        group: the process group (None: the default group); ignored for a DTensor.
        safe: a row of all -inf on every rank gives 0 instead of NaN.
        check: compare every rank's shape, dtype, op and ``safe`` after the gather (no extra
            collective; on a GPU it waits for the gather).

    Returns:
        this rank's slice of the result, the dtype and shape of ``x``.

    One all_gather of 2 floats a row a rank in the forward, one all_reduce of a float64 a row in the
    backward. See the module's docstring for an example.
    """
    return _call(x, axis, "softmax", group, safe, check)


def log_softmax(x: Tensor, axis: int = -1, *, group: Any = None, safe: bool = False,
                check: bool = True) -> Tensor:
    """log_softmax over a sharded ``axis``; the arguments as :func:`softmax`'s (``safe``: -inf, not NaN).

    >>> import torch
    >>> from portable_softmax import distributed
    >>> distributed.log_softmax(torch.zeros(2, 3), 5)
    Traceback (most recent call last):
    ...
    IndexError: axis 5 is out of bounds for array of dimension 2
    """
    return _call(x, axis, "log_softmax", group, safe, check)


# ---- argument checks --------------------------------------------------------------------------
def _call(x, axis, op: str, group, safe: bool, check: bool):
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"distributed.{op} takes a torch tensor (or DTensor), got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError(f"distributed.{op} needs a tensor with an axis to shard, got a 0-d tensor")
    axis = normalize_axis(axis, x.dim())
    name = str(x.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise TypeError(f"distributed.{op} supports {', '.join(_DTYPES)}; got {name}")
    if not isinstance(safe, bool) or not isinstance(check, bool):
        raise TypeError(f"safe and check must be True or False, got safe={safe!r}, check={check!r}")
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(x, dtensor):
        return _on_dtensor(x, axis, op, safe, check)
    group = _checked_group(x, op, group)
    return _sharded_function().apply(x, axis, op, safe, group, check)


def _checked_group(x, op: str, group):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"distributed.{op} needs torch.distributed initialised "
                           "(torch.distributed.init_process_group) on every rank of the group")
    backend = str(dist.get_backend(group))
    if backend == "nccl" and not x.is_cuda:
        raise ValueError(f"distributed.{op}: the group's backend is nccl, which takes GPU tensors; "
                         f"got a tensor on {x.device} (use a gloo group for CPU tensors)")
    return group


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed support
        return None
    return DTensor


def _on_dtensor(x, axis: int, op: str, safe: bool, check: bool):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh, placements = x.device_mesh, tuple(x.placements)
    sharding = [i for i, p in enumerate(placements) if isinstance(p, Shard) and p.dim == axis]
    partial = any(not isinstance(p, (Shard, Replicate)) for p in placements)  # e.g. Partial sums
    if partial or len(sharding) > 1 or any(type(placements[i]) is not Shard for i in sharding):
        raise ValueError(f"distributed.{op} takes a DTensor sharded on axis {axis} by one mesh dimension "
                         f"(Shard({axis})), others Replicate or Shard of other axes; got placements {placements}")
    local = x.to_local()
    if sharding:
        y = _sharded_function().apply(local, axis, op, safe, mesh.get_group(sharding[0]), check)
    else:  # the axis is whole on every rank: a group of one
        y = _sharded_function().apply(local, axis, op, safe, None, False, True)
    return DTensor.from_local(y, mesh, placements, run_check=False, shape=x.shape, stride=x.stride())


# ---- the forward's gathered buffer: a header, then the (m, d) pairs ---------------------------
def _header(x, axis: int, op: str, safe: bool) -> list[int]:
    rows_shape = tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:])
    rows = 1
    for n in rows_shape:
        rows *= n
    dims = (list(rows_shape) + [-1] * _SHOWN_DIMS)[:_SHOWN_DIMS]
    crc = zlib.crc32(repr(rows_shape).encode())
    dtype = _DTYPES.index(str(x.dtype).removeprefix("torch."))
    return [_MAGIC, _OPS.index(op), int(safe), dtype, x.dim(), axis, rows, crc, x.shape[axis], *dims]


def _described(h: list[int]) -> str:
    """A rank's header in words: its shape with the axis's local width in brackets."""
    ndim, axis = h[4], h[5]
    dims = [str(n) for n in h[9:9 + min(ndim - 1, _SHOWN_DIMS)]]
    if ndim - 1 > _SHOWN_DIMS:
        dims.append("...")
    dims.insert(axis, f"[{h[8]}]")
    return f"({', '.join(dims)}) {_DTYPES[h[3]]} {_OPS[h[1]]} axis={axis} safe={bool(h[2])}"


def _check_headers(headers: list[list[int]], op: str) -> None:
    def key(h):  # every field but the local width of the axis
        return h[:8] + h[9:]

    if any(h[0] != _MAGIC for h in headers):
        raise RuntimeError(f"distributed.{op}: the ranks of the group are not all in the same call "
                           "(a rank's gathered buffer is not this call's)")
    if any(key(h) != key(headers[0]) for h in headers):
        ranks = "; ".join(f"rank {r}: {_described(h)}" for r, h in enumerate(headers))
        raise ValueError(f"distributed.{op}: the ranks' slices must have the same shape except along the "
                         f"axis, and the same axis, dtype, op and safe; got {ranks}")


_headers: dict = {}  # (device, header) -> the header as an int64 tensor on that device
_HEADERS_KEPT = 256


def _device_header(x, axis: int, op: str, safe: bool):
    """The header on x's device, kept per shape: a copy from host memory would wait for the stream."""
    import torch

    words = tuple(_header(x, axis, op, safe))
    key = (x.device, words)
    found = _headers.get(key)
    if found is None:
        if len(_headers) >= _HEADERS_KEPT:
            _headers.clear()
        found = _headers[key] = torch.tensor(words, dtype=torch.int64, device=x.device)
    return found


def _all_gather(out, tensor, group) -> None:
    """torch's all_gather into one tensor (all_gather_single, all_gather_into_tensor before it)."""
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, tensor, group=group)


def _forward(x, axis: int, op: str, safe: bool, group, check: bool, alone: bool = False):
    """This rank's slice of the result, and (M, D) of every row (shape: x's without ``axis``)."""
    import torch
    import torch.distributed as dist

    math = _sharded.local_math(x)
    m, d = math.partials(x, axis)
    if alone:
        return math.finish(x, m, d, op, safe, axis), m
    c = m.dtype
    csize = torch.empty((), dtype=c).element_size()
    rows = m.numel()
    head = _HEADER_WORDS * 8
    nbytes = head + 2 * rows * csize
    buf = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    buf[:head].view(torch.int64).copy_(_device_header(x, axis, op, safe))
    torch.stack((m.reshape(-1), d.reshape(-1)), dim=1, out=buf[head:].view(c).view(rows, 2))
    world = dist.get_world_size(group)
    gathered = torch.empty(world * nbytes, dtype=torch.uint8, device=x.device)
    _all_gather(gathered, buf, group=group)
    gathered = gathered.view(world, nbytes)
    if check:
        _check_headers(gathered[:, :head].cpu().view(torch.int64).tolist(), op)
    pairs = gathered[:, head:].view(c).view(world, rows, 2)
    big, total = math.merge(pairs[..., 0], pairs[..., 1])
    big, total = big.view(m.shape), total.view(m.shape)
    return math.finish(x, big, total, op, safe, axis), big


_FUNCTION = None


def _sharded_function():
    """The autograd function, made on first use (torch is imported lazily)."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _make_function()
    return _FUNCTION


def _make_function():
    import torch
    import torch.distributed as dist

    class ShardedSoftmax(torch.autograd.Function):
        """Forward: one all_gather of (m, d) pairs; backward: one all_reduce of the row sums."""

        @staticmethod
        def forward(ctx, x, axis, op, safe, group, check, alone=False):
            y, big = _forward(x, axis, op, safe, group, check, alone)
            # rows of all -inf everywhere: their output is constant under safe, so their gradient is 0
            empty = (big == float("-inf")) if safe and op == "log_softmax" else None
            ctx.save_for_backward(y, empty)
            ctx.axis, ctx.op, ctx.group, ctx.alone = axis, op, group, alone
            return y

        @staticmethod
        def backward(ctx, dy):
            y, empty = ctx.saved_tensors
            math = _sharded.local_math(y)
            s = math.grad_dot(dy, y, ctx.op, ctx.axis)  # float64 on every rank, whichever math it runs
            if not ctx.alone:
                dist.all_reduce(s, op=dist.ReduceOp.SUM, group=ctx.group)
            dx = math.grad_finish(dy, y, s, ctx.op, ctx.axis, empty)
            return dx, None, None, None, None, None, None

    return ShardedSoftmax
