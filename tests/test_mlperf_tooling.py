"""MLPerf Storage's tool (mlpstorage) drives DLIO with one command line
(mlpstorage/benchmarks/dlio.py generate_dlio_command): `dlio_benchmark workload=NAME
++hydra.run.dir=RUN ++hydra.output_subdir=dlio_config ++workload.KEY=VALUE ...
--config-dir=CONFIGS`, after creating RUN (3.0.26 puts its collector's folder there); then it
writes its own logs into RUN, and its report generator and checker read summary.json,
per_epoch_stats.json, dlio.log and dlio_config/{config,hydra,overrides}.yaml there. The same
line runs with `dlio-mpi run`; tests/test_mlpstorage_tool.py runs mlpstorage itself."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from dlio_mpi.config.loader import workload_dir
from helpers import run_cli

pytestmark = pytest.mark.timeout(300)

SMALL = ["++workload.dataset.num_files_train=8", "++workload.dataset.data_folder=data",
         "++workload.workflow.generate_data=True", "++workload.dataset.record_length_bytes=4096",
         "++workload.dataset.record_length_bytes_stdev=0",
         "++workload.dataset.record_length_bytes_resize=0",
         "++workload.train.computation_time=0.001", "++workload.train.epochs=1",
         "++workload.reader.batch_size=2"]


def _mlperf_layout(tmp: Path) -> Path:
    """CONFIGS/workload/unet3d_b200.yaml as mlpstorage ships it; the run folder made empty
    beforehand, as mlpstorage reserves it."""
    configs = tmp / "configs" / "dlio"
    (configs / "workload").mkdir(parents=True)
    shutil.copy(workload_dir().joinpath("mlperf", "unet3d_b200.yaml"),
                configs / "workload" / "unet3d_b200.yaml")
    (tmp / "results" / "run").mkdir(parents=True)
    return configs


def test_mlpstorage_s_command_line_runs_and_leaves_what_its_checker_reads(tmp_path):
    configs = _mlperf_layout(tmp_path)
    line = ["run", "workload=unet3d_b200", "++hydra.run.dir=results/run",
            "++hydra.output_subdir=dlio_config", *SMALL, f"--config-dir={configs}"]
    res = run_cli(line, ranks=2, cwd=tmp_path, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    run = tmp_path / "results" / "run"
    for name in ("summary.json", "per_epoch_stats.json", "dlio.log"):
        assert (run / name).is_file(), name
    assert sorted(p.name for p in (run / "dlio_config").iterdir()) == [
        "config.yaml", "hydra.yaml", "overrides.yaml"]  # the checker wants exactly these
    # what mlpstorage's BenchmarkRun reads from them
    config = yaml.safe_load((run / "dlio_config" / "config.yaml").read_text())["workload"]
    assert config["model"]["name"] == "unet3d" and config["workflow"]["train"] is True
    assert config["dataset"]["num_files_train"] == 8
    overrides = yaml.safe_load((run / "dlio_config" / "overrides.yaml").read_text())
    assert overrides == ["workload=unet3d_b200", *SMALL]
    workloads = [o for o in overrides if o.startswith("workload=")]
    assert workloads[0].split("_")[1] == "b200"  # its accelerator
    assert all(len(o.split("=")) == 2 for o in overrides)
    hydra = yaml.safe_load((run / "dlio_config" / "hydra.yaml").read_text())["hydra"]
    assert (hydra["run"]["dir"], hydra["output_subdir"]) == ("results/run", "dlio_config")
    assert hydra["overrides"]["task"] == overrides
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_accelerators"] == 2 and summary["metric"]["train_au_mean_percentage"]
    ran = str((configs / "workload" / "unet3d_b200.yaml").resolve())  # the file that ran
    assert summary["dlio_mpi"]["workload_file"] == ran
    assert f"workload file   {ran}\n" in res.stdout and \
        f"workload file   {ran}\n" in (run / "dlio.log").read_text()
    # mlpstorage then writes its logs beside ours: a later run there replaces our earlier
    # results and leaves the tool's file as it is (Hydra's run folder is shared)
    (run / "training_run.stdout.log").write_text("the tool's\n")
    again = run_cli(line, ranks=2, cwd=tmp_path, timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (run / "training_run.stdout.log").read_text() == "the tool's\n"
    assert sorted(p.name for p in (run / "dlio_config").iterdir()) == [
        "config.yaml", "hydra.yaml", "overrides.yaml"]


def test_without_output_subdir_no_record_is_written(tmp_path):
    configs = _mlperf_layout(tmp_path)
    res = run_cli(["run", "workload=unet3d_b200", "++hydra.run.dir=results/run", *SMALL,
                   "--config-dir", str(configs)], ranks=2, cwd=tmp_path, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "results" / "run"
    assert (run / "summary.json").is_file()
    assert not [p for p in run.iterdir() if p.is_dir()]


def test_config_dir_names_the_file_it_reads(tmp_path):
    configs = _mlperf_layout(tmp_path)
    plan = run_cli(["validate", "workload=unet3d_b200", f"--config-dir={configs}", "--json"],
                   ranks=2, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    record = json.loads(plan.stdout)
    assert record["train"]["files"] == 7200  # the file in the config dir
    assert record["workload_file"] == str(configs / "workload" / "unet3d_b200.yaml")
    # without --config-dir, the shipped file of that name, and the plan says which
    plan = run_cli(["validate", "workload=unet3d_h100"], ranks=2, cwd=tmp_path)
    shipped = str(Path(workload_dir().joinpath("unet3d_h100.yaml")).resolve())
    assert f"workload file   {shipped}\n" in plan.stdout, plan.stdout


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("what", ["missing", "fifo", "folder"])
def test_config_dir_without_the_workload_s_file_is_refused_naming_it(tmp_path, what, ranks):
    # Hydra would fall back to DLIO's own unet3d_h100 (which checkpoints; MLPerf's does not)
    configs = _mlperf_layout(tmp_path)
    searched = configs / "workload" / "unet3d_h100.yaml"
    if what == "fifo":
        os.mkfifo(searched)  # never opened: a read would block
    elif what == "folder":
        searched.mkdir()
    res = run_cli(["run", "workload=unet3d_h100", "++hydra.run.dir=results/run",
                   f"--config-dir={configs}"], ranks=ranks, cwd=tmp_path, timeout=60)
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(
        f"dlio-mpi: error: --config-dir {configs}: "), res.stderr
    assert str(searched) in errors[0]
    assert {"missing": "No such file", "fifo": "is not a regular file",
            "folder": "is a folder"}[what] in errors[0]
    assert list((tmp_path / "results" / "run").iterdir()) == []


def test_config_dir_takes_a_workload_name_not_a_path(tmp_path):
    configs = _mlperf_layout(tmp_path)
    path = configs / "workload" / "unet3d_b200.yaml"
    res = run_cli(["validate", str(path), f"--config-dir={configs}"], ranks=2, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.endswith(
        f"dlio-mpi: error: --config-dir {configs}: takes workload=NAME (its workload/NAME.yaml), "
        f"got the workload '{path}'; give workload=NAME, or the YAML path without "
        "--config-dir\n"), res.stderr


SUBDIR_EXPECTED = (
    "hydra.output_subdir: expected a folder name inside the run folder (no '/'), other than "
    "summary.json, per_epoch_stats.json, config.yaml, dlio_mpi_results.json, access_log, "
    "report, interval_stats.json, dlio_mpi.lock, RANK_output.json, RANK_per_epoch_stats.json, "
    "trace_rankR.json[.gz] and names holding .dlio_mpi- (the run's temporaries), or null; "
    "got ")


@pytest.mark.parametrize("args,message", [
    (["++hydra.job.name=x"], "override '++hydra.job.name=x': hydra.job.name is not "
     "implemented yet in dlio-mpi; accepted Hydra settings: hydra.run.dir=VALUE, "
     "hydra.output_subdir=VALUE"),
    (["++hydra.run.dir=a", "output.folder=b"], "overrides 'output.folder=b' and "
     "hydra.run.dir=a both set the output folder (DLIO's is Hydra's run folder); keep one"),
    (["++hydra.output_subdir=a/b"], f"{SUBDIR_EXPECTED}'a/b'"),
    # any name the run writes in its folder: the clash would end the run after training
    (["++hydra.output_subdir=0_output.json"], f"{SUBDIR_EXPECTED}'0_output.json'"),
    (["++hydra.output_subdir=12_per_epoch_stats.json"],
     f"{SUBDIR_EXPECTED}'12_per_epoch_stats.json'"),
    (["++hydra.output_subdir=trace_rank3.json.gz"], f"{SUBDIR_EXPECTED}'trace_rank3.json.gz'"),
    (["++hydra.output_subdir=summary.json.dlio_mpi-0a1b2c3d4e5f.tmp"],
     f"{SUBDIR_EXPECTED}'summary.json.dlio_mpi-0a1b2c3d4e5f.tmp'"),
    (["++hydra.output_subdir=interval_stats.json"], f"{SUBDIR_EXPECTED}'interval_stats.json'"),
    (["++hydra.run.dir=a", "++hydra.run.dir=b"], "overrides '++hydra.run.dir=a' and "
     "'++hydra.run.dir=b' both set hydra.run.dir; keep one"),  # the last won silently
    (["++hydra.output_subdir=x", "hydra.output_subdir=null"], "overrides "
     "'++hydra.output_subdir=x' and 'hydra.output_subdir=null' both set hydra.output_subdir; "
     "keep one"),
    (["--config-dir=nowhere"], "--config-dir: nowhere is not a folder; expected the folder "
     "whose workload/NAME.yaml holds the workloads"),
])
def test_hydra_settings_dlio_mpi_lacks_are_refused_before_any_io(args, message, tmp_path):
    ranks = 3 if "0_output.json" in " ".join(args) else 2  # printed once on 3 ranks too
    res = run_cli(["run", "workload=unet3d_h100", *args], ranks=ranks, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.endswith(f"dlio-mpi: error: {message}\n"), res.stderr
    assert list(tmp_path.iterdir()) == []


# ---- what mlpstorage 3.0.26 adds to every datagen and run (issue 31)
LISTING = ["++workload.dataset.skip_listing=True",
           "++workload.dataset.listing_validation_interval=1"]


@pytest.mark.parametrize("ranks", [2, 3])
def test_mlpstorage_s_run_folder_keeps_its_own_files_and_ours_are_checked(tmp_path, ranks):
    """mlpstorage creates collector-staging/ (and later its metadata) in the run folder before
    it launches the benchmark: entries not ours are left in place in a folder given as
    ++hydra.run.dir; a name the run writes (summary.json) that is not ours is still refused;
    a plain output.folder keeps refusing what is not ours."""
    configs = _mlperf_layout(tmp_path)
    run = tmp_path / "results" / "run"
    (run / "collector-staging").mkdir()
    (run / "collector-staging" / "host0.json").write_text("{}")
    (run / "training_20261128_metadata.json").write_text("{}")
    small = [o.replace("num_files_train=8", "num_files_train=12") for o in SMALL]
    line = ["run", "workload=unet3d_b200", "++hydra.run.dir=results/run",
            "++hydra.output_subdir=dlio_config", *small, *LISTING, f"--config-dir={configs}"]
    for attempt in (1, 2):  # the second run replaces the first's results, leaves theirs
        res = run_cli(line, ranks=ranks, cwd=tmp_path, timeout=240)
        assert res.returncode == 0, (attempt, res.stderr[-3000:])
    assert (run / "collector-staging" / "host0.json").read_text() == "{}"
    assert (run / "training_20261128_metadata.json").read_text() == "{}"
    assert (run / "summary.json").is_file()
    (run / "summary.json").write_text("{} ")  # changed: not ours any more
    res = run_cli(line, ranks=ranks, cwd=tmp_path, timeout=240)
    assert res.returncode == 2 and "holds summary.json, a result of an earlier dlio-mpi run, " \
        "changed since" in res.stderr, res.stderr
    (run / "summary.json").unlink()
    plain = run_cli(["run", "demo", f"output.folder={run}", "workflow.generate_data=false",
                     f"dataset.data_folder={tmp_path / 'data'}"], ranks=ranks)
    assert plain.returncode == 2 and "holds training_20261128_metadata.json, not a result of " \
        "an earlier dlio-mpi run" in plain.stderr, plain.stderr


def test_skip_listing_names_the_files_and_checks_them_as_the_fork_does(tmp_path):
    """dataset.skip_listing (a string 'True' as the fork reads it): the files are DLIO's
    names, never listed, and rank 0 checks that the first, the last and every
    listing_validation_interval-th exist; without it, listing_validation_interval is noted
    as having no effect."""
    data = tmp_path / "data"
    base = ["dataset.num_files_train=8", f"dataset.data_folder={data}",
            "dataset.record_length_bytes=4096", "dataset.record_length_bytes_stdev=0",
            f"output.folder={tmp_path / 'out'}", "train.computation_time=0"]
    assert run_cli(["generate", "demo", *base]).returncode == 0
    (data / "dlio_mpi_manifest.json").unlink()  # data another tool wrote: listed without it
    (data / "train" / "a.npz").write_text("not a data file")  # DLIO's listing takes it first
    listed = run_cli(["run", "demo", *base, "workflow.generate_data=false"])
    assert listed.returncode == 2 and "a.npz" in listed.stderr, listed.stderr
    named = run_cli(["run", "demo", *base, "workflow.generate_data=false",
                     "dataset.skip_listing='True'", "dataset.listing_validation_interval=3"])
    assert named.returncode == 0, named.stderr  # the names, never the stray file
    (data / "train" / "img_3_of_8.npz").unlink()  # every 3rd: 0, 3, 6 and the last, 7
    res = run_cli(["run", "demo", *base, "workflow.generate_data=false",
                   "dataset.skip_listing=true", "dataset.listing_validation_interval=3"])
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert res.returncode == 2 and errors == [
        f"dlio-mpi: error: dataset.skip_listing: 1 of 4 train files checked (the first, the "
        f"last, every dataset.listing_validation_interval=3) are missing, first: "
        f"{data / 'train' / 'img_3_of_8.npz'}; generate the data with this configuration "
        "(DLIO's names), or set dataset.skip_listing: false to list the folder"], res.stderr
    note = run_cli(["validate", "demo", "dataset.listing_validation_interval=5"], ranks=1)
    assert "dataset.listing_validation_interval=5: accepted, has no effect in dlio-mpi " \
           "because it sets how many files dataset.skip_listing checks" in note.stdout


def test_direct_fs_reads_the_file_system_with_o_direct(tmp_path):
    """mlpstorage --o-direct: storage_type direct_fs, storage_library s3dlio, uri_scheme
    direct, storage_root the data folder, data_folder relative to it: the same files, read
    with O_DIRECT; another scheme is refused."""
    base = ["dataset.num_files_train=8", "dataset.record_length_bytes=4096",
            "dataset.record_length_bytes_stdev=0", f"output.folder={tmp_path / 'out'}",
            "train.computation_time=0"]
    direct = ["++workload.storage.storage_type=direct_fs",
              "++workload.storage.storage_options.storage_library=s3dlio",
              "++workload.storage.storage_options.uri_scheme=direct",
              f"++workload.storage.storage_root={tmp_path}", "++workload.dataset.data_folder=d"]
    res = run_cli(["run", "demo", *base, *direct])
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["dlio_mpi"]["odirect"] is True
    assert summary["dlio_mpi"]["filesystems"]["data_folder"]["path"] == str(tmp_path / "d")
    assert "storage.storage_type=direct_fs: the data under storage.storage_root read with " \
           "O_DIRECT" in res.stdout
    other = run_cli(["validate", "demo", *base, *direct[:2],
                     "++workload.storage.storage_options.uri_scheme=s3"], ranks=1)
    assert other.returncode == 2 and "storage.storage_type: direct_fs reads a file system " \
        "through s3dlio's direct:// mode" in other.stderr, other.stderr


@pytest.mark.parametrize("from_", ["manifest", "footer"])
def test_parquet_files_are_read_with_the_row_groups_they_were_written_with(tmp_path, from_):
    """mlpstorage 3.0.26's flux_datagen.yaml writes row groups of 48 rows (row_group_size 48,
    which the file shipped here lacks) and flux_b200.yaml names none: the run reads the
    files' own row groups (from our manifest, or from the first file's footer when another
    tool wrote them) and says so, where it refused its own files."""
    small = ["++workload.dataset.num_files_train=4",
             "++workload.dataset.num_samples_per_file=96",
             f"++workload.dataset.data_folder={tmp_path / 'data'}",
             "++workload.dataset.parquet.columns=[{name: a, dtype: float32, size: 64}]"]
    gen = run_cli(["run", "workload=mlperf/flux_datagen", *small,
                   "++workload.dataset.parquet.row_group_size=48",
                   f"++workload.output.folder={tmp_path / 'gen'}"])
    assert gen.returncode == 0, gen.stderr
    if from_ == "footer":
        (tmp_path / "data" / "dlio_mpi_manifest.json").unlink()
    res = run_cli(["run", "workload=mlperf/flux_b200", *small,
                   f"++workload.output.folder={tmp_path / 'out'}",
                   "++workload.train.computation_time=0.001"])
    assert res.returncode == 0, res.stderr
    where = "the dataset's manifest" if from_ == "manifest" else "its footer"
    assert (f"note: dataset.parquet.row_group_size: the files hold row groups of 48 rows (from "
            f"{where}), read as they are, where the workload says 1024") in res.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    config = summary["dlio_mpi"]["config"]["dataset"]["parquet"]
    assert config["row_group_size"] == 48
    # every row group once: 4 files x 2 groups of 48 rows x 256 bytes, and the footers
    assert summary["metric"]["train_bytes_read"] >= 4 * 96 * 256
