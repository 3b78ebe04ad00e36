"""The local math of a softmax whose axis is sharded across ranks.

A rank holds a slice of every row. The whole computation is five local steps around two
collectives (``distributed`` does the collectives):

* ``partials(x, axis)``: the (m, d) pair of each row's local slice, m = max, d = sum(exp(x - m));
* ``merge(m, d)``: the pairs of every rank (stacked on a leading rank axis) folded into the row's
  (M, D) by the monoid (m1, d1) + (m2, d2) = (M, d1 exp(m1 - M) + d2 exp(m2 - M)), M = max(m1, m2);
* ``finish(x, M, D, op, safe, axis)``: exp(x - M) / D, or x - M - log D;
* ``grad_dot(dy, y, op, axis)``: the local part of the backward's row sum, sum(dy * y) for
  softmax, sum(dy) for log_softmax;
* ``grad_finish(dy, y, s, op, axis)``: y * (dy - s), or dy - exp(y) * s, given the row's full sum.

``TorchMath`` computes each step with torch operations, float16/bfloat16 in float32 and float64 in
float64; it runs wherever torch does. Another implementation (the package's kernels) only has to
provide the same five methods.

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

    def grad_finish(self, dy: Tensor, y: Tensor, s: Tensor, op: str, axis: int) -> Tensor: ...


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
        c = compute_dtype(y.dtype)
        if op == "softmax":
            return _fresh(dy, c).mul_(y).sum(dim=axis)
        return dy.sum(dim=axis, dtype=c)

    def grad_finish(self, dy: Tensor, y: Tensor, s: Tensor, op: str, axis: int) -> Tensor:
        import torch

        c = compute_dtype(y.dtype)
        sk = s.unsqueeze(axis)
        if op == "softmax":
            dx = (dy - sk).mul_(y)  # dy - s is in the compute dtype (type promotion)
        else:
            dx = torch.sub(dy, _fresh(y, c).exp_().mul_(sk))
        return dx.to(y.dtype)


TORCH = TorchMath()


def local_math(x: Tensor) -> LocalMath:
    """The implementation of the local steps for tensor ``x``."""
    return TORCH
