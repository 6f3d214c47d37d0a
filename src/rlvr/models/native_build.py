"""C kernels shipped as source, built once per machine with the system's C compiler and loaded with ctypes.

A kernel file (plain C, no torch headers, OpenMP for its threads; native_common.h holds what kernels share) compiles
in about a second. It is built with -march=native (or RLVR_NATIVE_MARCH's: the tests build the AVX2 and plain C paths so)
into the folder of the machine caches (~/.cache/rlvr/native/, RLVR_PRECISION_CACHE's folder), under a name that
digests the source (and the shared header), the flags, the compiler, the CPU
(machine_cache.cpu_identity) and torch's version, so a copied home folder or a new compiler builds again; written to a
temporary name and renamed into place, so processes building at once (ranks of one run) each load a whole file. Its
OpenMP runtime is torch's own libgomp (linked with torch's lib folder as its run path: a library of that name already
loaded is the one used), so the kernel's threads are torch's and the two never hold two thread pools.

Where it cannot build (no compiler, a compiler other than GCC, not Linux, a torch whose OpenMP runtime is not libgomp,
RLVR_NATIVE=off) `load`
returns None and `why_not` says why: callers keep their torch path. Nothing here is needed for a correct run.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from rlvr.models.machine_cache import cpu_identity, precision_cache_path

OFF_ENV = "RLVR_NATIVE"  # "off" (or 0 / false / no): no kernel is built or loaded
MARCH_ENV = "RLVR_NATIVE_MARCH"  # the -march the kernels build for (default native): x86-64-v3 builds the AVX2 paths
# on an AVX-512 machine, x86-64-v2 the plain C ones (tests/models/test_native_isa.py runs the kernels' tests so); a
# cluster whose nodes share a home folder but not a CPU model needs none: the CPU is in the built file's name
# -ffp-contract=off: a kernel computes the products and sums it writes, none fused into one multiply-add (GCC fuses
# them by default), so a kernel that must give torch's elementwise bits can (native_rotary.c); intrinsics still fuse
FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp", "-std=gnu11", "-shared", "-fPIC")
BUILD_TIMEOUT_S = 120
COMMON = Path(__file__).with_name("native_common.h")  # what the kernels share (#include "native_common.h"); every header
# of its folder (native_lanes.h: the vocabulary-wide kernels' vectors) is digested with each kernel
_WHY_NOT: dict[Path, str] = {}


def torch_lib_dir() -> Path:
    return Path(torch.__file__).resolve().parent / "lib"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def _compiler_version(cc: str) -> str:
    """`cc --version`'s text ("" where it gives none)."""
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def function(source: Path, name: str, argtypes: tuple, restype: Any = None) -> Any:
    """C function `name` of the kernel file `source` with its ctypes signature set, or None where the file does not
    build here (why_not says why)."""
    lib = load(source)
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = list(argtypes), restype
    return fn


def flags() -> tuple[str, ...]:
    """The compiler's flags: FLAGS and the -march of RLVR_NATIVE_MARCH (default native)."""
    return (*FLAGS, f"-march={os.environ.get(MARCH_ENV, '').strip() or 'native'}")


def why_not(source: Path) -> str | None:
    """Why `load(source)` gave None in this process (None when it loaded, or was not asked)."""
    return _WHY_NOT.get(Path(source))


@functools.cache
def load(source: Path) -> ctypes.CDLL | None:
    """The kernel file `source` built for this machine (once; later runs load the built file), or None (why_not)."""
    source = Path(source)
    reason = _unavailable()
    if reason is None:
        cc = _compiler()
        assert cc is not None  # _unavailable checked
        # a change to a shared header builds every kernel again
        text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(COMMON.parent.glob("*.h")))
        digest = hashlib.sha256(
            b"\0".join(
                [text, _compiler_version(cc).encode(), " ".join(flags()).encode(), cpu_identity().encode(), torch.__version__.encode()]
            )
        )
        built = precision_cache_path().parent / "native" / f"{source.stem}-{digest.hexdigest()[:16]}.so"
        for attempt in range(2):  # a file left broken (a full disk) is built again once
            if not built.exists() or attempt:
                reason = _build(cc, source, built)
                if reason is not None:
                    break
            try:
                return ctypes.CDLL(str(built))
            except OSError as e:
                reason = f"{built} did not load: {e}"
    _WHY_NOT[source] = str(reason)
    return None


def _unavailable() -> str | None:
    if os.environ.get(OFF_ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return f"{OFF_ENV}={os.environ[OFF_ENV]}"
    if not sys.platform.startswith("linux"):
        return f"native kernels are built on Linux only (this is {sys.platform})"
    if not (torch_lib_dir() / "libgomp.so.1").exists():
        return f"torch's OpenMP runtime is not libgomp ({torch_lib_dir()} has no libgomp.so.1)"
    cc = _compiler()
    if cc is None:
        return "no C compiler (cc, gcc or $CC) on the PATH"
    version = _compiler_version(cc)
    if "free software foundation" not in version.lower() or "clang" in version.lower():  # GCC's --version names its copyright holder
        first = version.split("\n")[0] or "no --version"
        return f"{cc} is not GCC ({first}): its -fopenmp would link another OpenMP runtime than torch's libgomp"
    return None


def _build(cc: str, source: Path, built: Path) -> str | None:
    """Compile `source` into `built` (renamed into place); None, or why it failed."""
    lib = torch_lib_dir()
    try:
        built.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create {built.parent}: {e}"
    tmp = built.with_name(f"{built.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    cmd = [cc, *flags(), f"-I{COMMON.parent}", str(source), "-o", str(tmp), f"-L{lib}", f"-Wl,-rpath,{lib}", "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{' '.join(cmd)} failed: {e}"
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        return f"{' '.join(cmd)} exited {done.returncode}: {(done.stderr or done.stdout).strip()[-2000:]}"
    os.replace(tmp, built)
    return None


def row_stride(t: torch.Tensor) -> int | None:
    """The row stride of t seen as [rows, last] (its leading dimensions collapsing into one, as a view would), the last
    dimension contiguous; None where they do not (the kernels take rows of contiguous elements)."""
    if t.dim() == 0 or t.stride(-1) != 1:
        return None
    for d in range(t.dim() - 2):
        if t.shape[d] > 1 and t.stride(d) != t.stride(d + 1) * t.shape[d + 1]:
            return None
    return t.stride(-2) if t.dim() > 1 else t.shape[-1]
