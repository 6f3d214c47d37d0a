"""Subnormal floats flushed to zero on the CPU (FTZ and DAZ), in the calling thread and in its OpenMP threads.

Why: an x86 CPU takes a slow path (a microcode assist, ~100 cycles) for an operation whose input or result is a
subnormal float (below 1.2e-38 in fp32). The gradient of the logits holds p g for every vocabulary entry, and the
probabilities of unlikely tokens reach the bottom of fp32's range, so the lm_head's backward products meet such
values by the million: on an Intel Xeon (2 threads) a training micro-batch of a 44M Llama with a 32000-token
vocabulary (bench/floor.py shape S1) spent 74 of its 79 s in the product of the logits' gradient [7040, 32000] with
the lm_head's weight (~3 GFLOP/s); flushed, the whole micro-batch took 8.0 s, with the same gradients bit for bit
(bench/results/denormals_intel.md). Flushed, a subnormal result is 0 and a subnormal input reads as 0: a change below
1.2e-38 per value, far under the rounding of any sum that holds a normal number.

torch.set_flush_denormal sets the flags of the calling thread only, but the products and elementwise ops run on
OpenMP's threads, each with its own flags (a set on the main thread changed nothing at 2 threads; at 1 thread the
product ran 9x faster). So `flushing_denormals` takes the calling thread's floating-point environment with the flags
set (fegetenv) and sets it in every thread of the calling thread's OpenMP team (fesetenv run as a parallel region
through GOMP_parallel, the entry `#pragma omp parallel` compiles to, in the OpenMP library torch loaded): the
threads torch's ops, MKL and oneDNN run on from this thread. Each thread that calls into torch has its own team, so
a thread that wants the flags enters the block itself: the trainer's update does (flush_denormals); generation, on
any thread, runs as before (its times and tokens were the same either way). On leaving, the environment from before
is set back in the calling thread and its team.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator

import torch

FENV_BYTES = 512  # room for any platform's fenv_t (glibc x86-64: 32 bytes, aarch64: 8)


@functools.cache
def _libraries() -> tuple[ctypes.CDLL | None, ctypes.CDLL | None]:
    """(the OpenMP library torch loaded, libm), each None where it is not found (no OpenMP, not glibc, not Linux)."""
    omp = libm = None
    with contextlib.suppress(OSError, AttributeError):
        libm_name = ctypes.util.find_library("m")
        libm = ctypes.CDLL(libm_name) if libm_name else None
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libgomp" in line or "libiomp" in line}
        if len(paths) == 1:
            omp = ctypes.CDLL(paths.pop())
            omp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
            omp.GOMP_parallel.restype = None
    return omp, libm


def _set_in_team(omp: ctypes.CDLL | None, libm: ctypes.CDLL, env: ctypes.Array) -> None:
    """The floating-point environment `env` in the calling thread and every thread of its OpenMP team."""
    libm.fesetenv(env)
    if omp is not None:
        omp.GOMP_parallel(ctypes.cast(libm.fesetenv, ctypes.c_void_p), ctypes.addressof(env), torch.get_num_threads(), 0)


@contextlib.contextmanager
def flushing_denormals(on: bool = True) -> Iterator[bool]:
    """Within the block, subnormal floats are flushed to zero in this thread and its OpenMP threads (module docstring);
    yields whether they are (False: `on` false, a CPU without the flags, or no OpenMP library found, where only
    this thread's flags are set: that helps a run at one thread). The flags from before are set back on leaving."""
    if not on:
        yield False
        return
    omp, libm = _libraries()
    if libm is None:  # not glibc: torch's own switch, for this thread
        took = torch.set_flush_denormal(True)
        try:
            yield False
        finally:
            if took:
                torch.set_flush_denormal(False)
        return
    before, flushed = ctypes.create_string_buffer(FENV_BYTES), ctypes.create_string_buffer(FENV_BYTES)
    libm.fegetenv(before)
    if not torch.set_flush_denormal(True):  # a CPU without the flags
        yield False
        return
    libm.fegetenv(flushed)
    _set_in_team(omp, libm, flushed)
    try:
        yield omp is not None
    finally:
        _set_in_team(omp, libm, before)
