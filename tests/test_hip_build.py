"""The HIP build: CMake compiles src_hip/ into one code-object bundle per dtype for CDNA (wave64) and
RDNA (wave32) targets, every planned entry point is in each, and hipRTC compiles the same source on
the CPU. Needs a HIP compiler (Debian's `hipcc` package or ROCm), not an AMD GPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from portable_softmax import _hip
from portable_softmax import _variants as V
from portable_softmax._launch import inline_source

REPO = Path(__file__).resolve().parents[1]
HIPCONFIG = shutil.which("hipconfig") or next(
    (str(p) for p in (Path(os.environ.get("ROCM_PATH", "/opt/rocm")) / "bin" / "hipconfig",) if p.is_file()), None
)
CMAKE = shutil.which("cmake")
NINJA = shutil.which("ninja")
READELF = shutil.which("readelf") or shutil.which("llvm-readelf")

#: Targets to build: CDNA2 and the first CDNA3 ISA (wave64) and RDNA2 (wave32), which every ROCm
#: from 5.2 on builds; a newer toolchain's CI sets e.g. "gfx90a;gfx942;gfx1100;gfx1200".
ARCHS_ENV = "PORTABLE_SOFTMAX_TEST_HIP_ARCHS"
TARGETS = os.environ.get(ARCHS_ENV, "gfx90a;gfx940;gfx1030").split(";")
#: gfx9 (GCN, CDNA) runs wave64; gfx10 and newer (RDNA) wave32 by default
WAVE_SIZE = {t: 64 if t.startswith("gfx9") else 32 for t in TARGETS}

pytestmark = [
    pytest.mark.build,
    pytest.mark.skipif(HIPCONFIG is None, reason="no HIP compiler (apt-get install hipcc, or install ROCm)"),
    pytest.mark.skipif(CMAKE is None or NINJA is None, reason="cmake and ninja are needed (pip install cmake ninja)"),
    pytest.mark.skipif(READELF is None, reason="readelf (binutils) is needed to list the code objects' symbols"),
]


def expected_kernels(dtype: str) -> set[str]:
    """Every extern "C" kernel of a dtype an AMD build carries: both warp sizes, the warp-free ones, and
    none of the tiers that need asynchronous copies; the gradient kernels beside them."""
    return V.catalogue(dtype, "hip") | V.backward_catalogue(dtype, "hip")


def function_symbols(code_object: bytes, tmp: Path) -> set[str]:
    path = tmp / "code_object.elf"
    path.write_bytes(code_object)
    table = subprocess.run([READELF, "-sW", str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in table.splitlines() if " FUNC " in line and " GLOBAL " in line}


def wave_sizes(code_object: bytes) -> set[int]:
    """The .wavefront_size of every kernel, read from the code object's msgpack metadata."""
    return {m[0] for m in re.findall(rb"\.wavefront_size(.)", code_object, flags=re.S)}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _amd_gpus_present() -> bool:
    for tool in ("rocm_agent_enumerator", "rocminfo"):
        path = shutil.which(tool)
        if path:
            proc = subprocess.run([path], capture_output=True, text=True)
            if proc.returncode == 0 and set(re.findall(r"gfx[0-9a-f]+", proc.stdout)) - {"gfx000"}:
                return True
    return False


def _configure(build: Path, *defines: str) -> tuple[subprocess.CompletedProcess, dict]:
    cmd = [CMAKE, "-S", str(REPO), "-B", str(build), "-G", "Ninja", "-DPORTABLE_SOFTMAX_FASTLAUNCH=off", *defines]
    proc = run(cmd)
    return proc, json.loads((build / "build_info.json").read_text())


no_amd_gpu_here = pytest.mark.skipif(_amd_gpus_present(), reason="an AMD GPU is present: auto compiles for it here")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The package's kernels/ directory as `pip install` with PORTABLE_SOFTMAX_BACKEND=hip lays it out."""
    build, prefix = tmp_path_factory.mktemp("hip_build"), tmp_path_factory.mktemp("hip_install")
    run([CMAKE, "-S", str(REPO), "-B", str(build), "-G", "Ninja", "-DPORTABLE_SOFTMAX_BACKEND=hip",
         f"-DCMAKE_HIP_ARCHITECTURES={';'.join(WAVE_SIZE)}", f"-DCMAKE_INSTALL_PREFIX={prefix}"])
    # One translation unit per dtype; ninja compiles them in parallel, one per core.
    run([CMAKE, "--build", str(build), "--parallel", str(os.cpu_count() or 2)])
    run([CMAKE, "--install", str(build)])
    return prefix / "portable_softmax" / "kernels"


