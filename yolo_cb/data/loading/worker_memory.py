"""A loader worker's heap: freed image memory is kept for the next sample instead of going back to the system."""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # blocks under this come from the heap (a 640 mosaic canvas is 4.9 MB); glibc's own ceiling for it
TRIM_THRESHOLD = 128 * 2**20  # free memory the heap keeps at its top before giving any back


def keep_freed_memory() -> bool:
    """Under glibc, set the worker's malloc so a sample's image-sized arrays reuse the memory the last sample freed.

    glibc's default hands blocks over ~1 MB back to the system when freed (or trims the heap), so every sample's warp,
    colour and flip outputs were fresh pages again: ~600 page faults per image at 640, costly in a VM, and which
    happened depended on the order of earlier frees (the same stage took 1.7 or 6 ms from one process to the next).
    Only for loader workers: processes that do nothing else. Returns whether it was set (False elsewhere than glibc)."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt  # glibc's name
    except (OSError, AttributeError):  # another C library (musl, macOS): its malloc keeps its own habits
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
