"""nvcc compiles the kernel source for sm_80 and sm_90, and every planned entry point is in it; CMake
compiles code objects ahead of time only when a build asks for them (a GPU, architectures, a backend)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from portable_softmax import _variants as V

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src_cuda"
NVCC = shutil.which("nvcc")
READELF = shutil.which("readelf")
CMAKE = shutil.which("cmake")
NINJA = shutil.which("ninja")

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
        expected = V.catalogue(dtype, "cuda") | V.backward_catalogue(dtype, "cuda")
        missing = expected - defined
        assert not missing, f"{dtype} {arch} lacks {sorted(missing)[:5]} ..."
        wave64 = (set(V.entry_names(dtype, 64)) - expected) & defined
        assert not wave64, "NVIDIA builds must not carry WARP=64 variants"


def _nvidia_gpu_present() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    proc = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return proc.returncode == 0 and "GPU " in proc.stdout


def _configure(build: Path, *defines: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Configure the project as pip would (no build), returning CMake's output and build_info.json."""
    generator = ["-G", "Ninja"] if NINJA else []
    cmd = [CMAKE, "-S", str(REPO), "-B", str(build), *generator, "-DPORTABLE_SOFTMAX_FASTLAUNCH=off", *defines]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    info_path = build / "build_info.json"
    return proc, json.loads(info_path.read_text()) if info_path.exists() else None


needs_cmake = pytest.mark.skipif(CMAKE is None, reason="cmake is not installed (pip install cmake)")
no_gpu_here = pytest.mark.skipif(_nvidia_gpu_present(), reason="nvidia-smi sees a GPU: auto compiles for it here")


@needs_cmake
@no_gpu_here
def test_auto_build_without_a_gpu_installs_the_source_only_and_says_how_to_get_code_objects(tmp_path):
    proc, info = _configure(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert info is not None and info["backend"] == "none" and info["cuda_architectures"] == ""
    assert re.search(r"installing the kernel source only \(nvcc (and a HIP compiler )?found, but no GPU", proc.stdout)
    assert "CMAKE_CUDA_ARCHITECTURES" in proc.stdout and "PORTABLE_SOFTMAX_AOT=on" in proc.stdout
    # the CUDA language was never enabled: its compiler checks are what a source-only build saves
    assert "CMAKE_CUDA_COMPILER:" not in (tmp_path / "CMakeCache.txt").read_text()


@needs_cmake
@no_gpu_here
def test_given_architectures_compile_code_objects_without_a_gpu(tmp_path):
    proc, info = _configure(tmp_path, "-DCMAKE_CUDA_ARCHITECTURES=90-real")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert info["backend"] == "cuda" and info["cuda_architectures"] == "90-real"
    assert re.search(r"compiling \d+ CUDA fatbins \(f32 [a-z0-9 ]+\) for 90-real", proc.stdout), proc.stdout


@needs_cmake
def test_aot_off_wins_over_a_named_backend(tmp_path):
    proc, info = _configure(tmp_path, "-DPORTABLE_SOFTMAX_BACKEND=cuda", "-DPORTABLE_SOFTMAX_AOT=off")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert info["backend"] == "none"
    assert "PORTABLE_SOFTMAX_AOT=off" in proc.stdout


@needs_cmake
@pytest.mark.parametrize("define", ["PORTABLE_SOFTMAX_AOT=sometimes", "PORTABLE_SOFTMAX_BACKEND=metal"])
def test_an_unknown_build_option_value_is_one_clear_error(tmp_path, define):
    proc, info = _configure(tmp_path, f"-D{define}")
    assert proc.returncode != 0 and info is None
    name, value = define.split("=")
    assert f"{name}={value}: use one of" in proc.stderr, proc.stderr
