"""Gradient kernels of two or more builds side by side: each build's figures, then one table.

    PYTHONPATH=BUILD python3 tools/grad_ab.py run TAG SPECS [--reps N] [--torch] >> ab.txt
    python3 tools/grad_ab.py table ab.txt

`run` times softmax_backward and log_softmax_backward of the build on PYTHONPATH (a tree installed
with `pip install --target BUILD`) on torch tensors: SPECS is a ','-separated list of
dtype:RxC[:axis]; each line of JSON gives the % of a 3-stream copy (dy and y read, dx written;
L2 flushed, median of N), the largest error against float64, and with --torch torch's own
backward (aten) on the same tensors. TAG names the build and the run (letters, then the run's
number: old1, new1, old2, ...). `table` prints, per spec, each build's range over its runs,
softmax / log_softmax, and torch's.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys

OPS = ("softmax_backward", "log_softmax_backward")


def run(tag: str, specs: str, reps: int, with_torch: bool) -> None:
    import torch

    import portable_softmax as ps
    from portable_softmax.bench import _Timer, device_copies, fastest_copy_ms

    timer = _Timer(torch, reps)
    copies = device_copies(torch)
    for spec in specs.split(","):
        parts = spec.split(":")
        dtype = getattr(torch, parts[0])
        shape = tuple(int(v) for v in parts[1].split("x"))
        axis = int(parts[2]) if len(parts) > 2 else -1
        torch.manual_seed(0)
        x = torch.randn(shape, device="cuda").to(dtype)
        copy_ms = fastest_copy_ms(timer, copies, x, torch.empty_like(x)) * 1.5  # 3 streams, not 2
        for op in OPS:
            forward = torch.softmax if op == "softmax_backward" else torch.log_softmax
            y = forward(x.float(), dim=axis).to(dtype)
            dy = torch.randn_like(x, dtype=torch.float32).to(dtype)
            dx = torch.full_like(x, float("nan"))
            ours = getattr(ps, op)
            ms = timer.median_ms(functools.partial(ours, dy, y, axis, out=dx))
            dx.fill_(float("nan"))
            ours(dy, y, axis, out=dx)
            d, w = dy.double(), y.double()
            if op == "softmax_backward":
                ref = w * (d - (d * w).sum(axis, keepdim=True))
            else:
                ref = d - w.exp() * d.sum(axis, keepdim=True)
            row = {"tag": tag, "spec": spec, "op": op, "pct": round(100 * copy_ms / ms, 2),
                   "err": float((dx.double() - ref).abs().max())}
            if with_torch:
                aten = getattr(torch.ops.aten, f"_{op}_data")
                row["torch"] = round(100 * copy_ms / timer.median_ms(functools.partial(aten, dy, y, axis, dtype)), 1)
            print(json.dumps(row), flush=True)
            del d, w, ref
        torch.cuda.empty_cache()


def table(rows: list[dict]) -> list[str]:
    """One line per spec: each build's range of % of the copy over its runs, softmax / log_softmax,
    torch's, and the largest error of any build."""
    cells: dict[str, dict] = collections.OrderedDict()
    for r in rows:
        e = cells.setdefault(r["spec"], collections.defaultdict(list))
        e[(r["tag"].rstrip("0123456789"), r["op"])].append(r["pct"])
        if "torch" in r:
            e[("torch", r["op"])].append(r["torch"])
        e[("err", r["op"])].append(r["err"])
    builds = list(dict.fromkeys(r["tag"].rstrip("0123456789") for r in rows))

    def cell(e: dict, build: str) -> str:
        ranges = []
        for op in OPS:
            v = sorted(e.get((build, op), []))
            ranges.append("-" if not v else f"{v[0]:.1f}" if v[0] == v[-1] else f"{v[0]:.1f}-{v[-1]:.1f}")
        return " / ".join(ranges)

    lines = ["spec | " + " | ".join(builds) + " | torch | max error"]
    for spec, e in cells.items():
        err = max(max(e[("err", op)]) for op in OPS if e[("err", op)])
        lines.append(f"{spec} | " + " | ".join(cell(e, b) for b in builds) + f" | {cell(e, 'torch')} | {err:.2e}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("tag")
    r.add_argument("specs")
    r.add_argument("--reps", type=int, default=10)
    r.add_argument("--torch", action="store_true")
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    if args.command == "run":
        run(args.tag, args.specs, args.reps, args.torch)
    else:
        rows = [json.loads(line) for f in args.files for line in open(f) if line.startswith("{")]
        print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
