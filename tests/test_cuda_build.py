"""nvcc compiles the kernel source for sm_80 and sm_90, and every planned entry point is in it."""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from portable_softmax import _variants as V

SRC = Path(__file__).resolve().parents[1] / "src_cuda"
NVCC = shutil.which("nvcc")
READELF = shutil.which("readelf")

pytestmark = [
    pytest.mark.build,
    pytest.mark.skipif(NVCC is None, reason="nvcc is not installed (the CUDA toolkit compiles the kernels)"),
    pytest.mark.skipif(READELF is None, reason="readelf (binutils) is needed to list the cubin's symbols"),
]


def _compile(dtype: str, arch: str, out_dir: Path) -> tuple[str, str, Path, subprocess.CompletedProcess]:
    cubin = out_dir / f"{dtype}_{arch}.cubin"
    cmd = [NVCC, "-std=c++17", f"-arch={arch}", "-cubin", "-o", str(cubin),
           str(SRC / V.source_file_name(dtype))]
    return dtype, arch, cubin, subprocess.run(cmd, capture_output=True, text=True)


def test_nvcc_builds_every_entry_point_for_sm80_and_sm90(tmp_path):
    jobs = [(d, a) for d in V.DTYPES for a in ("sm_80", "sm_90")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda job: _compile(*job, tmp_path), jobs))
    for dtype, arch, cubin, proc in results:
        assert proc.returncode == 0, f"nvcc {dtype} {arch} failed:\n{proc.stderr}"
        symbols = subprocess.run([READELF, "-sW", str(cubin)], capture_output=True, text=True, check=True).stdout
        defined = {line.split()[-1] for line in symbols.splitlines() if " FUNC " in line}
        expected = set(V.entry_names(dtype, 32)) | set(V.warp_free_names(dtype)) | set(V.cluster_names(dtype))
        missing = expected - defined
        assert not missing, f"{dtype} {arch} lacks {sorted(missing)[:5]} ..."
        wave64 = set(V.entry_names(dtype, 64)) & defined
        assert not wave64, "NVIDIA builds must not carry WARP=64 variants"
