"""dlio-mpi pack under mpiexec -n 2 and -n 3: shards whose samples are the original files'
bytes (read back through the index files), a pack that is ours and idempotent, a run of the
packed dataset reading the same samples as the original, reader.access_order sorted reading
each batch's samples in (file, offset) order; refusals before any I/O (several samples per
file, unequal sizes, a shard size that does not divide the samples, files in the way that
are not ours); the small-file study script on a tiny dataset."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlio_mpi.config import load_config
from dlio_mpi.data.dataset import describe_dataset
from dlio_mpi.data.pack import OVERRIDES_NAME, combined
from dlio_mpi.errors import UserError
from dlio_mpi.plan.derive import derive_plan
from dlio_mpi.sampling.requests import AccessPolicy, plan_reads
from dlio_mpi.sampling.sharding import ShuffleSpec, epoch_shuffle, order_batches, rank_shard
from helpers import access_logs, mpiexec, run_cli, signal_one_rank_when, workload_overrides

pytestmark = pytest.mark.timeout(300)
RANKS = [2, 3]
ROOT = Path(__file__).resolve().parent.parent
FILES, EVAL = 12, 6


def _args(tmp, **values) -> list[str]:
    base = dict(dataset__num_files_train=FILES, dataset__num_files_eval=EVAL,
                dataset__record_length_bytes=3000, reader__file_shuffle="off",
                reader__sample_shuffle="seed", reader__batch_size=2, train__epochs=2,
                workflow__generate_data="False")
    base.update(values)
    return workload_overrides(tmp, **base)


def _generate(tmp, ranks: int, **values) -> list[str]:
    args = _args(tmp, **values)
    res = run_cli(["generate", "demo", *args], ranks=ranks)
    assert res.returncode == 0, res.stderr
    return args


def _pack(tmp, ranks: int, args: list[str], *options: str) -> subprocess.CompletedProcess:
    return run_cli(["pack", "demo", *args, "--to", str(tmp / "packed"), *options], ranks=ranks)


def _files(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
            if p.is_file()}


@pytest.mark.parametrize("ranks", RANKS)
def test_shards_hold_the_original_files_and_a_rerun_keeps_them(tmp_path, ranks):
    args = _generate(tmp_path, ranks)
    res = _pack(tmp_path, ranks, args, "--samples-per-shard", "3")
    assert res.returncode == 0, res.stderr
    packed = tmp_path / "packed"
    overrides = (packed / OVERRIDES_NAME).read_text().split()
    assert res.stdout.splitlines()[1].split() == overrides  # printed once, by rank 0
    assert "dataset.num_samples_per_file=3" in overrides
    assert "dataset.num_files_train=4" in overrides and "dataset.num_files_eval=2" in overrides
    assert f"dataset.data_folder={packed}" in overrides
    originals = describe_dataset(load_config("demo", args))
    for split, count in (("train", 4), ("valid", 2)):
        shards = sorted((packed / split).glob("*.indexed_binary"))
        assert len(shards) == count
        for k, shard in enumerate(shards):
            offsets = np.fromfile(f"{shard}.off.idx", dtype=np.uint64)
            sizes = np.fromfile(f"{shard}.sz.idx", dtype=np.uint64)
            data = shard.read_bytes()
            assert len(offsets) == len(sizes) == 3
            for j, (off, size) in enumerate(zip(offsets.tolist(), sizes.tolist())):
                original = Path(originals[split].path(3 * k + j)).read_bytes()
                assert data[off:off + size] == original
            assert len(data) == int(sizes.sum())
    manifest = json.loads((packed / "dlio_mpi_manifest.json").read_text())
    assert manifest["complete"] and manifest["packed"]
    assert manifest["params"]["packed_from"]["files"] == {"train": FILES, "valid": EVAL}
    assert not [p for p in _files(packed) if p.endswith(".tmp") or "lock" in p]
    before = _files(packed)
    again = _pack(tmp_path, ranks, args, "--samples-per-shard", "3")
    assert again.returncode == 0, again.stderr
    assert "already complete, left as it is" in again.stdout
    assert _files(packed) == before
    # the pack is not a generated dataset: generation refuses to write into it
    gen = run_cli(["generate", "demo", *combined(args, tuple(overrides))], ranks=ranks)
    assert gen.returncode == 2 and "packed_from" in gen.stderr
    assert _files(packed) == before


def test_an_interrupted_pack_resumes_and_keeps_its_complete_shards(tmp_path):
    args = _generate(tmp_path, 2, dataset__num_files_eval=0)
    assert _pack(tmp_path, 2, args, "--samples-per-shard", "3").returncode == 0
    packed = tmp_path / "packed"
    # the state a pack stopped between two shards leaves: its manifest not complete, a shard
    # and the overrides missing, a temporary of its tag left
    manifest_path = packed / "dlio_mpi_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["complete"] = False
    manifest["temporaries"] = ["abcdef012345"]
    manifest_path.write_text(json.dumps(manifest))
    lost = packed / "train" / "img_2_of_4.indexed_binary"
    content = lost.read_bytes()
    lost.unlink()
    (packed / OVERRIDES_NAME).unlink()
    stale = packed / "train" / "img_3_of_4.indexed_binary.dlio_mpi-abcdef012345.tmp"
    stale.write_bytes(b"partial")
    before = _files(packed)
    res = _pack(tmp_path, 2, args, "--samples-per-shard", "3")
    assert res.returncode == 0, res.stderr
    after = _files(packed)
    assert lost.read_bytes() == content and not stale.exists()
    kept = [p for p in before if p.endswith("_of_4.indexed_binary")]
    assert len(kept) == 3 and all(after[p] == before[p] for p in kept)
    assert json.loads(manifest_path.read_text())["complete"]
    assert (packed / OVERRIDES_NAME).exists()


def _sample_sets(logs: list[np.ndarray], batch: int) -> list[list[set]]:
    return [[set(b) for b in log.reshape(-1, batch).tolist()] for log in logs]


@pytest.mark.parametrize("ranks", RANKS)
def test_the_packed_dataset_and_sorted_order_read_the_same_samples(tmp_path, ranks):
    args = _generate(tmp_path, ranks)
    assert _pack(tmp_path, ranks, args).returncode == 0
    overrides = tuple((tmp_path / "packed" / OVERRIDES_NAME).read_text().split())
    # default: the largest divisor of the 12 train and 6 eval samples within 256 MiB
    assert "dataset.num_files_train=2" in overrides and "dataset.num_files_eval=1" in overrides
    logs = {}
    for name, extra in (("files", args), ("packed", combined(args, overrides)),
                        ("sorted", [*args, "reader.access_order=sorted"])):
        out = tmp_path / f"out-{name}"
        res = run_cli(["run", "demo", *combined(extra, (f"output.folder={out}",)),
                       "output.access_log=true"], ranks=ranks)
        assert res.returncode == 0, res.stderr
        logs[name] = access_logs(out, (1, 2), ranks)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["dlio_mpi"]["format"] == ("indexed_binary" if name == "packed"
                                                 else "npz")
    steps = FILES // ranks // 2
    for name in logs:  # every rank read its share, every kept sample once per epoch
        for epoch in range(2):
            ids = np.concatenate(logs[name][epoch * ranks:(epoch + 1) * ranks])
            assert len(ids) == len(set(ids.tolist())) == steps * 2 * ranks
    for a, b in zip(logs["files"], logs["packed"]):
        assert np.array_equal(a, b)
    assert _sample_sets(logs["sorted"], 2) == _sample_sets(logs["files"], 2)
    for log in logs["sorted"]:
        batches = log.reshape(-1, 2)
        assert np.array_equal(batches, np.sort(batches, axis=1))
    assert any(not np.array_equal(a, b) for a, b in zip(logs["files"], logs["sorted"]))


def test_sorted_order_sorts_each_batch_by_file_and_offset_in_the_plan(tmp_path):
    cfg = load_config("demo", _args(tmp_path, dataset__format="indexed_binary",
                                    dataset__num_files_train=8,
                                    dataset__num_samples_per_file=16,
                                    dataset__record_length_bytes=4096,
                                    dataset__record_length_bytes_stdev=0,
                                    reader__file_shuffle="seed"))
    split = describe_dataset(cfg)["train"]
    spec = ShuffleSpec("seed", "seed", 7)
    steps, batch = 7, 8  # 2 ranks * 7 steps * 8 = 112 of the 128 samples
    for access in ("loader", "lean"):
        for rank in range(2):
            ids = rank_shard(8, 16, epoch_shuffle(spec, 1), rank, steps * batch)
            plans = {order: plan_reads(order_batches(ids, steps, batch, order), steps, batch,
                                       16, split.expected_layouts(), "sample",
                                       AccessPolicy(access))
                     for order in ("shuffled", "sorted")}
            for b in range(steps):
                parts = {}
                for order, plan in plans.items():
                    first, last = plan.batch_start[b], plan.batch_start[b + 1]
                    parts[order] = list(zip(plan.file_idx[first:last].tolist(),
                                            plan.offset[first:last].tolist()))
                assert parts["sorted"] == sorted(parts["shuffled"])
                assert sorted(plans["sorted"].sample_ids[b * batch:(b + 1) * batch]) == \
                    sorted(plans["shuffled"].sample_ids[b * batch:(b + 1) * batch])
            assert plans["sorted"].payload_bytes == plans["shuffled"].payload_bytes
    # whole-file loads (npz, one sample per file): each load's requests stay together
    npz = describe_dataset(load_config("demo", _args(tmp_path)))["train"]
    ids = rank_shard(FILES, 1, epoch_shuffle(spec, 1), 0, 6)
    for order in ("shuffled", "sorted"):
        plan = plan_reads(order_batches(ids, 3, 2, order), 3, 2, 1, npz.expected_layouts(),
                          "file", AccessPolicy("loader"))
        loads = np.flatnonzero(np.diff(np.r_[-1, plan.file_idx]) != 0)
        assert len(loads) == 6  # one run of requests per file, opened first, closed last
    assert np.array_equal(order_batches(ids, 3, 2, "shuffled"), ids)


def test_sorted_order_is_refused_with_the_framework_engine_and_read_once(tmp_path):
    cfg = load_config("demo", _args(tmp_path, reader__access_order="sorted",
                                    reader__engine="framework"))
    with pytest.raises(UserError, match="reader.access_order: sorted with reader.engine "
                                        "framework is not implemented yet"):
        derive_plan(cfg, 2)
    cfg = load_config("demo", _args(tmp_path, reader__access_order="sorted",
                                    reader__staging="read_once"))
    with pytest.raises(UserError, match="reader.access_order: sorted with reader.staging "
                                        "read_once is not implemented yet"):
        derive_plan(cfg, 2)


def test_refusals_before_any_io(tmp_path):
    target = tmp_path / "packed"
    multi = run_cli(["pack", "demo", *_args(tmp_path, dataset__num_samples_per_file=2),
                     "--to", str(target)])
    assert multi.returncode == 2
    assert "dataset.num_samples_per_file=2" in multi.stderr and "one sample per file" in \
        multi.stderr
    assert not target.exists() and not (tmp_path / "data").exists()
    inside = run_cli(["pack", "demo", *_args(tmp_path), "--to", str(tmp_path / "data" / "p")])
    assert inside.returncode == 2 and "apart from" in inside.stderr
    assert not (tmp_path / "data").exists()


def test_refusals_of_what_cannot_be_packed_and_of_folders_not_ours(tmp_path):
    args = _generate(tmp_path, 2, dataset__num_files_eval=0)
    target = tmp_path / "packed"
    odd = _pack(tmp_path, 2, args, "--samples-per-shard", "5")
    assert odd.returncode == 2
    assert "--samples-per-shard 5 does not divide the 12 samples" in odd.stderr
    assert "4, 6" in odd.stderr
    target.mkdir()
    (target / "mine.txt").write_text("user data")
    foreign = _pack(tmp_path, 2, args)
    assert foreign.returncode == 2 and "not dlio-mpi's" in foreign.stderr
    assert _files(target).keys() == {"mine.txt"}
    assert (target / "mine.txt").read_text() == "user data"
    unequal = tmp_path / "unequal"
    args = _generate(unequal, 2, dataset__num_files_eval=0,
                     dataset__record_length_bytes_stdev=500)
    res = run_cli(["pack", "demo", *args, "--to", str(unequal / "packed")])
    assert res.returncode == 2
    assert "unequal sizes is not implemented yet" in res.stderr


def test_the_study_script_on_a_tiny_dataset(tmp_path):
    work = tmp_path / "study"
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "small_files_study.py"), "--work", str(work),
         "--files", "32", "--sample-bytes", "2048", "--epochs", "2", "--batch", "4",
         "--computation-time", "0.001", "--samples-per-shard", "8"],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    with open(work / "small_files_study.csv") as fp:
        rows = {row["variant"]: row for row in csv.DictReader(fp)}
    assert list(rows) == ["original", "packed", "lean", "sorted"]
    for row in rows.values():
        assert float(row["samples_per_second"]) > 0 and float(row["mib_per_second"]) > 0
        assert 0 <= float(row["au_percentage"]) <= 100
        assert int(row["epochs"]) == 2 and os.path.isdir(row["output_folder"])
    opens = {name: int(row["file_opens"]) for name, row in rows.items()}
    assert opens["original"] == opens["sorted"] == 2 * 32  # every sample opens its file
    assert opens["lean"] < opens["original"]  # handles kept across epochs
    assert opens["packed"] <= 2 * 4 * 2  # 4 shards, at most once per rank and epoch
    assert (work / "small_files_study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "variant" in res.stdout and "packed" in res.stdout


def test_a_pack_without_room_is_refused_and_leaves_nothing(tmp_path, small_fs):
    """12 shards of 600 KB to a 24 MiB tmpfs holding 23.5 MiB already: one message naming
    --to, the room and the need, exit 2, and no manifest or folder left (it used to leave an
    incomplete pack's manifest and split folders)."""
    args = _generate(tmp_path, 2, dataset__num_files_eval=0,
                     dataset__record_length_bytes=600_000)
    (small_fs / "filler").write_bytes(b"\0" * (23 * 2**20 + 2**19))
    res = run_cli(["pack", "demo", *args, "--to", str(small_fs / "new" / "packed")])
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "--to:" in errors[0] and "free, but" in errors[0], res.stderr
    assert [p.name for p in small_fs.iterdir()] == ["filler"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_pack_stopped_by_a_signal_resumes_and_sigterm_leaves_no_temporary(tmp_path, sig):
    """SIGTERM to one rank: the ranks stop after the shard being written (whole, committed),
    exit 128 + 15, no temporary left and the folder released; SIGKILL: the next pack removes
    what was left. Either way the rerun completes the pack."""
    files = 1500
    args = _generate(tmp_path, 2, dataset__num_files_train=files, dataset__num_files_eval=0,
                     dataset__record_length_bytes=4000)
    target = tmp_path / "packed"
    job = subprocess.Popen([mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi",
                            "pack", "demo", *args, "--to", str(target),
                            "--samples-per-shard", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def shards() -> int:
        return len(list((target / "train").glob("*.indexed_binary"))) \
            if (target / "train").is_dir() else 0

    signal_one_rank_when(job, str(target), lambda: shards() > 100, sig)
    _, err = job.communicate(timeout=120)
    if sig == signal.SIGTERM:
        assert job.returncode == 128 + sig and "pack stopped by SIGTERM" in err, err
        assert not [p for p in target.rglob("*") if ".dlio_mpi-" in p.name]
        assert not (target / "dlio_mpi.lock").exists()
    else:
        assert job.returncode != 0
    assert shards() < files, "the signal came too late to test anything"
    res = _pack(tmp_path, 2, args, "--samples-per-shard", "1")
    assert res.returncode == 0, res.stderr
    assert shards() == files and not [p for p in target.rglob("*") if ".dlio_mpi-" in p.name]
    assert json.loads((target / "dlio_mpi_manifest.json").read_text())["complete"]
