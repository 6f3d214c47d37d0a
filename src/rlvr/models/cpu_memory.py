"""Keeping freed CPU memory in the process, so that large tensors do not page-fault their memory in anew.

glibc's malloc gives memory back to the system as it is freed: every block of 32 MiB or more (its largest mmap
threshold) is a fresh mmap, unmapped on free, and the heap's top is trimmed whenever more than twice the current
mmap threshold is free there. A training micro-batch allocates and frees its activations, products and gradients
by the hundred, so each came back as new pages for the kernel to map and zero: on a 2-core AMD EPYC an fp32
multiply of two 32 MiB tensors took 12.4 ms instead of 2.3 ms (bench/results/cpu_memory.md), and the update of
the floor bench's configs B and E 21-28 % longer (bench/results/floor_memory.md). With mmap off and the heap's top
never trimmed, a freed block is reused by the next request that fits, as a caching allocator does on a GPU; peak
memory measured the same, but memory freed during a run goes back to the system only when the process ends. (The
top was first kept up to 2 GiB, mallopt's largest positive threshold: a micro-batch that frees more than that at
once, e.g. the logits and their gradient at a 152k vocabulary, gave it back and faulted 1-3 GB in anew the next
time: 66k page faults and 8.4 s a micro-batch instead of 2 and 7.3 s, bench/results/heap_trim_intel.md.) A caveat,
with or without the cap: a freed block with a small allocation after it stays a hole that the next request of the
same size (torch's aligned allocation asks a few bytes more) cannot take, so a loop allocating and freeing one 2.25
GiB tensor grew the heap by 2.3 GB most turns (2.3 -> 11.6 GB in six); the floor configs' update showed no growth.

Process-wide and irreversible in a process, so it follows the run's config (keep_cpu_memory), applied where the
Trainer picks its device. Other C libraries (musl) or platforms: nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
NEVER_TRIM = -1  # the trim threshold that turns trimming off (glibc's mallopt(3)): all that is free at the heap's top stays

_kept = False


def keep_freed_memory() -> bool:
    """Serve all of malloc from the heap and keep what is freed (mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1).
    True when in effect (now or from an earlier call), False where this is not glibc on Linux."""
    global _kept
    if _kept:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  glibc only: musl has a mallopt that does nothing
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _kept = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
    return _kept
