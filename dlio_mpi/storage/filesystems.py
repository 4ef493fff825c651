"""The file systems a run uses, for the results, and the Lustre striping it sets.

`describe_filesystems` says for each folder its file-system type, mount point, device and
mount options (from /proc/self/mountinfo), its block size, and on Lustre its stripe layout
(`lfs getstripe`). `check_striping` and `apply_striping` apply `storage.lustre` to the data
folder with `lfs setstripe` before files are created. Nothing here runs a program unless the
folder is on Lustre, and `lfs` always runs under a timeout: a hung Lustre server cannot block
the job. Describing never raises; what cannot be found is "unknown".
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import UserError


class StripingKeys(Protocol):
    """What the striping functions read of a `storage.lustre` section (config's Lustre)."""

    stripe_count: int | None
    stripe_size: int | None
    pool: str | None
    required: bool

MOUNTINFO = "/proc/self/mountinfo"
LFS_TIMEOUT_SECONDS = 30.0
REQUIRED_KEY = "storage.lustre.required"

# statfs(2) f_type of the file systems HPC sites use (linux/magic.h and the vendors' headers);
# only consulted when mountinfo has no entry for a folder
FS_MAGIC = {
    0xEF53: "ext2/3/4", 0x58465342: "xfs", 0x0BD00BD0: "lustre", 0x47504653: "gpfs",
    0x6969: "nfs", 0x19830326: "beegfs", 0x01021994: "tmpfs", 0x9123683E: "btrfs",
    0x794C7630: "overlay", 0x00C36400: "ceph", 0x2FC12FC1: "zfs", 0x858458F6: "ramfs",
    0x65735546: "fuse", 0xFF534D42: "cifs", 0xFE534D42: "smb2", 0xAAD7AAEA: "panfs",
    0x20030528: "orangefs", 0x73717368: "squashfs",
}

# Keys of `lfs getstripe` output kept in a layout; file layouts carry an "lmm_" prefix
_LAYOUT_KEYS = ("stripe_count", "stripe_size", "pattern", "stripe_offset", "pool",
                "lcme_id", "lcme_mirror_id", "lcme_flags", "lcme_extent.e_start",
                "lcme_extent.e_end")
_LAYOUT_FIELD = re.compile(r"(?<!\S)(?:lmm_)?(" + "|".join(map(re.escape, _LAYOUT_KEYS))
                           + r"):[ \t]*([^\s,]+)")


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo (proc(5)), escapes decoded."""

    mount_point: str
    fs_type: str     # as the kernel names it: ext4, xfs, lustre, gpfs, nfs4, fuse.sshfs, ...
    source: str      # the device or server:/export
    options: str     # per-mount options (rw,relatime)
    fs_options: str  # the file system's own options (Lustre's flock, lazystatfs, ...)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts in mountinfo text, in its order; malformed lines are skipped."""
    mounts = []
    for line in text.split("\n"):  # not splitlines(): a path may hold a form feed
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue
        tail = fields[fields.index("-", 6) + 1:]  # fields before "-" are optional tags
        if len(tail) < 3:
            continue
        mounts.append(Mount(_unescape(fields[4]), _unescape(tail[0]), _unescape(tail[1]),
                            fields[5], tail[2]))
    return mounts


def read_mounts(mountinfo: str = MOUNTINFO) -> list[Mount]:
    """The mounts this process sees; none when the mountinfo file cannot be read."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as fp:
            return parse_mountinfo(fp.read())
    except OSError:
        return []


def nearest_existing(path: str) -> str:
    """`path` made absolute and real, or its nearest existing parent (a folder the run has
    not created yet is described by the file system it will be created on)."""
    path = os.path.abspath(path)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.path.realpath(path)


# File systems whose O_DIRECT goes through the page cache (tmpfs emulates it) or is refused
# (ramfs): a direct-I/O measurement there would be memory speed labelled O_DIRECT
NO_DIRECT_IO = ("tmpfs", "ramfs")


def check_direct_io_folder(folder: str, folder_key: str, odirect_key: str) -> None:
    """Refuse `odirect_key: true` for a folder (which may not exist yet: its nearest
    existing parent's file system) on a file system without real direct I/O; changes
    nothing."""
    where = nearest_existing(folder)
    fs_type = statfs_type(where)
    if fs_type in NO_DIRECT_IO:
        at = "" if where == os.path.realpath(os.path.abspath(folder)) else f" (at {where})"
        raise UserError(f"{odirect_key}: true, but {folder_key} {folder} is on {fs_type}{at}, "
                        "a file system without real direct I/O (tmpfs only emulates it "
                        f"through the page cache); set {odirect_key}: false or choose a "
                        "folder on another file system")


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding the existing, real `path`: the longest mount point above it, and
    of several at that point the last mounted (the one on top)."""
    best = None
    for mount in mounts:
        point = mount.mount_point
        inside = point == "/" or path == point or path.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.mount_point)):
            best = mount
    return best


