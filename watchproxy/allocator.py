"""Process-wide allocator settings, applied once by the command line before the loop starts.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` (128 KiB) with its own mmap, given
back to the system when freed, but by default it raises that threshold to the size of every
such block freed, up to 32 MiB. The hub reads each LIST page (about 1.2 MB for 500 pods) into
one buffer: after the first page is freed, the next pages come from the main heap instead, and
the holes they leave between the 2.4 KB lines of the cached objects stay resident, so a large
collection's sync grows RSS more (bench.collection; bench/README.md, "Figures behind the
code"). Setting it explicitly turns the moving threshold off. Other C libraries (musl) have no
mallopt: nothing is done there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("watchproxy")

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 128 * 1024


def fix_mmap_threshold() -> bool:
    """Pin glibc's mmap threshold; False where there is no glibc mallopt."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        log.debug("mallopt(M_MMAP_THRESHOLD) was refused; the allocator keeps its defaults")
        return False
    return True
