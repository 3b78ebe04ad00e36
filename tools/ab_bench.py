"""A/B runs of planner choices in one process: every variant on the same tensor, copy and torch call.

    python3 tools/ab_bench.py VARIANTS SPECS [--reps N]

VARIANTS is a ';'-separated list of NAME=KNOB:VALUE,KNOB:VALUE: a KNOB is a field of the planner's
Tuning (lower case, e.g. split_even_rounds_most:0; the variant plans with each device's default
Tuning, those fields replaced), V.NAME for the variant catalogue's attributes or L.NAME for the
launch module's (L.COOPERATIVE_LAUNCHES:True launches the on-chip tiers cooperatively); an empty
list keeps the committed settings. SPECS a
','-separated list of dtype:RxC[:axis] (or empty, with --scan). Prints one line per (spec, op):
each variant's % of the device-to-device copy, torch's, and the largest error against torch in float64
(every variant is checked, so a fast wrong kernel shows). With --latency, the wall time per call
of back-to-back softmax calls of torch tensors (the prepared launcher's path) and their device
time, per variant, beside torch's.
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import fields, replace

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


#: the planner's knobs: the fields of its Tuning
TUNING_FIELDS = frozenset(f.name for f in fields(planner.Tuning))
#: each device's default Tuning as the planner picks it (a variant replaces fields of it)
COMMITTED_TUNING = planner.default_tuning


def parse_variants(text: str) -> list[tuple[str, dict]]:
    variants = []
    for item in filter(None, text.split(";")):
        name, _, knobs = item.partition("=")
        settings = {}
        for knob in filter(None, split_top_level(knobs)):
            key, _, value = knob.partition(":")
            if "." in key and not hasattr(*owner_of(key)):
                raise SystemExit(f"no knob {key!r}: {key.split('.')[0]}. has no attribute {key.split('.', 1)[1]!r}")
            if "." not in key and key not in TUNING_FIELDS:
                hint = f" (fields are lower case: {key.lower()})" if key.lower() in TUNING_FIELDS else ""
                raise SystemExit(f"no knob {key!r}: not a field of planner.Tuning{hint}, nor V.NAME or L.NAME")
            settings[key] = ast.literal_eval(value)
        variants.append((name, settings))
    return variants


def owner_of(key: str) -> tuple[object, str]:
    """The module of a V.NAME or L.NAME knob and its name there: the variant catalogue the planner
    reads (planner.V), or the launch module (_launch)."""
    return (_launch if key.startswith("L.") else planner.V), key[2:]


def attribute_defaults(variants: list[tuple[str, dict]]) -> dict:
    """The committed values of the V. and L. attributes that any variant sets."""
    return {key: getattr(*owner_of(key)) for _, settings in variants for key in settings if "." in key}


def variant_tuning(settings: dict, device: planner.DeviceProfile) -> planner.Tuning:
    """The device's default Tuning with a variant's Tuning fields replaced."""
    return replace(COMMITTED_TUNING(device), **{k: v for k, v in settings.items() if "." not in k})


def set_attributes(settings: dict, defaults: dict) -> None:
    """A variant's V. and L. attributes set, every other variant's restored (`defaults`); cached
    plans dropped (made under other attributes)."""
    for key, value in {**defaults, **settings}.items():
        setattr(*owner_of(key), value)
    planner.plan.cache_clear()


def use(settings: dict, defaults: dict) -> None:
    """Run the API as a variant: its V. and L. attributes set, and each device's default Tuning
    (planner.default_tuning, which the API's calls plan with) its variant_tuning; cached plans and
    prepared launches dropped."""
    planner.default_tuning = COMMITTED_TUNING if not settings else (
        lambda device: variant_tuning(settings, device))
    set_attributes(settings, defaults)
    api.launchers.clear()  # launchers built under the other settings


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
    defaults = attribute_defaults(variants)
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