def statfs_type(path: str) -> str:
    """The file-system type from statfs(2)'s f_type magic, or "unknown". f_type is the first
    field of struct statfs (a long on Linux); 256 bytes hold the whole struct."""
    buffer = ctypes.create_string_buffer(256)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.statfs(os.fsencode(path), buffer) != 0:
            return "unknown"
    except (OSError, AttributeError):  # no statfs in this C library
        return "unknown"
    magic = ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF
    return FS_MAGIC.get(magic, f"unknown (statfs magic {magic:#x})")


def _block_size(path: str) -> int | None:
    try:
        return os.statvfs(path).f_bsize
    except OSError:
        return None


# --------------------------------------------------------------------------- lfs
class LfsError(Exception):
    """lfs is missing, failed or did not answer in time; the message says which."""


def run_lfs(args: list[str], timeout: float = LFS_TIMEOUT_SECONDS) -> str:
    """The standard output of `lfs ARGS`, or LfsError. On a timeout lfs is killed and not
    waited for long: a process stuck on a dead server may not die, and must not hold us."""
    lfs = shutil.which("lfs")
    command = shlex.join(["lfs", *args])
    if lfs is None:
        raise LfsError(f"{command}: lfs is not on PATH (install the Lustre client tools)")
    try:
        proc = subprocess.Popen([lfs, *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace")
    except OSError as exc:  # not executable, not a program
        raise LfsError(f"{command}: cannot run {lfs}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        raise LfsError(f"{command}: no answer within {timeout:g} s (killed)") from None
    if proc.returncode != 0:
        why = err.strip() or out.strip() or f"exit status {proc.returncode}"
        raise LfsError(f"{command}: {why}")
    return out


def _value(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text  # raid0, mdt, EOF, a pool name, component flags


def parse_getstripe(text: str) -> dict[str, Any]:
    """The layout in `lfs getstripe` output: stripe_count, stripe_size, pattern,
    stripe_offset and pool as found, numbers as ints. Reads the one-line directory form
    ("stripe_count:  4 stripe_size:   1048576 pattern:       raid0 stripe_offset: -1"), the
    one-key-a-line file and YAML forms ("lmm_stripe_count:  4"), and composite layouts
    (PFL, mirrors: a list of "components", each with its extent and stripes). Empty when
    the text holds no layout."""
    layout: dict[str, Any] = {}
    components: list[dict[str, Any]] = []
    for key, value in _LAYOUT_FIELD.findall(text):
        if key == "lcme_id":
            components.append({})
        target = components[-1] if components else layout
        target.setdefault(key.removeprefix("lcme_"), _value(value))
    if components:
        layout["components"] = components
    return layout


def stripe_layout(path: str, timeout: float = LFS_TIMEOUT_SECONDS) -> dict[str, Any]:
    """The Lustre layout of `path`, parsed: a folder's default layout for new files (`lfs
    getstripe -d`), a file's own layout; {"error": ...} when lfs cannot say."""
    args = ["getstripe", *(["-d"] if os.path.isdir(path) else []), path]
    try:
        layout = parse_getstripe(run_lfs(args, timeout))
    except LfsError as exc:
        return {"error": str(exc)}
    return layout or {"error": f"{shlex.join(['lfs', *args])}: no layout in its output"}


# --------------------------------------------------------------------------- describing
def describe_filesystem(path: str, mounts: list[Mount],
                        timeout: float = LFS_TIMEOUT_SECONDS) -> dict[str, Any]:
    """What `describe_filesystems` says of one folder or file."""
    where = nearest_existing(path)
    mount = mount_of(where, mounts)
    info: dict[str, Any] = {"path": path, "described": where}
    if mount is None:
        info.update(type=statfs_type(where), mount_point="unknown", device="unknown")
    else:
        info.update(type=mount.fs_type, mount_point=mount.mount_point, device=mount.source,
                    mount_options=mount.options, fs_options=mount.fs_options)
    # statvfs f_bsize: the portable block size; GPFS reports its file-system block size
    # there (mmlsfs -B, which needs the admin tools), others their preferred I/O size
    info["block_size"] = _block_size(where)
    if info["type"] == "lustre":
        info["stripe_layout"] = stripe_layout(where, timeout)
    return info


def describe_filesystems(paths: dict[str, str], mountinfo: str = MOUNTINFO,
                         timeout: float = LFS_TIMEOUT_SECONDS) -> dict[str, dict[str, Any]]:
    """For each named path (e.g. {"data_folder": ..., "output_folder": ...}) its file
    system: type, mount point, device, mount options, block size and, on Lustre, the stripe
    layout. A path that does not exist yet is described by its nearest existing parent."""
    mounts = read_mounts(mountinfo)
    return {name: describe_filesystem(path, mounts, timeout) for name, path in paths.items()}


# --------------------------------------------------------------------------- striping
def setstripe_args(lustre: StripingKeys, folder: str) -> list[str]:
    """The arguments of `lfs setstripe` for a `storage.lustre` section, or [] when it sets
    no layout (only `required`)."""
    options = [(flag, value) for flag, value in (
        ("-c", lustre.stripe_count), ("-S", lustre.stripe_size), ("-p", lustre.pool))
        if value is not None]
    if not options:
        return []
    # an absolute path cannot be taken for an option, whatever the folder's name
    return ["setstripe", *(str(part) for pair in options for part in pair),
            os.path.abspath(folder)]


def check_striping(lustre: StripingKeys, folder: str, mountinfo: str = MOUNTINFO) -> dict[str, Any]:
    """Whether `storage.lustre` can be applied to `folder`, changing nothing: "planned" on
    Lustre with lfs at hand, else "not applicable" or "lfs not found" with a note, or
    UserError when storage.lustre.required is true."""
    where = nearest_existing(folder)
    mount = mount_of(where, read_mounts(mountinfo))
    fs_type = mount.fs_type if mount else statfs_type(where)
    args = setstripe_args(lustre, folder)
    result: dict[str, Any] = {"folder": os.path.abspath(folder), "filesystem": fs_type,
                              "command": shlex.join(["lfs", *args]) if args else None}
    if fs_type != "lustre":
        mounted = f" mounted at {mount.mount_point}" if mount else ""
        problem = f"{folder} is on {fs_type}{mounted}, not Lustre"
        return _refuse_or_note(lustre, result, "not applicable", problem)
    if shutil.which("lfs") is None:
        problem = f"{folder} is on Lustre but lfs is not on PATH"
        return _refuse_or_note(lustre, result, "lfs not found", problem)
    return {**result, "status": "planned"}


def _refuse_or_note(lustre: StripingKeys, result: dict[str, Any], status: str, problem: str
                    ) -> dict[str, Any]:
    if lustre.required:
        raise UserError(f"{REQUIRED_KEY} is true, but {problem}")
    return {**result, "status": status, "note": f"storage.lustre: {status}: {problem}"}


def apply_striping(lustre: StripingKeys, folder: str, mountinfo: str = MOUNTINFO,
                   timeout: float = LFS_TIMEOUT_SECONDS) -> dict[str, Any]:
    """Rank 0, before any file of the data set is created: set the default layout of the
    data `folder` (created when missing) with `lfs setstripe`, and read it back. Returns
    what was done: status ("applied", "checked" when no layout was asked for, "failed",
    or check_striping's), the command line, the layout read back and, where it differs from
    the request, "mismatch". Raises UserError when storage.lustre.required is true and the
    layout could not be set. Only files created afterwards take the layout."""
    result = check_striping(lustre, folder, mountinfo)
    if result["status"] != "planned":
        return result
    args = setstripe_args(lustre, folder)
    try:
        if _holds_entries(folder):
            result["note"] = (f"storage.lustre: {folder} already holds files or folders; "
                              "they keep their layout (new folders in it take the new one)")
        os.makedirs(folder, exist_ok=True)
        if args:
            run_lfs(args, timeout)
    except (OSError, LfsError) as exc:
        problem = str(exc) if isinstance(exc, LfsError) else f"{folder}: {exc.strerror or exc}"
        if lustre.required:
            raise UserError(f"{REQUIRED_KEY} is true, but {problem}") from None
        return {**result, "status": "failed", "note": f"storage.lustre: failed: {problem}"}
    layout = stripe_layout(os.path.abspath(folder), timeout)
    result.update(status="applied" if args else "checked", layout=layout)
    # stripe_count 0 asks for the file system's default; a pool may be named "fsname.pool"
    pool = lustre.pool and (lustre.pool.partition(".")[2] or lustre.pool)
    wanted = {"stripe_count": lustre.stripe_count or None, "stripe_size": lustre.stripe_size,
              "pool": pool}
    mismatch = {k: {"requested": v, "found": layout.get(k)} for k, v in wanted.items()
                if v is not None and "error" not in layout and layout.get(k) != v}
    if mismatch:
        result["mismatch"] = mismatch
    return result


def _holds_entries(folder: str) -> bool:
    """Whether `folder` exists and is not empty, reading at most one batch of entries."""
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is not None
    except (FileNotFoundError, NotADirectoryError):
        return False
