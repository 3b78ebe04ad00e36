"""A/B runs of planner choices in one process: every variant on the same tensor, copy and torch call.

    python3 tools/ab_bench.py VARIANTS SPECS [--reps N]

VARIANTS is a ';'-separated list of NAME=KNOB:VALUE,KNOB:VALUE (planner module attributes,
V.NAME for the variant catalogue's, L.NAME for the launch module's (L.COOPERATIVE_LAUNCHES:True
launches the on-chip tiers cooperatively); an empty list keeps the committed settings), SPECS a
','-separated list of dtype:RxC[:axis] (or empty, with --scan). Prints one line per (spec, op):
each variant's % of the device-to-device copy, torch's, and the largest error against torch in float64
(every variant is checked, so a fast wrong kernel shows). With --latency, the wall time per call
of back-to-back softmax calls of torch tensors (the prepared launcher's path) and their device
time, per variant, beside torch's.
"""

from __future__ import annotations

import argparse
import ast

import torch

import portable_softmax as ps
from portable_softmax import _launch, api, planner
from portable_softmax.bench import _Timer, back_to_back_us, device_copies, device_us, fastest_copy_ms


def split_top_level(text: str) -> list[str]:
    """`text` split at the commas outside brackets, so that a knob's value may be a tuple or dict."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def parse_variants(text: str) -> list[tuple[str, dict]]:
    variants = []
    for item in filter(None, text.split(";")):
        name, _, knobs = item.partition("=")
        settings = {}
        for knob in filter(None, split_top_level(knobs)):
            key, _, value = knob.partition(":")
            if not hasattr(*owner_of(key)):
                raise SystemExit(f"planner has no knob {key!r}")
            settings[key] = ast.literal_eval(value)
        variants.append((name, settings))
    return variants


def owner_of(key: str) -> tuple[object, str]:
    """The module a knob lives in and its name there: planner attributes, V.NAME for the variant
    catalogue the planner reads (planner.V), or L.NAME for the launch module (_launch)."""
    if key.startswith("L."):
        return _launch, key[2:]
    return (planner.V, key[2:]) if key.startswith("V.") else (planner, key)


def use(settings: dict, defaults: dict) -> None:
    for key, value in {**defaults, **settings}.items():
        setattr(*owner_of(key), value)
    planner.plan.cache_clear()
    api._prepared.clear()  # launches prepared under the other settings


def scan_specs(text: str) -> list[str]:
    """Specs of every (dtype, columns, size) of DTYPES:COLS:MIBS (each ','-free lists joined by '+'),
    rows as many as fill the size: 'float32+float16:16+64+128:8.5+12' is 12 specs."""
    dtypes, cols, mibs = (part.split("+") for part in text.split(":"))
    return [f"{dtype}:{max(1, int(float(mib) * (1 << 20)) // (int(c) * planner.V.DTYPES[dtype][2]))}x{c}"
            for mib in mibs for dtype in dtypes for c in cols]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants")
    ap.add_argument("specs")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--ops", default="softmax,log_softmax")
    ap.add_argument("--latency", action="store_true", help="host and device time per call of small inputs")
    ap.add_argument("--scan", action="append", default=[], metavar="DTYPES:COLS:MIBS",
                    help="more specs: each dtype and row length at each input size, e.g. float32+float16:16+64:8.5+12")
    args = ap.parse_args()
    args.specs = ",".join(filter(None, [args.specs] + [",".join(scan_specs(t)) for t in args.scan]))
    variants = parse_variants(args.variants)
    defaults = {key: getattr(*owner_of(key)) for _, s in variants for key in s}
    if args.latency:
        latency(variants, defaults, args.specs)
        return
    timer = _Timer(torch, args.reps)
    copies = device_copies(torch)
    print("spec op " + " ".join(name for name, _ in variants) + " torch | copyGB/s | max err of each")
    for spec in args.specs.split(","):
        parts = spec.split(":")
        dtype, shape = parts[0], tuple(int(d) for d in parts[1].split("x"))
        axis = int(parts[2]) if len(parts) > 2 else -1
        x = (torch.randn(*shape, device="cuda") * 4).to(getattr(torch, dtype))
        y = torch.empty_like(x)
        copy_ms = fastest_copy_ms(timer, copies, x, y)
        for op in args.ops.split(","):
            ours = ps.softmax if op == "softmax" else ps.log_softmax
            theirs = torch.softmax if op == "softmax" else torch.log_softmax
            ref = theirs(x.double(), dim=axis) if x.numel() <= 1 << 28 else None
            cells, errs = [], []
            for _, settings in variants:
                use(settings, defaults)
                ms = timer.median_ms(lambda x=x, y=y, ours=ours, axis=axis: ours(x, axis=axis, out=y))
                cells.append(100 * copy_ms / ms)
                y.fill_(float("nan"))
                ours(x, axis=axis, out=y)
                if ref is not None:
                    errs.append(float((y.double() - ref).abs().nan_to_num(1e30).max()))
            use({}, defaults)
            torch_pct = 100 * copy_ms / timer.median_ms(lambda x=x, theirs=theirs, axis=axis: theirs(x, dim=axis))
            copy_gbs = 2 * x.numel() * x.element_size() / copy_ms / 1e6
            print(f"{spec} {op} " + " ".join(f"{c:.0f}" for c in cells) + f" {torch_pct:.0f} | {copy_gbs:.0f} | "
                  + " ".join(f"{e:.1e}" for e in errs), flush=True)
            del ref
        del x, y
        torch.cuda.empty_cache()


def latency(variants, defaults, specs: str) -> None:
    """Per spec, each variant's wall time per call of 2000 back-to-back calls (one sync at the end)
    and device time per call of 400 calls queued behind a GPU sleep, then torch's, in us."""
    print("spec " + " ".join(f"{name}_wall {name}_device" for name, _ in variants) + " torch_wall torch_device")
    for spec in specs.split(","):
        dtype, shape = spec.split(":")[0], tuple(int(d) for d in spec.split(":")[1].split("x"))
        x = (torch.randn(*shape, device="cuda") * 4).to(getattr(torch, dtype))
        ref = torch.softmax(x.double(), dim=-1)
        cells = []
        for _, settings in variants:
            use(settings, defaults)
            call = lambda x=x: ps.softmax(x)  # noqa: E731
            cells += [back_to_back_us(torch, call, 2000), device_us(torch, call)]
            err = float((call().double() - ref).abs().nan_to_num(1e30).max())
            assert err < (1e-5 if x.element_size() >= 4 else 1e-2), f"{spec}: error {err} against float64"
        use({}, defaults)
        theirs = lambda x=x: torch.softmax(x, dim=-1)  # noqa: E731
        cells += [back_to_back_us(torch, theirs, 2000), device_us(torch, theirs)]
        print(f"{spec} " + " ".join(f"{c:.2f}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
