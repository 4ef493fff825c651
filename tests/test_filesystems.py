"""File systems in the results and Lustre striping (filesystems.py). Lustre is absent here: a
mountinfo file naming a folder's mount "lustre" stands in for the mount, and a recording `lfs`
script first on PATH for the Lustre tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlio_mpi.config import load_config
from dlio_mpi.errors import UserError
from dlio_mpi.storage.filesystems import (
    apply_striping,
    check_striping,
    describe_filesystems,
    mount_of,
    nearest_existing,
    parse_getstripe,
    parse_mountinfo,
    read_mounts,
    stripe_layout,
)

# --------------------------------------------------------------------------- lfs output
# `lfs getstripe -d DIR` before Lustre 2.10 (no pattern) and after, `lfs getstripe FILE`,
# `lfs getstripe -y` and a composite (PFL) default layout, as lfs prints them
OLD_DIR = "stripe_count:   1 stripe_size:    1048576 stripe_offset:  -1\n"
NEW_DIR = ("stripe_count:  4 stripe_size:   1048576 pattern:       raid0 stripe_offset: -1 "
           "pool:          flash\n")
FILE = """/lus/testfs/data/img_0_of_8.npz
lmm_stripe_count:  2
lmm_stripe_size:   4194304
lmm_pattern:       raid0
lmm_layout_gen:    0
lmm_stripe_offset: 1
lmm_pool:          flash
\tobdidx\t\t objid\t\t objid\t\t group
\t     1\t             2\t          0x2\t             0
\t     0\t             2\t          0x2\t             0

"""
YAML = "stripe_count:  8\nstripe_size:   16777216\npattern:       raid0\nstripe_offset: -1\n"
PFL_DIR = """\
  lcm_layout_gen:    0
  lcm_mirror_count:  1
  lcm_entry_count:   2
    lcme_id:             N/A
    lcme_mirror_id:      N/A
    lcme_flags:          0
    lcme_extent.e_start: 0
    lcme_extent.e_end:   1048576
      stripe_count:  1       stripe_size:   1048576       pattern:       raid0 \
      stripe_offset: -1

    lcme_id:             N/A
    lcme_mirror_id:      N/A
    lcme_flags:          0
    lcme_extent.e_start: 1048576
    lcme_extent.e_end:   EOF
      stripe_count:  -1       stripe_size:   4194304       pattern:       raid0 \
      stripe_offset: -1

"""
MIRRORED_FILE = """/lus/testfs/file1
  lcm_layout_gen:    2
  lcm_mirror_count:  2
  lcm_entry_count:   2
    lcme_id:             65537
    lcme_mirror_id:      1
    lcme_flags:          init
    lcme_extent.e_start: 0
    lcme_extent.e_end:   EOF
      lmm_stripe_count:  2
      lmm_stripe_size:   4194304
      lmm_pattern:       raid0
      lmm_layout_gen:    0
      lmm_stripe_offset: 1
      lmm_pool:          flash
      lmm_objects:
      - 0: { l_ost_idx: 1, l_fid: [0x100010000:0x2:0x0] }
      - 1: { l_ost_idx: 0, l_fid: [0x100000000:0x2:0x0] }

    lcme_id:             131074
    lcme_mirror_id:      2
    lcme_flags:          init
    lcme_extent.e_start: 0
    lcme_extent.e_end:   EOF
      lmm_stripe_count:  6
      lmm_stripe_size:   4194304
      lmm_pattern:       raid0
      lmm_layout_gen:    0
      lmm_stripe_offset: 3
      lmm_pool:          archive
