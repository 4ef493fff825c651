"""What a host can still give the job in memory: the smaller of the kernel's MemAvailable and
the room left in the job's memory cgroup (v2: memory.max less what the cgroup holds that
cannot be reclaimed; v1: memory.limit_in_bytes likewise), at every level of the cgroup's
hierarchy. Batch systems (Slurm's --mem, PBS, LSF) limit jobs by cgroup, and a job past its
limit is killed by the kernel without a word. Measured when the job starts, so what the ranks
already hold (Python, MPI) counts as in use; plan/memory.py checks the plan against it."""

from __future__ import annotations

import os
from dataclasses import dataclass

UNLIMITED = 2**62   # a cgroup limit at or above this is no limit (v1 writes 2^63 - 4096)


@dataclass(frozen=True)
class Budget:
    """The memory a node can still give the job, and how that was found: from `kind`
    ("MemAvailable", "cgroup v1", "cgroup v2", "physical memory"), for a cgroup its `folder`,
    `limit` and the bytes `in_use`; `shared_by` nodes (emulated nodes of one host) each get
    a share of the host's."""

    bytes: int
    kind: str
    folder: str = ""
    limit: int = 0
    in_use: int = 0
    shared_by: int = 1


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fp:  # small kernel files: a plain read cannot block
            return fp.read(1 << 16).decode("ascii", "replace")
    except OSError:
        return None


def mem_available(proc: str = "/proc") -> int | None:
    """The kernel's estimate of the memory new work can take without swapping."""
    text = _read(os.path.join(proc, "meminfo")) or ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            return int(value.split()[0]) * 1024
    return None


def _stat_field(text: str | None, names: tuple[str, ...]) -> int:
    values = {}
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        values[name] = value
    return sum(int(values[n]) for n in names if values.get(n, "").strip().isdigit())


# (limit file, usage file, the memory.stat fields of reclaimable page cache) per version
CGROUP_FILES = {
    2: ("memory.max", "memory.current", ("inactive_file", "active_file")),
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes",
        ("total_inactive_file", "total_active_file")),
}


def cgroup_room(folder: str, version: int) -> tuple[int, int] | None:
    """(limit, bytes held that cannot be reclaimed) of one cgroup folder; None when it sets
    no limit."""
    limit_name, usage_name, cache = CGROUP_FILES[version]
    limit = (_read(os.path.join(folder, limit_name)) or "").strip()
    if not limit.isdigit() or int(limit) >= UNLIMITED:
        return None  # "max", absent, or v1's "no limit"
    usage = (_read(os.path.join(folder, usage_name)) or "0").strip()
    reclaimable = _stat_field(_read(os.path.join(folder, "memory.stat")), cache)
    return int(limit), max(int(usage) - reclaimable if usage.isdigit() else 0, 0)


def cgroup_folders(proc: str = "/proc") -> list[tuple[int, str, str]]:
    """(version, mount point, path below it) of this process's memory cgroups: the v2
    hierarchy's where it has the memory controller, the v1 memory hierarchy's."""
    mounts: dict[int, str] = {}
    for line in (_read(os.path.join(proc, "self", "mountinfo")) or "").splitlines():
        fields = line.split(" - ")
        if len(fields) != 2:
            continue
        point, (fs_type, _, options) = fields[0].split()[4], (fields[1].split() + ["", ""])[:3]
        if fs_type == "cgroup2":
            mounts.setdefault(2, point)
        elif fs_type == "cgroup" and "memory" in options.split(","):
            mounts.setdefault(1, point)
    found = []
    for line in (_read(os.path.join(proc, "self", "cgroup")) or "").splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        version = 2 if number == "0" and controllers == "" else 1
        if version == 1 and "memory" not in controllers.split(","):
            continue
        if version in mounts:
            found.append((version, mounts[version], path))
    return found


def _levels(point: str, path: str) -> list[str]:
    """The folders of a cgroup and its ancestors up to the mount point; the mount point
    alone where the path is not below it (a cgroup namespace shows its own root)."""
    here = os.path.normpath(os.path.join(point, path.lstrip("/")))
    if not os.path.isdir(here):
        return [point]
    levels = []
    while True:
        levels.append(here)
        if here == point or len(here) <= len(point):
            return levels
        here = os.path.dirname(here)


def node_budget(proc: str = "/proc") -> Budget:
    """What this node can still give the job: MemAvailable and every memory cgroup level's
    room, the smallest."""
    available = mem_available(proc)
    best = Budget(available, "MemAvailable") if available is not None else None
    for version, point, path in cgroup_folders(proc):
        if version == 2 and "memory" not in (_read(os.path.join(point,
                                                                "cgroup.controllers")) or ""):
            continue  # a v2 hierarchy without the memory controller limits nothing
        for folder in _levels(point, path):
            room = cgroup_room(folder, version)
            if room is None:
                continue
            limit, held = room
            left = max(limit - held, 0)
            if best is None or left < best.bytes:
                best = Budget(left, f"cgroup v{version}", folder, limit, held)
    if best is None:  # no /proc: the physical memory, as before there were budgets
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            total = 0
        best = Budget(total, "physical memory")
    return best


