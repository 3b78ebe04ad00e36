"""Regenerate src_hip/ from src_cuda/ with the one canonical hipify tool.

The tool is ``torch.utils.hipify`` from the torch release pinned below (its
CUDA->HIP tables change between releases, so a different torch could write a
different src_hip/; the drift test then says which torch to install). It needs
no ROCm and no GPU: the CPU wheel of torch is enough.

    python tools/hipify_sources.py            # rewrite src_hip/ in place
    python tools/hipify_sources.py --check    # exit 1 when src_hip/ is stale
    python tools/hipify_sources.py --out DIR  # write elsewhere (the drift test)

Output: every *.cu of src_cuda/ becomes <name>.hip, every *.cuh keeps its name,
each with one header line naming its origin. The entry-point files
(softmax_<dtype>.cu) are themselves generated from portable_softmax/_variants.py;
regenerate those first (``python -m portable_softmax._variants src_cuda``).
"""

from __future__ import annotations

import argparse
import filecmp
import io
import shutil
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

#: the torch release whose torch.utils.hipify defines src_hip/ (CI installs exactly this one)
PINNED_TORCH = "2.13.0"
REPO = Path(__file__).resolve().parent.parent
SOURCE_SUFFIXES = (".cu", ".cuh")


class HipifyUnavailableError(RuntimeError):
    pass


def hipify_module():
    """torch.utils.hipify.hipify_python of the pinned torch, or HipifyUnavailableError saying why not."""
    try:
        import torch
        from torch.utils.hipify import hipify_python
    except ImportError as e:
        raise HipifyUnavailableError(f"torch is not installed ({e}); pip install torch=={PINNED_TORCH}") from None
    release = torch.__version__.split("+")[0]
    if release != PINNED_TORCH:
        raise HipifyUnavailableError(
            f"torch {torch.__version__} is installed, but src_hip/ is defined by torch.utils.hipify of torch "
            f"{PINNED_TORCH}; pip install torch=={PINNED_TORCH}"
        )
    return hipify_python


def hip_name(cuda_name: str) -> str:
    return cuda_name[: -len(".cu")] + ".hip" if cuda_name.endswith(".cu") else cuda_name


def header_line(cuda_name: str) -> str:
    return (
        f"// Generated from src_cuda/{cuda_name} by tools/hipify_sources.py "
        f"(torch.utils.hipify, torch {PINNED_TORCH}). Do not edit.\n"
    )


def hipify_tree(src: Path, out: Path) -> list[Path]:
    """Write the hipified form of every kernel source of ``src`` into ``out`` (created; old files replaced)."""
    hp = hipify_module()
    names = sorted(p.name for p in src.iterdir() if p.suffix in SOURCE_SUFFIXES)
    if not names:
        raise FileNotFoundError(f"no {' / '.join(SOURCE_SUFFIXES)} files in {src}")
    with tempfile.TemporaryDirectory(prefix="ps_hipify_") as tmp:
        project = Path(tmp) / "src_cuda"
        project.mkdir()
        for name in names:  # only the kernel sources, so no stray file changes the result
            shutil.copyfile(src / name, project / name)
        work = Path(tmp) / "out"
        # hipify remembers every file it has seen in a module-level dict: forget it, so
        # a second run in one process rewrites rather than skips.
        hp.HIPIFY_FINAL_RESULT.clear()
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):  # progress and summary lines
            hp.hipify(
                project_directory=str(project),
                output_directory=str(work),
                includes=[str(project / "*")],
                show_detailed=False,
                show_progress=False,
                is_pytorch_extension=False,
            )
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name in names:
            produced = work / "hip" / hip_name(name)
            if not produced.is_file():
                raise RuntimeError(f"torch.utils.hipify wrote no {produced.name} for {name}")
            text = produced.read_text(encoding="utf-8")
            # hipify's own breadcrumb line carries no origin; ours names file, tool and pin.
            text = text.removeprefix(hp.HIPIFY_C_BREADCRUMB)
            target = out / hip_name(name)
            target.write_text(header_line(name) + text, encoding="utf-8", newline="\n")
            written.append(target)
    return written


def stale_files(expected_dir: Path, actual_dir: Path) -> list[str]:
    """Names that differ between two generated trees (missing, extra or changed)."""
    expected = {p.name for p in expected_dir.iterdir() if p.is_file()}
    actual = {p.name for p in actual_dir.iterdir() if p.is_file()} if actual_dir.is_dir() else set()
    differ = sorted(expected ^ actual)
    differ += sorted(n for n in expected & actual if not filecmp.cmp(expected_dir / n, actual_dir / n, shallow=False))
    return differ


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=REPO / "src_cuda")
    ap.add_argument("--out", type=Path, default=REPO / "src_hip")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args(argv)
    try:
        if args.check:
            with tempfile.TemporaryDirectory() as tmp:
                hipify_tree(args.src, Path(tmp))
                differ = stale_files(Path(tmp), args.out)
            if differ:
                print(f"{args.out} is stale: {', '.join(differ)}; run python tools/hipify_sources.py", file=sys.stderr)
                return 1
            print(f"{args.out} matches torch.utils.hipify (torch {PINNED_TORCH}) of {args.src}")
            return 0
        # Replace the directory's generated files wholesale, so a removed source leaves no orphan.
        if args.out.is_dir():
            for old in args.out.iterdir():
                if old.is_file():
                    old.unlink()
        for path in hipify_tree(args.src, args.out):
            print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    except HipifyUnavailableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
