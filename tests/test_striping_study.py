"""The striping study (scripts/striping/study.sbatch and collect.py) run for real, without
Slurm: every point is an `mpiexec -n 2 dlio-mpi run` on a tiny dataset, the results one CSV.

Lustre is faked as in test_filesystems.py: a recording `lfs` first on PATH and a mountinfo
file naming the data root's folder a Lustre mount. The runs are separate processes that read
/proc/self/mountinfo, so a sitecustomize module (on PYTHONPATH for them only) points the
default mountinfo of dlio_mpi.storage.filesystems at the fake one."""

from __future__ import annotations

import csv
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from test_filesystems import FakeLustre

from conftest import mpiexec
from helpers import run_in_session

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "scripts" / "striping" / "study.sbatch"
TIMEOUT = 120  # seconds for the whole study; it takes about 10

SITECUSTOMIZE = '''\
import os

if os.environ.get("FAKE_MOUNTINFO"):
    import dlio_mpi.storage.filesystems as fs

    for function in vars(fs).values():
        defaults = getattr(function, "__defaults__", None) or ()
        if fs.MOUNTINFO in defaults:
            function.__defaults__ = tuple(os.environ["FAKE_MOUNTINFO"] if d == fs.MOUNTINFO
                                          else d for d in defaults)
'''
# what the fake `lfs getstripe` says of every folder and file: 2 stripes of 1 MiB
LAYOUT = "stripe_count:  2 stripe_size:   1048576 pattern:       raid0 stripe_offset: -1\n"
HINTS = "romio_cb_read=disable,cb_buffer_size=1048576"
TINY = ["dataset.num_files_train=8", "dataset.record_length_bytes=16384",
        "dataset.record_length_bytes_stdev=0", "reader.batch_size=2",
        "train.computation_time=0.002", "train.epochs=2"]


