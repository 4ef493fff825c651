"""The dlio-mpi command on 2 MPI ranks, as a user runs it: results written, bad input reported
once with a non-zero exit, a rank that fails never leaves the other hanging."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from helpers import run_cli, workload_overrides

pytestmark = pytest.mark.timeout(180)


def test_run_writes_results(tmp_path):
    res = run_cli(["run", "demo", *workload_overrides(tmp_path)])
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    metric = summary["metric"]
    for key in ("train_au_mean_percentage", "train_au_meet_expectation",
                "train_throughput_mean_samples_per_second", "train_io_mean_MB_per_second",
                "train_bytes_read", "train_read_ops", "train_read_latency_p50_ms",
                "train_read_latency_p99_ms", "train_wait_seconds_per_rank"):
        assert key in metric, key
    assert len(metric["train_au_percentage"]) == 2
    # demo reads npz whole files (DLIO's on_demand) as np.load does: per sample an open, the
    # reads of the header, zip directory and payload, a close; 8 files of 64x64 bytes, 2 epochs
    size = os.path.getsize(tmp_path / "data" / "train" / "img_0_of_8.npz")
    assert metric["train_bytes_read"] == 2 * 8 * 64 * 64  # sample bytes only
    assert metric["train_bytes_transferred"] >= 2 * 8 * size
    assert metric["train_metadata_bytes_read"] == \
        metric["train_bytes_transferred"] - metric["train_bytes_read"]
    assert metric["train_file_opens"] == metric["train_file_closes"] == 2 * 8
    assert metric["train_file_stats"] >= 2 * 8
    assert set(json.loads((out / "per_epoch_stats.json").read_text())) == {"1", "2"}
    assert (out / "config.yaml").exists()
    assert "train AU" in res.stdout
    # the file systems the run used, as /proc/self/mountinfo names them
    fs = summary["dlio_mpi"]["filesystems"]
    assert set(fs) == {"data_folder", "data_file", "output_folder"}
    assert fs["data_folder"]["type"] not in ("", "unknown") and fs["data_folder"]["mount_point"]
    assert "file system     data_folder:" in res.stdout and summary["dlio_mpi"]["striping"] is None


def test_lustre_striping_required_off_lustre_is_refused_before_any_io(tmp_path):
    res = run_cli(["run", "demo", *workload_overrides(tmp_path),
                   "storage.lustre.required=true", "storage.lustre.stripe_count=4"])
    assert res.returncode == 2 and res.stderr.count("storage.lustre.required") == 1, res.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()


def test_unknown_key_is_reported_once_with_a_suggestion(tmp_path):
    res = run_cli(["run", "demo", *workload_overrides(tmp_path), "dataset.num_file_train=3"])
    assert res.returncode != 0
    assert res.stderr.count("did you mean 'dataset.num_files_train'") == 1, res.stderr
    assert not (tmp_path / "data").exists(), "storage was touched before validation"


def test_batch_larger_than_a_ranks_share_is_refused(tmp_path):
    res = run_cli(["run", "demo", *workload_overrides(tmp_path, reader__batch_size=5)])
    assert res.returncode == 2
    assert res.stderr.count("reader.batch_size=5 is larger than a rank's share") == 1, res.stderr


def test_missing_data_is_reported(tmp_path):
    res = run_cli(["run", "demo", *workload_overrides(tmp_path),
                   "workflow.generate_data=false"])
    assert res.returncode == 2
    assert "not enough train data" in res.stderr and "generate_data" in res.stderr


def test_validate_prints_the_plan_without_touching_storage(tmp_path):
    res = run_cli(["validate", "demo", "--ranks", "4",
                   *workload_overrides(tmp_path, dataset__num_files_train=16)], ranks=1)
    assert res.returncode == 0, res.stderr
    assert "2 steps of batch 2 per rank" in res.stdout  # 16 samples / 4 ranks / batch 2
    assert not (tmp_path / "data").exists()


def test_a_failing_rank_ends_the_job_promptly(tmp_path):
    from dlio_mpi.data.catalog import spot_indices

    over = workload_overrides(tmp_path, dataset__format="npy", reader__read_mode="sample",
                              train__epochs=1, reader__sample_shuffle="off",
                              reader__file_shuffle="off", dataset__num_files_train=40)
    assert run_cli(["generate", "demo", *over]).returncode == 0
    # no shuffle: rank 1 reads files 20..39; pick one the start-up spot checks do not look at
    index = max(set(range(20, 40)) - set(spot_indices(40)))
    victim = tmp_path / "data" / "train" / f"img_{index:02d}_of_40.npy"
    os.truncate(victim, 200)
    res = run_cli(["run", "demo", *over, "workflow.generate_data=false"], timeout=60)
    assert res.returncode != 0
    assert "rank 1" in res.stderr and str(victim) in res.stderr, \
        f"rc={res.returncode}\nstderr:\n{res.stderr}\nstdout:\n{res.stdout}"


def test_a_changed_file_is_caught_by_the_start_up_spot_checks(tmp_path):
    over = workload_overrides(tmp_path, dataset__format="npy")
    assert run_cli(["generate", "demo", *over]).returncode == 0
    victim = tmp_path / "data" / "train" / "img_7_of_8.npy"
    os.truncate(victim, 200)
    res = run_cli(["run", "demo", *over, "workflow.generate_data=false"], timeout=60)
    assert res.returncode == 2
    assert res.stderr.count(f"{victim} has 200 bytes") == 1, res.stderr
    # generating again does not overwrite it (it cannot be told from a foreign file) ...
    res = run_cli(["run", "demo", *over, "workflow.generate_data=true"], timeout=60)
    assert res.returncode == 2 and res.stderr.count(f"{victim} has 200 bytes") == 1, res.stderr
    assert victim.stat().st_size == 200
    # ... but generates it again once deleted (and only it)
    victim.unlink()
    untouched = tmp_path / "data" / "train" / "img_0_of_8.npy"
    before = untouched.stat().st_mtime_ns
    res = run_cli(["run", "demo", *over, "workflow.generate_data=true"], timeout=60)
    assert res.returncode == 0, res.stderr
    assert "generated 1 files" in res.stdout and victim.stat().st_size > 200
    assert untouched.stat().st_mtime_ns == before


def test_odirect_reads_aligned_extents(tmp_path):
    from dlio_mpi import _core

    over = workload_overrides(tmp_path, dataset__format="npy", reader__read_mode="sample",
                              reader__odirect="true", dataset__record_length_bytes=10000,
                              dataset__num_samples_per_file=2, reader__sample_shuffle="off",
                              reader__file_shuffle="off")
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    metric = json.loads((tmp_path / "out" / "summary.json").read_text())["metric"]
    assert metric["train_bytes_requested"] == 2 * 16 * 10000
    # every sample read once per epoch; O_DIRECT transfers its aligned extent (clipped at EOF)
    path = tmp_path / "data" / "train" / "img_0_of_8.npy"
    size = path.stat().st_size
    align = _core.odirect_alignment(str(path))[1]
    header = size - 20000
    extents = [(header + i * 10000, header + (i + 1) * 10000) for i in range(2)]
    per_file = sum(min(-(-end // align) * align, size) - start // align * align
                   for start, end in extents)
    assert metric["train_bytes_transferred"] == 2 * 8 * per_file
    assert metric["train_bytes_read"] == 2 * 16 * 10000
    # 2 samples per file read by extent: each file opened once per epoch (both samples go to
    # the one reader thread) and closed when the epoch ends
    assert metric["train_file_opens"] == metric["train_file_closes"] == 2 * 8


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a tmpfs at /dev/shm")
def test_odirect_on_tmpfs_is_a_clear_error(tmp_path):
    shm = f"/dev/shm/dlio-mpi-test-{os.getpid()}"
    over = workload_overrides(tmp_path, dataset__data_folder=shm, reader__odirect="true")
    try:
        res = run_cli(["run", "demo", *over])
    finally:
        import shutil

        shutil.rmtree(shm, ignore_errors=True)
    assert res.returncode == 2
    assert res.stderr.count("O_DIRECT") == 1 and "reader.odirect" in res.stderr, res.stderr


@pytest.mark.parametrize("odirect", [False, True])
def test_npz_samples_read_by_extent_match_numpy(tmp_path, odirect):
    """sample mode on npz: the bytes the engine reads (buffered or O_DIRECT, at unaligned
    offsets) are numpy's sample bytes."""
    from dlio_mpi import _core

    over = workload_overrides(tmp_path, dataset__num_samples_per_file=3)
    assert run_cli(["generate", "demo", *over]).returncode == 0
    from dlio_mpi.config import load_config
    from dlio_mpi.data.dataset import describe_dataset
    from dlio_mpi.sampling.requests import EpochRequests

    split = describe_dataset(load_config("demo", over))["train"]
    align = max(_core.odirect_alignment(split.path(0))) if odirect else 0
    engine = _core.Engine(2, 1, odirect, 4, align)
    engine.set_files(split.paths())
    files = np.array([0, 5, 7], dtype=np.int64)
    index = np.array([2, 0, 1], dtype=np.int64)
    layouts = split.expected_layouts().take(files)
    offset = layouts.data_offset + index * layouts.sample_step
    buf_off = np.zeros(3, dtype=np.int64)
    engine.start_epoch(EpochRequests(np.array([0, 3], dtype=np.int64), files, offset,
                                     layouts.sample_span), req_buf_off=buf_off)
    batch = engine.next()
    data = bytes(batch.data)
    for k in range(3):
        expected = np.load(split.path(int(files[k])))["x"][index[k]].tobytes()
        got = data[buf_off[k]: buf_off[k] + len(expected)]
        assert got == expected, f"file {files[k]} sample {index[k]}"
    engine.close()


