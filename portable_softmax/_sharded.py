"""The local math of a softmax whose axis is sharded across ranks.

A rank holds a slice of every row. The whole computation is five local steps around two
collectives (``distributed`` does the collectives):

* ``partials(x, axis)``: the (m, d) pair of each row's local slice, m = max, d = sum(exp(x - m));
* ``merge(m, d)``: the pairs of every rank (stacked on a leading rank axis) folded into the row's
  (M, D) by the monoid (m1, d1) + (m2, d2) = (M, d1 exp(m1 - M) + d2 exp(m2 - M)), M = max(m1, m2);
* ``finish(x, M, D, op, safe, axis)``: exp(x - M) / D, or x - M - log D;
* ``grad_dot(dy, y, op, axis)``: the local part of the backward's row sum, sum(dy * y) for
  softmax, sum(dy) for log_softmax, in float64 whatever the dtype (the collective between ranks
  must see the same dtype whichever implementation each rank runs);
* ``grad_finish(dy, y, s, op, axis, empty=None)``: y * (dy - s), or dy - exp(y) * s, given the
  row's full sum; 0 on the rows of the boolean mask ``empty`` (a safe log_softmax's rows of all
  -inf, whose output is a constant).

``TorchMath`` computes each step with torch operations, float16/bfloat16 in float32 and float64 in
float64 (the gradient's row sums accumulated in float64); it runs wherever torch does. Another
implementation (the package's kernels) only has to provide the same five methods.

An empty local slice gives the monoid's identity (-inf, 0), and a slice of all -inf the same, so
neither changes the merge. NaN in a slice gives m = NaN, which the merge carries into every rank's
row; +inf gives d = NaN (exp(inf - inf)), as torch.softmax turns +inf into NaN.

>>> import torch
>>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
>>> left, right = x[:, :1], x[:, 1:]
>>> m, d = (torch.stack(p) for p in zip(TORCH.partials(left, 1), TORCH.partials(right, 1)))
>>> M, D = TORCH.merge(m, d)
>>> torch.allclose(TORCH.finish(right, M, D, "softmax", False, 1), torch.softmax(x, 1)[:, 1:])
True
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

Tensor = Any  # torch.Tensor; torch is imported lazily


def compute_dtype(dtype):
    """float64 stays float64; float32, float16 and bfloat16 compute in float32."""
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


class LocalMath(Protocol):
    """The five local steps of a sharded softmax (see the module's docstring)."""

    def partials(self, x: Tensor, axis: int) -> tuple[Tensor, Tensor]: ...

    def merge(self, m: Tensor, d: Tensor) -> tuple[Tensor, Tensor]: ...

    def finish(self, x: Tensor, m: Tensor, d: Tensor, op: str, safe: bool, axis: int) -> Tensor: ...

    def grad_dot(self, dy: Tensor, y: Tensor, op: str, axis: int) -> Tensor: ...

    def grad_finish(self, dy: Tensor, y: Tensor, s: Tensor, op: str, axis: int,
                    empty: Tensor | None = None) -> Tensor: ...


def _without_neg_inf(m: Tensor) -> Tensor:
    """m with -inf replaced by 0: the shift of a row whose values are all -inf (exp(-inf - 0) = 0
    where exp(-inf - -inf) would be NaN)."""
    return m.masked_fill(m == float("-inf"), 0.0)


def _fresh(t: Tensor, dtype) -> Tensor:
    """t in ``dtype``, in a new tensor that in-place operations may change (never t itself)."""
    return t.to(dtype, copy=True)


class TorchMath:
    """The local steps as torch operations (any device, any float dtype)."""

    def partials(self, x: Tensor, axis: int) -> tuple[Tensor, Tensor]:
        import torch

        c = compute_dtype(x.dtype)
        if x.shape[axis] == 0:  # amax refuses an empty axis; the identity (-inf, 0) is the answer
            shape = x.shape[:axis] + x.shape[axis + 1:]
            return (torch.full(shape, float("-inf"), dtype=c, device=x.device),
                    torch.zeros(shape, dtype=c, device=x.device))
        m = torch.amax(x, dim=axis).to(c)  # exact in the input dtype; NaN propagates
        shift = _without_neg_inf(m).unsqueeze(axis)
        d = (x - shift).exp_().sum(dim=axis)  # x - shift is in the compute dtype (type promotion)
        return m, d

    def merge(self, m: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
        import torch

        big = torch.amax(m, dim=0)
        total = (d * torch.exp(m - _without_neg_inf(big))).sum(dim=0)
        return big, total

    def finish(self, x: Tensor, m: Tensor, d: Tensor, op: str, safe: bool, axis: int) -> Tensor:
        import torch

        mk = m.unsqueeze(axis)
        # one shift, M + log D: exp(x - M) / D = exp(x - (M + log D)); an all -inf row (M = -inf,
        # D = 0) gets -inf - -inf = NaN, a NaN row NaN
        y = x - (mk + torch.log(d.unsqueeze(axis)))  # in the compute dtype (type promotion)
        if op == "softmax":
            y = y.exp_()
        if safe:  # rows of all -inf everywhere (M = -inf): 0, or -inf for log_softmax
            y = y.masked_fill(mk == float("-inf"), 0.0 if op == "softmax" else float("-inf"))
        return y.to(x.dtype)

    def grad_dot(self, dy: Tensor, y: Tensor, op: str, axis: int) -> Tensor:
        import torch

        c = compute_dtype(y.dtype)
        if op == "softmax":  # the products in the compute dtype, their sum in float64 (as the kernels)
            return _fresh(dy, c).mul_(y).sum(dim=axis, dtype=torch.float64)
        # NaN in y makes the row's sum NaN, and so its whole dx (the sum holds no y to carry it)
        return dy.sum(dim=axis, dtype=torch.float64).masked_fill_(y.isnan().any(dim=axis), float("nan"))

    def grad_finish(self, dy: Tensor, y: Tensor, s: Tensor, op: str, axis: int,
                    empty: Tensor | None = None) -> Tensor:
        import torch

        c = compute_dtype(y.dtype)
        sk = s.to(c).unsqueeze(axis)
        if op == "softmax":
            dx = (dy - sk).mul_(y)  # dy - s is in the compute dtype (type promotion)
        else:
            dx = torch.sub(dy, _fresh(y, c).exp_().mul_(sk))
        if empty is not None:
            dx.masked_fill_(empty.unsqueeze(axis), 0.0)
        return dx.to(y.dtype)


TORCH = TorchMath()


@functools.lru_cache(maxsize=512)
def _passes(planner, problem, profile) -> tuple:
    """(chunks, first pass, second pass) of a two-pass plan, each pass a Plan of its own (the
    collective runs between them), kept per problem: a repeat call plans nothing. ``chunks``: the
    chunks of a row (the row split) or of a position's axis (the strided passes) the first pass
    writes a pair for."""
    from .planner import Plan

    both = planner(problem, profile)
    return (both.notes["chunks"], *(Plan(both.tier, (step,), scratch_zeroed=False) for step in both.launches))


@dataclass(frozen=True)
class _Passes:
    """A two-pass plan's passes over an (outer, axis, inner) view (rows: inner 1): the first writes a
    pair for each of ``chunks`` chunks of each position, as a contiguous (outer, chunks, inner) array;
    the second takes one pair a position (the row split: a pair for each chunk, the row's pair as its
    first chunk's and the monoid's identity as the others')."""

    outer: int
    inner: int
    split: bool
    chunks: int
    first: Any
    second: Any


def _layout(t: Tensor, axis: int):
    """The kernels' view of tensor ``t`` reduced along ``axis`` (layout.Rows or layout.Strided), or
    None where its dtype is not the kernels', it is empty, or its dimensions do not collapse."""
    from ._dtypes import SUPPORTED
    from .layout import describe

    if t.numel() == 0 or _dtype(t) not in SUPPORTED:
        return None
    return describe(tuple(t.shape), tuple(t.stride()), axis)


def _collapsed(t: Tensor, axis: int) -> Tensor:
    """t, or a contiguous copy of it where it has the kernels' dtype but its dimensions collapse to
    none of their layouts (a permuted view's, say): the copy costs one read and one write of t, which
    torch operations in the kernels' place would take several of."""
    if t.is_contiguous():  # every step's common case, and always a layout of the kernels
        return t
    from ._dtypes import SUPPORTED
    from .layout import describe

    if t.numel() == 0 or _dtype(t) not in SUPPORTED or describe(tuple(t.shape), tuple(t.stride()), axis):
        return t
    return t.contiguous()


def _layouts(tensors, axis: int) -> list | None:
    """The kernels' views of ``tensors`` (_layout), all of one kind: where some are rows and others
    not, every one as a strided view (rows as an axis of inner size 1); None where one has none."""
    from .layout import Rows, Strided

    layouts = [_layout(t, axis) for t in tensors]
    if None in layouts:
        return None
    if len({type(lay) for lay in layouts}) > 1:
        layouts = [Strided(lay.rows, lay.cols, 1, (lay.row_stride, 1, 1)) if isinstance(lay, Rows) else lay
                   for lay in layouts]
    return layouts


def _reduced_shape(t: Tensor, axis: int) -> tuple:
    return tuple(t.shape[:axis]) + tuple(t.shape[axis + 1:])


def _dtype(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class KernelMath(TorchMath):
    """The local steps by the package's kernels, on any tensor of their dtypes (the merge of the
    gathered pairs, and empty tensors and others, as TorchMath): rows along the axis take the rows
    regime's passes apart where a warp holds them, else the row split's two passes, other axes the
    strided tiers' passes apart; a view whose dimensions collapse to none of those layouts is copied
    contiguous first.

    Both take their launches from the planners' ``plan_split_passes`` / ``plan_strided_passes``. The
    row split cuts a row into one chunk where the rows fill the device, several where they are few
    (their chunks' results merged here before the collective); its second pass is handed the row's
    combined result as the row's first chunk's and the monoid's identity as the others', which merge
    back into it exactly. The strided passes cut a position's axis into chunks where its positions
    are too few to fill the device (merged here too); their second pass takes a pair a position:
    position (o, i) of the (outer, inner) view at o * inner + i, the order of the reduced shape's
    contiguous tensor.

    Forward: the first pass (``ps_split_partials_*``, ``ps_strided*_partials_*``) writes each chunk's
    or position's (m, d); the second (``ps_split_normalize_*``, ``ps_strided*_finish_*``), given the
    row's (M, D), normalises. Where copies are asynchronous, the split's ``_buffered_`` forms take the
    chunks through shared memory (docs/design.md).

    Backward: the gradient's first pass (``ps_bwd_partials_*``, ``ps_bwd_strided*_sums_*``) writes
    each chunk's or position's (sum, top) as two doubles: the sum of dy * y (softmax) or of dy
    (log_softmax), and for log_softmax the max of y, NaN where y holds NaN. The second
    (``ps_bwd_finish_*``, ``ps_bwd_strided*_finish_*``) is given each row's total. ``top`` tells the
    finish two things, neither of which needs a collective beside the one all_reduce of the sums:

    * NaN: ``grad_dot`` folds a NaN top into the row's sum, which the all_reduce (SUM) then makes
      NaN on every rank, and a NaN sum makes the whole row's dx NaN, as a NaN top would;
    * a safe log_softmax row of all -inf on every rank (its output is constant, its dx 0): that
      is known from the forward's merged M = -inf, which the caller saves and passes to
      ``grad_finish`` as ``empty``; the finish is handed top = -inf there and safe = 1, and top = 0
      elsewhere. A rank's local top cannot tell it: its slice of a row may be all -inf while
      other ranks' slices are not.

    ``profile`` is the device's planner.DeviceProfile; ``launch(plan, dtype, buffers)`` runs a
    planner.Plan's launches with named buffer addresses on the caller's stream.
    """

    def __init__(self, profile, launch) -> None:
        self.profile, self.launch = profile, launch

    def _forward_passes(self, x: Tensor, axis: int, y: Tensor, op: str, safe: bool) -> _Passes | None:
        """The two passes for x and its output y (x itself for the first pass alone), or None where
        x's layout is not the kernels'."""
        from ._arrays import element_misalign
        from .layout import Rows
        from .planner import RowProblem, StridedProblem, plan_split_passes, plan_strided_passes

        layouts = _layouts((x, y), axis)
        if layouts is None:
            return None
        xl, yl = layouts
        dtype = _dtype(x)
        misaligns = (element_misalign(x.data_ptr(), dtype), element_misalign(y.data_ptr(), dtype))
        if isinstance(xl, Rows):
            p = RowProblem(dtype, op, xl.rows, xl.cols, xl.row_stride, yl.row_stride, *misaligns, safe)
            return _Passes(xl.rows, 1, True, *_passes(plan_split_passes, p, self.profile))
        p = StridedProblem(dtype, op, xl.outer, xl.cols, xl.inner, xl.strides, yl.strides, safe, *misaligns)
        return _Passes(xl.outer, xl.inner, False, *_passes(plan_strided_passes, p, self.profile))

    def partials(self, x: Tensor, axis: int) -> tuple[Tensor, Tensor]:
        import torch

        x = _collapsed(x, axis)
        passes = self._forward_passes(x, axis, x, "softmax", False)
        if passes is None:
            return super().partials(x, axis)
        pairs = torch.empty(passes.outer, passes.chunks, passes.inner, 2, dtype=compute_dtype(x.dtype),
                            device=x.device)
        self.launch(passes.first, _dtype(x), {"x": x.data_ptr(), "partials": pairs.data_ptr()})
        if passes.chunks > 1:  # a position's chunks: their pairs merged here
            m, d = self.merge(pairs[..., 0].movedim(1, 0), pairs[..., 1].movedim(1, 0))
        else:
            m, d = pairs[:, 0, :, 0], pairs[:, 0, :, 1]
        shape = _reduced_shape(x, axis)
        return m.reshape(shape), d.reshape(shape)

    def finish(self, x: Tensor, m: Tensor, d: Tensor, op: str, safe: bool, axis: int) -> Tensor:
        import torch

        x = _collapsed(x, axis)
        y = torch.empty_like(x, memory_format=torch.contiguous_format)
        passes = self._forward_passes(x, axis, y, op, safe)
        if passes is None:
            return super().finish(x, m, d, op, safe, axis)
        pairs = torch.stack((m.reshape(-1), d.reshape(-1)), dim=1).to(compute_dtype(x.dtype))
        if passes.split:
            # the row's (M, D) as its first chunk's pair, the monoid's identity (-inf, 0) as the
            # others': each chunk's block merges them into (M, D) exactly
            pairs = pairs.unsqueeze(1)
            if passes.chunks > 1:
                identity = torch.zeros(passes.outer, passes.chunks - 1, 2, dtype=pairs.dtype, device=x.device)
                identity[:, :, 0] = float("-inf")
                pairs = torch.cat((pairs, identity), dim=1)
        pairs = pairs.contiguous()
        self.launch(passes.second, _dtype(x), {"x": x.data_ptr(), "y": y.data_ptr(), "partials": pairs.data_ptr()})
        if safe and op == "log_softmax":  # the kernels give NaN for a row of all -inf; safe asks for -inf
            y.masked_fill_((m == float("-inf")).unsqueeze(axis), float("-inf"))
        return y

    def _grad_passes(self, op: str, dy: Tensor, y: Tensor, dx: Tensor, axis: int,
                     safe: bool = False) -> _Passes | None:
        """The two passes for these tensors (dx: dy for the first pass alone), or None where their
        layouts are not the kernels'."""
        from ._arrays import element_misalign
        from .layout import Rows
        from .planner_backward import GradRowProblem, GradStridedProblem, plan_split_passes, plan_strided_passes

        if dy.dtype != y.dtype or dy.shape != y.shape:
            return None
        layouts = _layouts((dy, y, dx), axis)
        if layouts is None:
            return None
        dtype = _dtype(y)
        misaligns = tuple(element_misalign(t.data_ptr(), dtype) for t in (dy, y, dx))
        first = layouts[0]
        if isinstance(first, Rows):
            strides = tuple(lay.row_stride for lay in layouts)
            problem = GradRowProblem(dtype, op, first.rows, first.cols, strides, misaligns, safe)
            return _Passes(first.rows, 1, True, *_passes(plan_split_passes, problem, self.profile))
        problem = GradStridedProblem(dtype, op, first.outer, first.cols, first.inner,
                                     *(lay.strides for lay in layouts), safe, misaligns)
        return _Passes(first.outer, first.inner, False, *_passes(plan_strided_passes, problem, self.profile))

    def grad_dot(self, dy: Tensor, y: Tensor, op: str, axis: int) -> Tensor:
        import torch

        dy, y = _collapsed(dy, axis), _collapsed(y, axis)
        passes = self._grad_passes(op, dy, y, dy, axis)
        if passes is None:
            return super().grad_dot(dy, y, op, axis)
        # (sum, top) a chunk of a position
        sums = torch.empty(passes.outer, passes.chunks, passes.inner, 2, dtype=torch.float64, device=y.device)
        self.launch(passes.first, _dtype(y), {"dy": dy.data_ptr(), "y": y.data_ptr(), "sums": sums.data_ptr()})
        if passes.chunks > 1:  # a position's chunks
            total, top = sums[..., 0].sum(dim=1), sums[..., 1].amax(dim=1)  # amax keeps NaN
        else:
            total, top = sums[:, 0, :, 0], sums[:, 0, :, 1]
        # a fresh contiguous tensor for the all_reduce; log_softmax's NaN top folded into the sum
        s = torch.where(top.isnan(), top, total) if op == "log_softmax" else total.clone()
        return s.reshape(_reduced_shape(y, axis))

    def grad_finish(self, dy: Tensor, y: Tensor, s: Tensor, op: str, axis: int,
                    empty: Tensor | None = None) -> Tensor:
        import torch

        dy, y = _collapsed(dy, axis), _collapsed(y, axis)
        dx = torch.empty_like(y, memory_format=torch.contiguous_format)
        safe = empty is not None and op == "log_softmax"
        passes = self._grad_passes(op, dy, y, dx, axis, safe)
        if passes is None:
            return super().grad_finish(dy, y, s, op, axis, empty)
        # the row's (sum, top = 0) as its first chunk's, (0, -inf) as the others': merged, the row's
        # (the strided passes: one pair a position)
        chunks = passes.chunks if passes.split else 1
        sums = torch.zeros(passes.outer * passes.inner, chunks, 2, dtype=torch.float64, device=y.device)
        if chunks > 1:
            sums[:, 1:, 1] = float("-inf")
        sums[:, 0, 0] = s.reshape(-1)
        if safe:  # top = -inf with safe = 1: the kernel's zero gradient of a constant row
            sums[:, 0, 1].masked_fill_(empty.reshape(-1), float("-inf"))
        self.launch(passes.second, _dtype(y),
                    {"dy": dy.data_ptr(), "y": y.data_ptr(), "dx": dx.data_ptr(), "sums": sums.data_ptr()})
        if empty is not None and not safe:  # softmax: y = 0 on such rows already; 0 even where dy is not finite
            dx.masked_fill_(empty.unsqueeze(axis), 0.0)
        return dx


_kernel_math: dict = {}  # (vendor, device index) -> KernelMath
_PREPARED_MOST = 512  # launchers a device keeps (as many as the plans _passes keeps)


def _device_math(x: Tensor) -> LocalMath:
    """KernelMath for a CUDA / ROCm torch tensor where the package's runtime opens, else TorchMath."""
    import torch

    from . import _probe

    vendor = "hip" if getattr(torch.version, "hip", None) else "cuda"
    key = (vendor, x.device.index)
    if key not in _kernel_math:
        try:
            rt = _probe.runtime(vendor)
        except _probe.BackendUnavailableError:
            _kernel_math[key] = TORCH
        else:
            device = x.device.index
            # The backward runs on torch's autograd thread for the device, which torch leaves without
            # a current CUDA driver context where the thread already reports that device (a new
            # thread reports device 0): cudaSetDevice binds the device's primary context first. On
            # another device, the runtime's switch to it binds it, and gives the thread's back after.
            bind = rt.cupy.cuda.runtime.setDevice if vendor == "cuda" else None
            # A pass's launcher, prepared once (the compiled launcher where it is built): a local step
            # of a few hundred MB would otherwise spend as long packing arguments as its kernels run.
            prepared: dict = {}

            def launch(plan, dtype, buffers):
                if bind is not None and rt.current_device() == device:
                    bind(device)
                key = (plan, dtype, tuple(buffers))
                launcher = prepared.get(key)
                if launcher is None:
                    if len(prepared) >= _PREPARED_MOST:
                        prepared.clear()
                    launcher = prepared[key] = rt.prepare(plan, dtype, device, pointers=key[2])
                launcher(*buffers.values(), torch.cuda.current_stream(device).cuda_stream)

            _kernel_math[key] = KernelMath(rt.profile(device), launch)
    return _kernel_math[key]


def local_math(x: Tensor) -> LocalMath:
    """The implementation of the local steps for tensor ``x``: the package's kernels on a GPU
    (``PORTABLE_SOFTMAX_SHARDED_LOCAL=torch`` asks for torch operations there too), torch
    operations elsewhere."""
    import os

    if x.is_cuda and os.environ.get("PORTABLE_SOFTMAX_SHARDED_LOCAL", "kernels") != "torch":
        return _device_math(x)
    return TORCH
