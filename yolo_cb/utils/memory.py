"""How much memory this process may still take: the least of the machine's free memory, its cgroup's limit and its own
address-space limit (`ulimit -v`). Free memory alone passed checks that a container or a ulimit then failed."""

from __future__ import annotations

import os
import resource
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def available_memory() -> int | None:
    """Bytes this process may still allocate, or None where nothing can be read (not Linux / POSIX)."""
    found = [free for free in (_free_memory(), _cgroup_room(), _address_space_room()) if free is not None]
    return max(min(found), 0) if found else None


def _free_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_room() -> int | None:
    """The cgroup's limit minus its usage (cgroup v2, else v1); None without a limit."""
    for limit_file, usage_file in (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit = (CGROUP / limit_file).read_text().strip()
            usage = int((CGROUP / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:  # "max", or v1's huge number: no limit
            return int(limit) - usage
    return None


def _address_space_room() -> int | None:
    """RLIMIT_AS (`ulimit -v`) minus the address space already mapped; None without a limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        mapped = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        mapped = 0
    return soft - mapped