@pytest.mark.parametrize("dtype", list(V.DTYPES))
def test_each_bundle_holds_every_kernel_for_every_target(installed, dtype, tmp_path):
    image = (installed / _hip.code_object_name(dtype)).read_bytes()
    objects = _hip.bundle_code_objects(image)
    assert objects is not None, "not a clang offload bundle"
    assert sorted(objects) == sorted(WAVE_SIZE)
    for target, code in objects.items():
        missing = expected_kernels(dtype) - function_symbols(code, tmp_path)
        assert not missing, f"{dtype} {target} lacks {sorted(missing)[:5]} ..."
        assert wave_sizes(code) == {WAVE_SIZE[target]}, f"{target} kernels must run wave{WAVE_SIZE[target]}"


def test_build_records_its_targets_and_ships_the_source_for_hiprtc(installed):
    info = json.loads((installed / "build_info.json").read_text())
    assert info["backend"] == "hip" and info["hip_architectures"].split(";") == list(WAVE_SIZE)
    shipped = {p.name for p in (installed / "src_hip").iterdir()}
    assert {"portable.cuh", "softmax.cuh"} | {_hip.hip_source_name(d) for d in V.DTYPES} <= shipped


def test_default_architectures_cover_wave64_and_wave32(tmp_path):
    """Without CMAKE_HIP_ARCHITECTURES (and no AMD GPU to ask), CMake picks the defaults or, where the
    toolchain is too old for one, its nearest older relative: CDNA and RDNA are always both built."""
    _, info = _configure(tmp_path, "-DPORTABLE_SOFTMAX_BACKEND=hip")
    archs = info["hip_architectures"].split(";")
    allowed = {"gfx90a", "gfx942", "gfx1100", "gfx1200", "gfx940", "gfx1030"}
    if set(archs) - allowed:
        pytest.skip(f"this machine's own GPUs were chosen ({archs}); the default list applies elsewhere")
    assert any(a.startswith("gfx9") for a in archs), archs  # wave64 CDNA
    assert any(a.startswith(("gfx10", "gfx11", "gfx12")) for a in archs), archs  # wave32 RDNA
    # The defaults are not cached as if given by hand: configuring the same directory again in auto
    # mode, on this machine without a GPU, installs the source only.
    _, again = _configure(tmp_path, "-DPORTABLE_SOFTMAX_BACKEND=auto")
    assert again["backend"] == "none", again


@no_amd_gpu_here
def test_auto_build_without_a_gpu_installs_the_source_only(tmp_path):
    """A plain `pip install .` on a machine with hipcc and no GPU: no code objects, the source for hipRTC."""
    proc, info = _configure(tmp_path)
    assert info["backend"] == "none" and info["hip_architectures"] == ""
    assert "a HIP compiler found, but no GPU on this machine and no architectures given" in proc.stdout
    assert "CMAKE_HIP_ARCHITECTURES" in proc.stdout
    assert "CMAKE_HIP_COMPILER:" not in (tmp_path / "CMakeCache.txt").read_text()


@no_amd_gpu_here
def test_given_hip_architectures_compile_code_objects_without_a_gpu(tmp_path):
    proc, info = _configure(tmp_path, "-DCMAKE_HIP_ARCHITECTURES=gfx1030")
    assert info["backend"] == "hip" and info["hip_architectures"] == "gfx1030"
    assert re.search(r"compiling \d+ HIP code-object bundles \(f32 [a-z0-9 ]+\) for gfx1030", proc.stdout)


def test_hiprtc_compiles_the_packaged_source_on_the_cpu(tmp_path):
    """The run-time path for targets missing from the bundles, through the adapter's own hipRTC call."""
    try:
        rtc = _hip.HipRtc()
    except _hip.HipRtcError as e:
        pytest.skip(f"no hipRTC library: {str(e).splitlines()[0]}")
    dtype = "float32"
    source = inline_source(REPO / "src_hip" / _hip.hip_source_name(dtype))
    code = rtc.compile(source, _hip.hip_source_name(dtype), _hip.hiprtc_options("gfx1030"))
    assert code.startswith(b"\x7fELF")
    missing = expected_kernels(dtype) - function_symbols(code, tmp_path)
    assert not missing, f"hipRTC output lacks {sorted(missing)[:5]} ..."
    assert wave_sizes(code) == {32}