"""


def _stripes(count, size, offset, pattern=None, pool=None) -> dict:
    layout = {"stripe_count": count, "stripe_size": size, "stripe_offset": offset}
    layout.update({k: v for k, v in (("pattern", pattern), ("pool", pool)) if v is not None})
    return layout


@pytest.mark.parametrize("text,expected", [
    (OLD_DIR, _stripes(1, 1048576, -1)),
    (NEW_DIR, _stripes(4, 1048576, -1, "raid0", "flash")),
    ("stripe_count:  2 stripe_size:   4194304 pattern:       0 stripe_offset: -1\n",
     _stripes(2, 4194304, -1, 0)),
    (FILE, _stripes(2, 4194304, 1, "raid0", "flash")),
    (YAML, _stripes(8, 16777216, -1, "raid0")),
    ("", {}),
    ("/lus/testfs/data has no stripe info\n", {}),
])
def test_getstripe_output_of_every_lfs_form_is_parsed(text, expected):
    assert parse_getstripe(text) == expected


def test_composite_layouts_are_parsed_per_component():
    pfl = parse_getstripe(PFL_DIR)
    assert pfl == {"components": [
        {"id": "N/A", "mirror_id": "N/A", "flags": 0, "extent.e_start": 0,
         "extent.e_end": 1048576, **_stripes(1, 1048576, -1, "raid0")},
        {"id": "N/A", "mirror_id": "N/A", "flags": 0, "extent.e_start": 1048576,
         "extent.e_end": "EOF", **_stripes(-1, 4194304, -1, "raid0")}]}
    mirrors = parse_getstripe(MIRRORED_FILE)["components"]
    assert [(m["mirror_id"], m["stripe_count"], m["pool"]) for m in mirrors] == [
        (1, 2, "flash"), (2, 6, "archive")]  # the objects' lines are not read as a layout


# --------------------------------------------------------------------------- mountinfo
MOUNTINFO = r"""22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
60 27 0:50 / /mnt/my\040data rw,nosuid shared:30 master:2 - nfs4 srv:/export\040x rw,vers=4.2
61 27 0:51 / /mnt/a rw - xfs /dev/sdb rw
62 27 0:52 / /mnt/ab rw - tmpfs tmpfs rw
63 27 0:53 / /mnt/stacked rw - ext4 /dev/sdc rw
64 63 0:54 / /mnt/stacked rw - lustre 10.0.0.1@o2ib:/testfs rw,flock,lazystatfs
a line that is not a mount
65 27 0:55 / /mnt/short rw -
"""


def test_mountinfo_fields_optional_tags_and_octal_escapes():
    mounts = parse_mountinfo(MOUNTINFO)
    assert [m.mount_point for m in mounts] == ["/proc", "/", "/mnt/my data", "/mnt/a",
                                               "/mnt/ab", "/mnt/stacked", "/mnt/stacked"]
    nfs = mounts[2]
    assert (nfs.fs_type, nfs.source, nfs.options, nfs.fs_options) == (
        "nfs4", "srv:/export x", "rw,nosuid", "rw,vers=4.2")


@pytest.mark.parametrize("path,mount_point,fs_type", [
    ("/", "/", "ext4"),
    ("/work/main", "/", "ext4"),
    ("/mnt/my data/x", "/mnt/my data", "nfs4"),
    ("/mnt/a", "/mnt/a", "xfs"),
    ("/mnt/ab/c", "/mnt/ab", "tmpfs"),    # /mnt/a is not a parent of /mnt/ab
    ("/mnt/abc", "/", "ext4"),
    ("/mnt/stacked/d", "/mnt/stacked", "lustre"),  # the mount on top is the later line
])
def test_the_longest_mount_point_above_a_path_holds_it(path, mount_point, fs_type):
    mount = mount_of(path, parse_mountinfo(MOUNTINFO))
    assert (mount.mount_point, mount.fs_type) == (mount_point, fs_type)


def test_nearest_existing_parent(tmp_path):
    assert nearest_existing(str(tmp_path / "a" / "b" / "c")) == os.path.realpath(tmp_path)
    (tmp_path / "a").mkdir()
    assert nearest_existing(str(tmp_path / "a" / "b")) == os.path.realpath(tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "link")
    assert nearest_existing(str(tmp_path / "link" / "b")) == os.path.realpath(tmp_path / "a")
    assert nearest_existing("relative/not/there") == os.path.realpath(".")


def _df(path) -> tuple[str, str]:
    """(type, mount point) as coreutils' df sees them."""
    out = subprocess.run(["df", "--output=fstype,target", str(path)], capture_output=True,
                         text=True, check=True).stdout.splitlines()[1]
    fs_type, target = out.split(maxsplit=1)
    return fs_type, target


