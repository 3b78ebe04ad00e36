"""A/B runs of kernel changes: several source trees built side by side, benched on one machine.

    python3 tools/ab_builds.py NAME=SRC [NAME=SRC ...] [--arch 90-real] [--runs 2] [--work DIR] -- BENCH ARGS

Each SRC (a checkout, or a `git archive` of a commit unpacked beside it) is built in parallel
into its own target and build directory; then `portable-softmax bench BENCH ARGS --json ...`
runs once per build and run, interleaved (A B A B), from a directory where no checkout shadows
the build. Prints one line per (dtype, shape, axis, op): each build's % of the copy in each run,
then torch's, and after them each later build's difference from the first, by dtype. Run every
build on the same machine in one call: figures from different machines do not compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def build(name: str, src: Path, work: Path, arch: str) -> Path:
    target = work / f"pkg_{name}"
    if (target / "portable_softmax").is_dir():  # built by an earlier call with the same --work
        return target
    cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--target", str(target),
           "-C", f"build-dir={work / f'build_{name}'}", "-C", f"cmake.define.CMAKE_CUDA_ARCHITECTURES={arch}",
           str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"building {name} from {src} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return target


def check_imports_from(target: Path, work: Path) -> None:
    """Stop unless `portable_softmax` imports from `target` under the bench's environment: an
    editable install of the package (its import hook goes ahead of PYTHONPATH) would otherwise
    have every build bench the same code."""
    env = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run([sys.executable, "-c", "import portable_softmax; print(portable_softmax.__file__)"],
                          cwd=work, env=env, capture_output=True, text=True)
    where = Path(done.stdout.strip()).resolve() if done.returncode == 0 else None
    if where is None or target.resolve() not in where.parents:
        raise SystemExit(f"portable_softmax imports from {where or done.stderr[-500:]}, not from the build at "
                         f"{target}: uninstall the installed package first (pip uninstall portable_softmax)")


def bench(target: Path, bench_args: list[str], json_path: Path, work: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(target)}
    cmd = [sys.executable, "-m", "portable_softmax.cli", "bench", *bench_args, "--json", str(json_path)]
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench with {target} failed:\n{done.stderr[-3000:]}")
    return json.loads(json_path.read_text())["results"]


def summary(table: dict[tuple, dict[str, list[float]]], names: list[str]) -> list[str]:
    """One line per later build and dtype: the mean, lowest and highest difference from the first
    build over the rows both measured (the better run of each), and on how many rows it was ahead."""
    lines = []
    for name in names[1:]:
        by_dtype: dict[str, list[float]] = {}
        for key, cells in table.items():
            if cells.get(names[0]) and cells.get(name):
                by_dtype.setdefault(key[0], []).append(max(cells[name]) - max(cells[names[0]]))
        for dtype, diffs in by_dtype.items():
            ahead = sum(d > 0 for d in diffs)
            lines.append(f"{name} - {names[0]} {dtype}: mean {sum(diffs) / len(diffs):+.2f}, "
                         f"{min(diffs):+.1f} to {max(diffs):+.1f}, ahead on {ahead} of {len(diffs)}")
    return lines


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("builds", nargs="+", help="NAME=SRC")
    ap.add_argument("--arch", default="90-real", help="CMAKE_CUDA_ARCHITECTURES of every build")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--work", help="directory kept between calls: builds found there are reused")
    ap.add_argument("--build-only", action="store_true", help="build every tree and stop")
    args = ap.parse_args(argv[:split])
    bench_args = argv[split + 1:]
    builds = [tuple(b.split("=", 1)) for b in args.builds]
    if any(len(b) != 2 for b in builds):
        raise SystemExit("builds are NAME=SRC")
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="ps_ab_"))
    work.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(len(builds)) as pool:
        targets = dict(zip([n for n, _ in builds],
                           pool.map(lambda b: build(b[0], Path(b[1]).resolve(), work, args.arch), builds)))
    if args.build_only:
        return
    for target in targets.values():
        check_imports_from(target, work)
    table: dict[tuple, dict[str, list[float]]] = {}
    torch_pct: dict[tuple, list[float]] = {}
    for run in range(args.runs):
        for name, target in targets.items():
            for r in bench(target, bench_args, work / f"{name}_{run}.json", work):
                key = (r["dtype"], "x".join(map(str, r["shape"])), r.get("axis", -1), r["op"])
                table.setdefault(key, {}).setdefault(name, []).append(r["ours_pct_of_copy"])
                if r.get("torch_pct_of_copy") is not None:
                    torch_pct.setdefault(key, []).append(r["torch_pct_of_copy"])
    print("dtype shape axis op | " + " | ".join(targets) + " | torch")
    for key, cells in table.items():
        runs = " | ".join(" ".join(f"{v:5.1f}" for v in cells.get(name, [])) for name in targets)
        theirs = " ".join(f"{v:.0f}" for v in torch_pct.get(key, []))
        print(f"{key[0]} {key[1]} {key[2]} {key[3]} | {runs} | {theirs}", flush=True)
    print("\n".join(summary(table, list(targets))))


if __name__ == "__main__":
    main()