def run_study(settings: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    """bash study.sbatch OVERRIDES without Slurm, with these settings, on 2 ranks of tiny
    data; in its own process group, killed whole if it hangs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(RANKS="2", MPIEXEC=mpiexec(), DLIO_MPI=f"{sys.executable} -P -m dlio_mpi",
               PYTHON=sys.executable, **settings)
    return run_in_session(["bash", str(STUDY), *TINY, *overrides], env=env, timeout=TIMEOUT)


def test_a_small_study_on_fake_lustre_gives_one_csv_row_per_point(tmp_path, monkeypatch):
    lustre = FakeLustre(tmp_path, monkeypatch)  # sets PATH and the fake lfs's variables
    lustre.getstripe_prints(LAYOUT)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    data, results = lustre.mount / "study data", tmp_path / "results"
    settings = dict(
        PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
        FAKE_MOUNTINFO=str(lustre.mountinfo),
        DATA_ROOT=str(data), OUT_ROOT=str(results),
        STRIPE_COUNTS="1 2 -1", STRIPE_SIZES="1M", BASE_STRIPE_COUNT="2",
        FILE_ACCESS_MODES="multi shared collective",
        HINT_SETS=f"default {HINTS}", HINTS_FILE_ACCESS="collective",
        LUSTRE_REQUIRED="true")

    start = time.monotonic()
    done = run_study(settings)
    print(f"study: {time.monotonic() - start:.1f} s")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 point(s), 8 complete" in done.stdout

    points = {  # (study, point): (stripe count, folder striped with -c COUNT [-S SIZE])
        ("stripe", "count1-size1M"): (1, ["-c", "1", "-S", "1048576"]),
        ("stripe", "count2-size1M"): (2, ["-c", "2", "-S", "1048576"]),
        ("stripe", "count-1-size1M"): (-1, ["-c", "-1", "-S", "1048576"]),
        ("access", "multi"): (2, ["-c", "2"]),
        ("access", "shared"): (2, ["-c", "2"]),
        ("access", "collective"): (2, ["-c", "2"]),
        ("hints", "1-default"): (2, ["-c", "2"]),
        ("hints", "2-romio_cb_read-disable+cb_buffer_size-1048576"): (2, ["-c", "2"]),
    }
    with open(results / "study.csv", newline="") as fp:
        rows = {(row["study"], row["point"]): row for row in csv.DictReader(fp)}
    assert rows.keys() == points.keys()
    for (study, point), (count, options) in points.items():
        row, folder = rows[study, point], str(data / study / point)
        assert row["status"] == "complete", row
        assert (row["ranks"], row["epochs"], row["stripe_count"]) == ("2", "2", str(count))
        assert 0 < float(row["AU_percent"]) <= 100
        assert float(row["samples_per_s"]) > 0 and float(row["MB_per_s"]) > 0
        assert float(row["transfer_MiB_per_s"]) > 0
        assert 0 <= float(row["read_latency_p50_ms"]) <= float(row["read_latency_p99_ms"])
        assert (row["fs_type"], row["fs_mount_point"]) == ("lustre", str(lustre.mount))
        assert row["data_folder"] == folder
        assert row["output_folder"] == str(results / study / point)
        assert row["striping_status"] == "applied"
        assert row["setstripe_command"] == shlex.join(["lfs", "setstripe", *options, folder])
        assert (row["file_stripe_count"], row["file_stripe_size"]) == ("2", "1048576")
        found = "" if count == 2 else f"stripe_count: requested {count}, found 2"
        assert row["striping_mismatch"] == found
        file_access = point if study == "access" else "multi" if study == "stripe" else (
            "collective")
        assert row["file_access"] == file_access
    hinted = rows["hints", "2-romio_cb_read-disable+cb_buffer_size-1048576"]
    assert hinted["hints"] == HINTS.replace(",", ";")
    assert "romio_cb_read=disable" in hinted["hints_effective"].split(";")
    assert rows["hints", "1-default"]["hints"] == ""
    assert rows["access", "collective"]["mpiio_implementation"] != ""

    # the fake lfs saw one setstripe per point, on the point's own data folder, in run order
    setstripes = [call for call in lustre.calls() if call[0] == "setstripe"]
    assert setstripes == [["setstripe", *options, str(data / study / point)]
                          for (study, point), (_, options) in points.items()]


def test_a_failed_point_is_a_row_and_the_exit_status_and_nothing_is_deleted(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "notes.txt").write_text("the user's")
    done = run_study({"DATA_ROOT": str(tmp_path / "data"), "OUT_ROOT": str(results),
                      "STUDIES": "access", "FILE_ACCESS_MODES": "multi bogus"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 point(s) failed: access/bogus" in done.stderr
    with open(results / "study.csv", newline="") as fp:
        rows = {row["point"]: row for row in csv.DictReader(fp)}
    assert rows["multi"]["status"] == "complete"
    bogus = rows["bogus"]
    assert (bogus["status"], bogus["AU_percent"]) == ("failed before writing results", "")
    assert "reader.file_access: 'bogus' is not accepted" in Path(bogus["log"]).read_text()
    assert (results / "notes.txt").read_text() == "the user's"
    # a CSV that is not the collector's is not replaced
    (results / "study.csv").write_text("the user's table\n")
    refused = run_study({"DATA_ROOT": str(tmp_path / "data"), "OUT_ROOT": str(results),
                         "STUDIES": "access", "FILE_ACCESS_MODES": "multi"})
    assert refused.returncode != 0 and "is not a CSV of this script" in refused.stderr
    assert (results / "study.csv").read_text() == "the user's table\n"


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as fp:
        return {row["point"]: row for row in csv.DictReader(fp)}


def test_a_study_into_an_earlier_studys_out_root_collects_only_its_own_points(tmp_path):
    results = tmp_path / "results"

    def study(counts: str, *overrides: str) -> subprocess.CompletedProcess:
        return run_study({"DATA_ROOT": str(tmp_path / "data"), "OUT_ROOT": str(results),
                          "STUDIES": "stripe", "STRIPE_COUNTS": counts}, *overrides)

    first = study("1 2")
    assert first.returncode == 0, first.stdout + first.stderr
    assert read_csv(results / "study.csv").keys() == {"count1-size1M", "count2-size1M"}

    second = study("4 8")  # other points, into the same OUT_ROOT
    assert second.returncode == 0, second.stdout + second.stderr
    assert "2 point(s), 2 complete" in second.stdout
    rows = read_csv(results / "study.csv")
    assert rows.keys() == {"count4-size1M", "count8-size1M"}
    assert [row["stripe_count"] for row in rows.values()] == ["4", "8"]
    assert ("left out 2 point(s)" in second.stderr
            and "stripe/count1-size1M, stripe/count2-size1M" in second.stderr)
    # the first study's points are kept, and collected by hand with --all
    assert (results / "stripe" / "count1-size1M" / "summary.json").is_file()
    collect = [sys.executable, str(STUDY.with_name("collect.py")), str(results)]
    everything = subprocess.run([*collect, "--all", "-o", str(tmp_path / "all.csv")],
                                capture_output=True, text=True, timeout=60)
    assert everything.returncode == 0 and "4 point(s), 4 complete" in everything.stdout
    assert len(read_csv(tmp_path / "all.csv")) == 4

    # a point that fails before writing results: its folder still holds the second study's
    # results, which are kept but are not this study's
    third = study("4", "reader.file_access=bogus")
    assert third.returncode == 1, third.stdout + third.stderr
    assert "holds an earlier run's results" in third.stdout
    (row,) = read_csv(results / "study.csv").values()
    assert row["point"] == "count4-size1M"
    assert row["status"].startswith("failed before writing results (its folder holds an")
    assert row["AU_percent"] == row["stripe_count"] == row["data_folder"] == ""
    assert (results / "stripe" / "count4-size1M" / "summary.json").is_file()
    listed = (results / "study-points.txt").read_text().splitlines()
    assert listed[2:] == ["point stripe/count4-size1M", "earlier stripe/count4-size1M"]

    # a file of that name that is not the script's list: refused before any point, kept
    (results / "study-points.txt").write_text("the user's\n")
    refused = study("2")
    assert refused.returncode == 2 and "not this script's list" in refused.stderr
    assert "==" not in refused.stdout
    assert (results / "study-points.txt").read_text() == "the user's\n"