def test_real_folders_are_described_as_df_sees_them(tmp_path):
    paths = {"work": "/work/main", "tmp": str(tmp_path), "later": str(tmp_path / "x" / "y"),
             "procfs": "/proc/self"}
    described = describe_filesystems(paths)
    for name in ("work", "tmp", "later"):
        info = described[name]
        assert (info["type"], info["mount_point"]) == _df(info["described"]), name
        assert info["device"] and info["mount_options"].startswith(("rw", "ro"))
        assert info["block_size"] == os.statvfs(info["described"]).f_bsize
        assert "stripe_layout" not in info
    assert described["later"]["described"] == os.path.realpath(tmp_path)
    assert described["procfs"]["type"] == "proc"
    json.dumps(described)  # goes into summary.json as it is


@pytest.fixture
def tmpfs_mount(tmp_path):
    """A tmpfs mounted at a folder whose name needs mountinfo's escapes (root only)."""
    point = tmp_path / "tmp fs\tmount"
    point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "dlio test", str(point)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield point
    subprocess.run(["umount", "-l", str(point)], check=True)


def test_a_tmpfs_mounted_here_is_found_by_its_escaped_name(tmpfs_mount, tmp_path):
    info = describe_filesystems({"data": str(tmpfs_mount / "data" / "train")})["data"]
    assert info["type"] == "tmpfs"
    assert info["mount_point"] == str(tmpfs_mount)
    assert info["device"] == "dlio test"
    assert info["described"] == str(tmpfs_mount)
    beside = describe_filesystems({"beside": str(tmp_path)})["beside"]
    assert beside["mount_point"] != str(tmpfs_mount)


def test_without_mountinfo_the_type_comes_from_statfs(tmp_path):
    missing = str(tmp_path / "no-mountinfo")
    info = describe_filesystems({"dev_shm": "/dev/shm", "root": "/"}, mountinfo=missing)
    assert info["dev_shm"]["type"] == "tmpfs"  # TMPFS_MAGIC
    assert info["root"]["type"] == {"ext4": "ext2/3/4"}.get(_df("/")[0], _df("/")[0])
    assert info["root"]["mount_point"] == "unknown"
    assert read_mounts(missing) == []


# --------------------------------------------------------------------------- striping
FAKE_LFS = """#!{python}
import json, os, sys, time
with open(os.environ["FAKE_LFS_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
time.sleep(float(os.environ.get("FAKE_LFS_SLEEP", "0")))
if sys.argv[1] == os.environ.get("FAKE_LFS_FAIL"):
    sys.stderr.write("lfs " + sys.argv[1] + ": error: Invalid argument\\n")
    sys.exit(22)
if sys.argv[1] == "getstripe":
    sys.stdout.write(os.environ["FAKE_LFS_GETSTRIPE"])
"""


