"""Compiles the kernel source with the host C++ compiler into one emulation library.

The library holds the SIMT runtime, the probe kernels and every entry point of
``<src_dir>/softmax_<tag>.cu`` for the requested dtypes. It is cached under
``build/emulation/<key>/``, the key hashing the compiler, the flags and every
source file, so a later test run (or a mutated source tree) reuses or rebuilds
exactly what changed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from portable_softmax import _variants as V

EMULATION_DIR = Path(__file__).resolve().parent
REPO_ROOT = EMULATION_DIR.parents[1]
SRC_CUDA = REPO_ROOT / "src_cuda"
BUILD_ROOT = REPO_ROOT / "build" / "emulation"
LIBRARY_NAME = "libps_emulation.so"

RUNTIME_SOURCES = (EMULATION_DIR / "emulation_runtime.cpp", EMULATION_DIR / "probe_kernels.cpp")
# -O2: about 4.5 s of CPU per dtype, the emulated tests run fast; strict aliasing is off
# because the kernels reinterpret shared memory and vectors the way GPU compilers allow.
CXXFLAGS = ("-std=c++17", "-O2", "-fPIC", "-fno-strict-aliasing", "-U_FORTIFY_SOURCE", "-Wall",
            "-Wno-unknown-pragmas")
KERNEL_FLAGS = ("-DPORTABLE_SOFTMAX_EMULATION", "-x", "c++")
# -Bsymbolic: a mutated library loaded beside the real one binds to its own runtime.
LDFLAGS = ("-shared", "-Wl,-Bsymbolic", "-pthread")


class BuildError(RuntimeError):
    """The emulation library could not be built (a compile error in the sources, for one)."""


class CompilerUnavailable(BuildError):
    """No host C++ compiler here: the emulation cannot run on this machine at all."""


def compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise CompilerUnavailable(f"no host C++ compiler: {cxx!r} is not on PATH (set CXX)")
    return cxx


def _compiler_identity(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CompilerUnavailable(f"the host C++ compiler {cxx!r} does not run: {exc}") from exc


def _kernel_sources(src_dir: Path, dtypes: tuple[str, ...]) -> list[Path]:
    sources = [src_dir / V.source_file_name(d) for d in dtypes]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise BuildError(f"kernel sources missing: {', '.join(missing)}")
    return sources


def _kernel_flags(defines: tuple[str, ...]) -> tuple[str, ...]:
    return KERNEL_FLAGS + tuple(f"-D{d}" for d in defines)


def _build_key(cxx: str, src_dir: Path, dtypes: tuple[str, ...], defines: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for part in (_compiler_identity(cxx), " ".join(CXXFLAGS + _kernel_flags(defines) + LDFLAGS), ",".join(dtypes)):
        digest.update(part.encode() + b"\0")
    headers = sorted(src_dir.glob("*.cuh")) + sorted(EMULATION_DIR.glob("*.h"))
    for path in [*headers, *RUNTIME_SOURCES, *_kernel_sources(src_dir, dtypes)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def _compile(cxx: str, source: Path, obj: Path, src_dir: Path, defines: tuple[str, ...]) -> None:
    kernel = source.suffix == ".cu"
    cmd = [cxx, *CXXFLAGS, f"-I{EMULATION_DIR}", f"-I{src_dir}", *(_kernel_flags(defines) if kernel else ()),
           "-c", str(source), "-o", str(obj)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"compiling {source} failed:\n{' '.join(cmd)}\n{done.stderr[-6000:]}")


def build_library(src_dir: Path = SRC_CUDA, dtypes: tuple[str, ...] = tuple(V.DTYPES),
                  build_root: Path = BUILD_ROOT, jobs: int | None = None, defines: tuple[str, ...] = ()) -> Path:
    """Path of the emulation library for ``src_dir``, compiling it unless cached. ``defines`` are
    macros for the kernel sources (PS_EMULATE_ASYNC_COPY: the kernels' asynchronous-copy path)."""
    cxx = compiler()
    src_dir = Path(src_dir).resolve()
    defines = tuple(defines)
    target_dir = Path(build_root) / _build_key(cxx, src_dir, tuple(dtypes), defines)
    library = target_dir / LIBRARY_NAME
    if library.is_file():
        return library
    build_root = Path(build_root)
    build_root.mkdir(parents=True, exist_ok=True)
    with open(build_root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test runs build once
        if library.is_file():
            return library
        with tempfile.TemporaryDirectory(dir=build_root, prefix=".building-") as tmp:
            sources = [*_kernel_sources(src_dir, tuple(dtypes)), *RUNTIME_SOURCES]
            objects = [Path(tmp) / f"{s.stem}.o" for s in sources]
            with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
                futures = [pool.submit(_compile, cxx, s, o, src_dir, defines)
                           for s, o in zip(sources, objects, strict=True)]
                for future in futures:
                    future.result()
            staged = Path(tmp) / LIBRARY_NAME
            cmd = [cxx, *LDFLAGS, "-o", str(staged), *map(str, objects)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise BuildError(f"linking the emulation library failed:\n{' '.join(cmd)}\n{done.stderr[-6000:]}")
            target_dir.mkdir(parents=True, exist_ok=True)
            os.replace(staged, library)
    return library
