"""The specs whose plan a planner variant changes on a device profile: the shapes an A/B of that
variant (tools/ab_bench.py) can measure, drawn at random a few per (dtype, tier, input size).

    python3 tools/plan_diff.py VARIANTS --scan DTYPES:COLS:MIBS [--profile h100] [--per-group N] [--seed S]

VARIANTS as for tools/ab_bench.py (';'-separated NAME=KNOB:VALUE,...). A spec is listed where any
variant's plan differs from the first variant's. Prints one ','-separated spec list (ab_bench's
SPECS) on stdout and, on stderr, how many specs of each (dtype, tier of the first variant, MiB)
changed and how many of them were drawn. Needs no GPU.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys

from ab_bench import attribute_defaults, parse_variants, scan_specs, set_attributes, variant_tuning

from portable_softmax import planner


def changed_specs(variants: list[tuple[str, dict]], specs: list[str], device: planner.DeviceProfile,
                  defaults: dict) -> dict[tuple[str, str, float], list[str]]:
    """The specs whose plan differs between the first variant and any other, by (dtype, the first
    variant's tier, input MiB). Each variant plans with its Tuning (variant_tuning); its V. and L.
    attributes are set while it plans, and restored (`defaults`, attribute_defaults)."""
    changed = collections.defaultdict(list)
    tunings = [variant_tuning(settings, device) for _, settings in variants]
    for spec in specs:
        dtype, shape = spec.split(":")[:2]
        rows, cols = (int(d) for d in shape.split("x"))
        problem = planner.RowProblem(dtype, "softmax", rows, cols)
        plans = []
        for (_, settings), tuning in zip(variants, tunings):
            set_attributes({k: v for k, v in settings.items() if "." in k}, defaults)
            plans.append(planner.plan(problem, device, tuning))
        set_attributes({}, defaults)
        if any(p != plans[0] for p in plans[1:]):
            mib = round(rows * cols * planner.V.DTYPES[dtype][2] / (1 << 20), 2)
            changed[dtype, plans[0].tier, mib].append(spec)
    return changed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants")
    ap.add_argument("--scan", action="append", required=True, metavar="DTYPES:COLS:MIBS",
                    help="the specs to compare, as for tools/ab_bench.py --scan (repeatable)")
    ap.add_argument("--profile", default="h100", choices=("h100", "mi300x", "rdna3"))
    ap.add_argument("--per-group", type=int, default=0, help="specs drawn a (dtype, tier, MiB); 0: all")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    variants = parse_variants(args.variants)
    if len(variants) < 2:
        raise SystemExit("give two variants or more: the first is the one the others are compared with")
    defaults = attribute_defaults(variants)
    device = getattr(planner.DeviceProfile, args.profile)()
    specs = [spec for text in args.scan for spec in scan_specs(text)]
    rng = random.Random(args.seed)
    drawn = []
    for group, members in sorted(changed_specs(variants, specs, device, defaults).items()):
        picked = members if not args.per_group else rng.sample(members, min(args.per_group, len(members)))
        drawn += picked
        print(f"{group[0]} {group[1]} {group[2]} MiB: {len(members)} changed, {len(picked)} drawn", file=sys.stderr)
    print(",".join(drawn))


if __name__ == "__main__":
    main()
