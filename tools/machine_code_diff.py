"""Which kernels' machine code differs between two kernel source trees: a refactor that leaves a
kernel's machine code byte-identical leaves its speed as it was, with no benchmark to show it.

    python3 tools/machine_code_diff.py OLD_SRC NEW_SRC [--arch sm_90] [--dtypes f32,f16,bf16,f64]

OLD_SRC and NEW_SRC are src_cuda directories (of two checkouts, or `git archive` trees). Each
dtype's softmax_<dtype>.cu is compiled by nvcc to a cubin for --arch, and the kernels' .text
sections (their SASS) are compared byte for byte. Prints, per dtype, how many kernels differ and
which; exits 1 if any kernel differs or exists in one tree only (--list-only: always 0). Needs
nvcc, no GPU. The check is for one architecture: other targets (and HIP's) compile the same source
with other compilers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

DTYPES = ("f32", "f16", "bf16", "f64")


def kernel_code(cubin: bytes) -> dict[str, bytes]:
    """Each kernel's machine code in a 64-bit ELF cubin: its .text.<kernel> section's bytes."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF file (a cubin)")
    (section_headers,) = struct.unpack_from("<Q", cubin, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, section_headers + i * entry_size) for i in range(count)]
    names_at = headers[names_index][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return cubin[start:cubin.index(b"\0", start)].decode()

    code = {}
    for header in headers:
        section = name(header[0])
        if section.startswith(".text."):
            code[section[len(".text."):]] = cubin[header[4]:header[4] + header[5]]
    return code


def compile_cubin(source: Path, include: Path, arch: str, out: Path) -> bytes:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc is not installed: the CUDA toolkit compiles the kernels")
    cmd = [nvcc, f"-arch={arch}", "-O3", "-std=c++17", "-cubin", f"-I{include}", "-o", str(out), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source}:\n{proc.stderr[-2000:]}")
    return out.read_bytes()


def compare(old: dict[str, bytes], new: dict[str, bytes]) -> tuple[list[str], list[str]]:
    """(kernels in both whose code differs, kernels in one only), each sorted."""
    differ = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
    return differ, sorted(old.keys() ^ new.keys())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="the first src_cuda directory")
    parser.add_argument("new", type=Path, help="the second src_cuda directory")
    parser.add_argument("--arch", default="sm_90", help="nvcc's -arch (default: sm_90)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help=f"of {', '.join(DTYPES)} (default: all)")
    parser.add_argument("--list-only", action="store_true", help="exit 0 whatever differs")
    args = parser.parse_args(argv)
    dtypes = args.dtypes.split(",")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        parser.error(f"--dtypes: {', '.join(unknown)} not known; accepted: {', '.join(DTYPES)}")
    for tree in (args.old, args.new):
        if not (tree / "softmax.cuh").is_file():
            parser.error(f"{tree} is not a src_cuda directory (it has no softmax.cuh)")
    if shutil.which("nvcc") is None:
        parser.error("nvcc is not installed: the CUDA toolkit compiles the kernels")
    changed = 0
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor() as pool:
        jobs = {(d, side): pool.submit(compile_cubin, tree / f"softmax_{d}.cu", tree, args.arch,
                                       Path(tmp) / f"{side}_{d}.cubin")
                for d in dtypes for side, tree in (("old", args.old), ("new", args.new))}
        for d in dtypes:
            try:
                old, new = (kernel_code(jobs[d, side].result()) for side in ("old", "new"))
            except RuntimeError as error:
                print(f"portable-softmax tools: {error}", file=sys.stderr)
                return 2
            differ, one_side = compare(old, new)
            changed += len(differ) + len(one_side)
            print(f"{d}: {len(old)} kernels, {len(differ)} with other machine code, {len(one_side)} in one tree only")
            for kernel in differ:
                print(f"  differs  {kernel}")
            for kernel in one_side:
                print(f"  {'old' if kernel in old else 'new'} only {kernel}")
    return 1 if changed and not args.list_only else 0


if __name__ == "__main__":
    sys.exit(main())