def test_generation_never_overwrites_files_it_did_not_generate(tmp_path):
    over = workload_overrides(tmp_path)
    foreign = tmp_path / "data" / "train" / "img_3_of_8.npz"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"somebody's data")
    res = run_cli(["generate", "demo", *over])
    assert res.returncode == 2
    assert res.stderr.count(f"{foreign} exists and was not generated by dlio-mpi") == 1
    assert foreign.read_bytes() == b"somebody's data"
    assert not (tmp_path / "data" / "dlio_mpi_manifest.json").exists()
    assert sorted(p.name for p in foreign.parent.iterdir()) == ["img_3_of_8.npz"]


def test_an_unwritable_output_folder_is_refused_before_any_io(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    res = run_cli(["run", "demo", *workload_overrides(tmp_path, output__folder=blocker)])
    assert res.returncode == 2
    assert res.stderr.count(f"output.folder: cannot write results to {blocker}") == 1
    assert not (tmp_path / "data").exists()


def test_epochs_with_no_measurable_step_are_refused(tmp_path):
    res = run_cli(["validate", "demo", *workload_overrides(tmp_path), "--ranks", "4"],
                  ranks=1)
    assert res.returncode == 2  # 8 samples / 4 ranks / batch 2 = 1 step, excluded from AU
    assert "exclude_start_steps=1" in res.stderr


def test_generate_command_generates_even_if_the_workflow_flag_is_off(tmp_path):
    res = run_cli(["generate", "demo", *workload_overrides(tmp_path),
                   "workflow.generate_data=false"])
    assert res.returncode == 0, res.stderr
    assert len(list((tmp_path / "data" / "train").glob("*.npz"))) == 8


def _dlio_npz(folder, files: int, side: int, samples: int = 1) -> None:
    """npz files as DLIO 2.0.0 writes them: np.savez, samples on the last axis, int64 labels."""
    (folder / "train").mkdir(parents=True)
    (folder / "valid").mkdir()
    rng = np.random.default_rng(0)
    for i in range(files):
        x = rng.integers(0, 255, size=(side, side, samples), dtype=np.uint8)
        np.savez(folder / "train" / f"img_{i}_of_{files}.npz", x=x, y=[0] * samples)


def test_dlio_written_data_is_read_by_sample_on_its_last_axis(tmp_path):
    _dlio_npz(tmp_path / "data", 8, 20, samples=3)
    over = workload_overrides(tmp_path, dataset__record_length_bytes=400,
                              dataset__num_samples_per_file=3, reader__read_mode="sample",
                              reader__batch_size=3, workflow__generate_data="false")
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    metric = json.loads((tmp_path / "out" / "summary.json").read_text())["metric"]
    # 24 samples of 20x20 bytes per epoch; each strided sample read as the extent covering it
    assert metric["train_bytes_read"] == 2 * 24 * 400
    assert metric["train_bytes_requested"] == 2 * 24 * ((400 - 1) * 3 + 1)


@pytest.mark.parametrize("override,words", [
    ({"dataset__record_length_bytes": 10000}, "holds 3 samples of 400 bytes"),
    ({"dataset__num_samples_per_file": 2}, "no axis of dataset.num_samples_per_file=2"),
])
def test_data_that_disagrees_with_the_config_is_refused(tmp_path, override, words):
    _dlio_npz(tmp_path / "data", 8, 20, samples=3)
    values = dict(dataset__record_length_bytes=400, dataset__num_samples_per_file=3,
                  reader__batch_size=3, workflow__generate_data="false")
    res = run_cli(["run", "demo", *workload_overrides(tmp_path, **{**values, **override})])
    assert res.returncode == 2
    assert res.stderr.count(words) == 1 and "img_" in res.stderr, res.stderr


def test_validate_at_scale_is_exact_and_quiet(tmp_path):
    res = run_cli(["validate", "demo", "--ranks", "1024", "dataset.format=npz",
                   "dataset.num_files_train=1000000", "dataset.num_samples_per_file=100",
                   "dataset.record_length_bytes=114660", "dataset.record_length_bytes_stdev=0",
                   "reader.batch_size=400", "reader.read_mode=sample",
                   f"dataset.data_folder={tmp_path / 'none'}"],
                  ranks=1)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    # 10^6 files x 100 samples x 338 x 338 bytes, 244 steps x 400 x 1024 ranks of them read
    per_epoch = 244 * 400 * 1024 * 338 * 338
    assert f"bytes per epoch {per_epoch / 2**40:.1f} TiB" in res.stdout
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("rank,printed", [("0", True), ("1", False)])
def test_usage_errors_are_printed_by_the_first_rank_only(monkeypatch, capsys, rank, printed):
    from dlio_mpi.cli import main
    from dlio_mpi.mpi.launcher import RANK_VARIABLES

    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PMI_RANK", rank)
    with pytest.raises(SystemExit) as info:
        main(["validate", "demo", "--reader.batch_size=4"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("dlio-mpi: error: unrecognized arguments: --reader.batch_size=4 "
                     "(overrides take no dashes: reader.batch_size=4") == int(printed), err


@pytest.mark.parametrize("generate", ["true", "false"])
def test_a_data_folder_under_a_regular_file_names_the_key(tmp_path, generate):
    (tmp_path / "afile").write_text("x")
    res = run_cli(["run", "demo", *workload_overrides(
        tmp_path, dataset__data_folder=tmp_path / "afile" / "data",
        workflow__generate_data=generate)])
    assert res.returncode == 2 and res.stderr.count("dataset.data_folder") == 1, res.stderr