class FakeLustre:
    """A folder that mountinfo says is a Lustre mount, and a recording lfs on PATH."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mount = Path(os.path.realpath(tmp_path)) / "lus testfs"  # a name lfs must
        self.mount.mkdir()                                             # get as one argument
        escaped = str(self.mount).replace(" ", r"\040")
        self.mountinfo = tmp_path / "mountinfo"
        self.mountinfo.write_text(
            Path("/proc/self/mountinfo").read_text()
            + f"99 27 0:99 / {escaped} rw,relatime - lustre 10.0.0.1@o2ib:/testfs rw,flock\n")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        lfs = bin_dir / "lfs"
        lfs.write_text(FAKE_LFS.format(python=sys.executable))
        lfs.chmod(0o755)
        self.log = tmp_path / "lfs.log"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_LFS_LOG", str(self.log))
        self.getstripe_prints(NEW_DIR)

    def getstripe_prints(self, text: str) -> None:
        self.monkeypatch.setenv("FAKE_LFS_GETSTRIPE", text)

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def lustre(tmp_path, monkeypatch) -> FakeLustre:
    return FakeLustre(tmp_path, monkeypatch)


def lustre_section(*overrides: str):
    return load_config("demo", [f"storage.lustre.{o}" for o in overrides]).storage.lustre


@pytest.mark.parametrize("overrides,options", [
    (["stripe_count=4", "stripe_size=1048576"], ["-c", "4", "-S", "1048576"]),
    (["stripe_count=-1"], ["-c", "-1"]),
    (["stripe_size=4M", "pool=flash"], ["-S", "4194304", "-p", "flash"]),
    (["stripe_count=16", "stripe_size=64k", "pool=testfs.ssd", "required=true"],
     ["-c", "16", "-S", "65536", "-p", "testfs.ssd"]),
])
def test_setstripe_command_lines(lustre, overrides, options):
    data = lustre.mount / "dlio" / "data"  # created by apply_striping, then striped
    result = apply_striping(lustre_section(*overrides), str(data), str(lustre.mountinfo))
    assert lustre.calls() == [["setstripe", *options, str(data)], ["getstripe", "-d", str(data)]]
    assert data.is_dir()
    assert result["status"] == "applied"
    assert result["command"] == "lfs setstripe " + " ".join(options) + f" '{data}'"
    assert result["layout"] == _stripes(4, 1048576, -1, "raid0", "flash")  # as lfs printed


def test_the_layout_read_back_is_compared_with_the_request(lustre):
    data = str(lustre.mount / "data")
    matching = apply_striping(lustre_section("stripe_count=4", "stripe_size=1M",
                                             "pool=testfs.flash"), data, str(lustre.mountinfo))
    assert "mismatch" not in matching
    lustre.getstripe_prints(OLD_DIR)  # lfs kept the file system's default
    differing = apply_striping(lustre_section("stripe_count=8", "stripe_size=1M"), data,
                               str(lustre.mountinfo))
    assert differing["mismatch"] == {"stripe_count": {"requested": 8, "found": 1}}
    assert "already holds" not in differing.get("note", "")


def test_a_section_without_a_layout_only_reads_it(lustre):
    result = apply_striping(lustre_section("required=true"), str(lustre.mount),
                            str(lustre.mountinfo))
    assert lustre.calls() == [["getstripe", "-d", str(lustre.mount)]]
    assert (result["status"], result["command"]) == ("checked", None)


def test_a_folder_with_files_keeps_their_layout_and_says_so(lustre):
    (lustre.mount / "train").mkdir()
    result = apply_striping(lustre_section("stripe_count=2"), str(lustre.mount),
                            str(lustre.mountinfo))
    assert result["status"] == "applied"
    assert "already holds files or folders; they keep their layout" in result["note"]


def test_lfs_failing_is_a_note_or_the_required_error(lustre, monkeypatch):
    monkeypatch.setenv("FAKE_LFS_FAIL", "setstripe")
    data = str(lustre.mount / "data")
    result = apply_striping(lustre_section("pool=nosuchpool"), data, str(lustre.mountinfo))
    assert result["status"] == "failed"
    assert "lfs setstripe: error: Invalid argument" in result["note"]
    with pytest.raises(UserError, match=r"storage\.lustre\.required is true, but lfs "
                                        r"setstripe -p nosuchpool .*Invalid argument"):
        apply_striping(lustre_section("pool=nosuchpool", "required=true"), data,
                       str(lustre.mountinfo))


def test_a_hung_lfs_is_killed_after_the_timeout(lustre, monkeypatch):
    monkeypatch.setenv("FAKE_LFS_SLEEP", "60")
    start = time.monotonic()
    result = apply_striping(lustre_section("stripe_count=2"), str(lustre.mount),
                            str(lustre.mountinfo), timeout=0.5)
    assert time.monotonic() - start < 10
    assert result["status"] == "failed"
    assert "no answer within 0.5 s (killed)" in result["note"]
    layout = describe_filesystems({"data": str(lustre.mount)}, str(lustre.mountinfo),
                                  timeout=0.5)["data"]["stripe_layout"]
    assert "no answer within 0.5 s" in layout["error"]


def test_lfs_missing_on_lustre_is_a_note_or_the_required_error(lustre, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = apply_striping(lustre_section("stripe_count=2"), str(lustre.mount),
                            str(lustre.mountinfo))
    assert result["status"] == "lfs not found"
    assert "is on Lustre but lfs is not on PATH" in result["note"]
    with pytest.raises(UserError, match=r"storage\.lustre\.required is true, but .* is on "
                                        "Lustre but lfs is not on PATH"):
        check_striping(lustre_section("stripe_count=2", "required=true"), str(lustre.mount),
                       str(lustre.mountinfo))
    layout = describe_filesystems({"data": str(lustre.mount)},
                                  str(lustre.mountinfo))["data"]["stripe_layout"]
    assert "lfs is not on PATH" in layout["error"]


def test_an_lfs_that_cannot_run_is_reported_not_raised(lustre, tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "lfs").write_bytes(b"\x7fELF not really")
    (broken / "lfs").chmod(0o755)
    monkeypatch.setenv("PATH", str(broken))
    layout = describe_filesystems({"data": str(lustre.mount)},
                                  str(lustre.mountinfo))["data"]["stripe_layout"]
    assert layout["error"].startswith(f"lfs getstripe -d '{lustre.mount}': cannot run ")


def test_off_lustre_striping_is_not_applicable_and_runs_nothing(lustre, tmp_path):
    data = tmp_path / "ext4 data"  # beside the fake Lustre mount
    result = apply_striping(lustre_section("stripe_count=4"), str(data), str(lustre.mountinfo))
    fs_type = _df(tmp_path)[0]
    assert result["status"] == "not applicable"
    assert result["note"] == (f"storage.lustre: not applicable: {data} is on {fs_type} "
                              f"mounted at {_df(tmp_path)[1]}, not Lustre")
    assert result["command"] == f"lfs setstripe -c 4 '{data}'"  # what would have run
    assert not data.exists() and lustre.calls() == []
    with pytest.raises(UserError) as info:
        apply_striping(lustre_section("stripe_count=4", "required=true"), str(data),
                       str(lustre.mountinfo))
    assert str(info.value) == (f"storage.lustre.required is true, but {data} is on {fs_type} "
                               f"mounted at {_df(tmp_path)[1]}, not Lustre")
    assert lustre.calls() == []


def test_lustre_folders_and_files_are_described_with_their_layout(lustre):
    data_file = lustre.mount / "img_0_of_8.npz"
    data_file.write_bytes(b"x")
    described = describe_filesystems(
        {"data_folder": str(lustre.mount / "not yet"), "data_file": str(data_file)},
        str(lustre.mountinfo))
    folder = described["data_folder"]
    assert (folder["type"], folder["mount_point"], folder["device"], folder["fs_options"]) == (
        "lustre", str(lustre.mount), "10.0.0.1@o2ib:/testfs", "rw,flock")
    assert folder["stripe_layout"] == _stripes(4, 1048576, -1, "raid0", "flash")
    assert lustre.calls() == [["getstripe", "-d", str(lustre.mount)],
                              ["getstripe", str(data_file)]]  # a file's own layout
    assert stripe_layout(str(data_file))["stripe_count"] == 4


# --------------------------------------------------------------------------- the plan
def plan_text(overrides=(), filesystems=None, striping=None) -> str:
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.plan.render import describe_plan

    cfg = load_config("demo", list(overrides))
    return describe_plan(derive_plan(cfg, 2), cfg, filesystems, striping)


def lines_of(text: str, head: str) -> list[str]:
    """The plan lines headed `head`, without their 16-column head."""
    return [line[16:] for line in text.splitlines() if line.startswith(head)]


def test_the_plan_names_the_striping_asked_for_before_the_storage_is_seen():
    data = os.path.abspath("data/demo")
    assert lines_of(plan_text(), "striping") == []
    text = plan_text(["storage.lustre.stripe_count=-1", "storage.lustre.stripe_size=4M",
                      "storage.lustre.required=true"])
    assert lines_of(text, "striping") == [
        f"storage.lustre: lfs setstripe -c -1 -S 4194304 {data} if the data folder is on "
        "Lustre, before files are created; files already there keep their layout "
        "(storage.lustre.required)"]


def test_the_plan_says_not_applicable_off_lustre(tmp_path):
    over = ["storage.lustre.stripe_count=4", f"storage.storage_root={tmp_path}"]
    lustre = load_config("demo", over).storage.lustre
    data = str(tmp_path / "./data/demo")
    striping = check_striping(lustre, data)
    filesystems = describe_filesystems({"data_folder": data})
    text = plan_text(over, filesystems, striping)
    fs_type, mount_point = _df(tmp_path)
    assert lines_of(text, "striping") == [
        f"storage.lustre: not applicable: {data} is on {fs_type} mounted at {mount_point}, "
        "not Lustre"]
    assert lines_of(text, "file system") == [
        f"data_folder: {fs_type} at {mount_point} ({filesystems['data_folder']['device']})"]


def test_the_plan_shows_lustre_layouts_and_gpfs_block_sizes(lustre):
    over = ["storage.lustre.stripe_count=4", f"storage.storage_root={lustre.mount}"]
    data = os.path.join(str(lustre.mount), "./data/demo")
    filesystems = describe_filesystems({"data_folder": data}, str(lustre.mountinfo))
    filesystems["output_folder"] = {"type": "gpfs", "mount_point": "/gpfs/fs1",
                                    "device": "fs1", "block_size": 16 << 20}
    filesystems["scratch"] = {"type": "lustre", "mount_point": "/lus", "device": "unknown",
                              "stripe_layout": {"error": "lfs getstripe: no answer"}}
    text = plan_text(over, filesystems, check_striping(
        load_config("demo", over).storage.lustre, data, str(lustre.mountinfo)))
    assert lines_of(text, "file system") == [
        f"data_folder: lustre at {lustre.mount} (10.0.0.1@o2ib:/testfs), default layout "
        "4 stripe(s) of 1.0 MiB in pool flash",
        "output_folder: gpfs at /gpfs/fs1 (fs1), block size 16.0 MiB",
        "scratch: lustre at /lus, layout unknown (lfs getstripe: no answer)"]
    assert lines_of(text, "striping") == [
        f"storage.lustre: lfs setstripe -c 4 '{os.path.abspath(data)}', before files are "
        "created; files already there keep their layout"]  # quoted: the mount has a space


def test_the_plan_notes_mpiio_striping_hints_beside_storage_lustre():
    from types import SimpleNamespace

    from dlio_mpi.plan.render import storage_lines

    storage = load_config("demo", ["storage.lustre.stripe_count=4"]).storage
    cfg = SimpleNamespace(storage=storage, reader=SimpleNamespace(
        mpiio_hints={"striping_factor": "8", "romio_cb_read": "enable"}))
    assert lines_of("\n".join(storage_lines(cfg, "/lus/data")), "note") == [
        "reader.mpiio_hints striping_factor set the layout of files MPI-IO creates, "
        "storage.lustre the folder's default for the others; the layout a data file took is "
        "in summary.json"]
    # and from the configuration itself, which holds the hints as (name, value) pairs
    cfg = load_config("demo", ["storage.lustre.stripe_count=4",
                               "reader.mpiio_hints={striping_factor: 8}"])
    assert [n for n in lines_of("\n".join(storage_lines(cfg, "/lus/data")), "note")
            if "mpiio_hints" in n]
