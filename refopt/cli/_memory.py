"""Keep freed memory in the process: glibc's malloc tuned for a training loop.

Every step of the GPT allocates and frees the same few dozen arrays of 0.1 to 6 MB (activations, their
cotangents, the attention weights). glibc's malloc serves blocks above its mmap threshold with fresh
``mmap`` pages and gives heap memory above its trim threshold back to the kernel on ``free``; the next step
then touches new pages again: about 24 000 minor page faults per default GPT step (some 95 MB zeroed by the
kernel): a whole default run took 4.0 s of system time without it and 1.7 s with it (2 cores; 40 to
50 ms per step in short runs on a heavily loaded machine). :func:`keep_freed_memory` sets the mmap threshold
to 32 MiB (glibc's largest; blocks below it come from the heap and are reused) and the trim threshold to
2 GiB, so the steps after the first reuse the same heap pages: about one fault per step. The price is that
the process keeps its peak heap until it exits, which for ``refopt train`` is the peak of one step.

Only the command line calls it (``refopt train``, ``refopt compare``); the library never changes the
process's allocator. Elsewhere than on glibc (macOS, musl) it does nothing.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1      # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20          # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = (1 << 31) - 1


def keep_freed_memory() -> bool:
    """Set glibc's mmap threshold to 32 MiB and its trim threshold to 2 GiB (see the module doc).
    Returns True when both were set, False on a platform without glibc's ``mallopt`` (nothing changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
