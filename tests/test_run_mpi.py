"""Generation and training on 2 ranks, in-process (mpiexec -n 2 python -m pytest --with-mpi).
The access log proves the partition: across ranks every kept sample is read exactly once per
epoch, shuffling changes the order between epochs, the same seed gives the same order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from helpers import access_logs, workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _run(tmp, **values):
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    cfg = load_config("demo", workload_overrides(tmp, **values))
    return cfg, run(_comm(), cfg)


SHUFFLED = dict(dataset__num_files_train=10, dataset__num_samples_per_file=3,
                dataset__format="npy", reader__read_mode="sample",
                reader__sample_shuffle="seed", reader__file_shuffle="seed",
                output__access_log="true", train__epochs=3)


def test_every_kept_sample_is_read_exactly_once_per_epoch(shared_tmp):
    comm = _comm()
    cfg, summary = _run(shared_tmp, **SHUFFLED)
    size = comm.Get_size()
    steps = 30 // size // 2
    orders = []
    for epoch in (1, 2, 3):
        shards = access_logs(cfg.output.folder, [epoch], size)
        assert all(len(s) == steps * 2 for s in shards), [len(s) for s in shards]
        union = np.concatenate(shards)
        assert len(set(union.tolist())) == len(union) == steps * 2 * size, \
            f"epoch {epoch}: a sample was read twice: {sorted(union.tolist())}"
        assert set(union.tolist()) <= set(range(30))
        orders.append(union)
    assert not np.array_equal(orders[0], orders[1]), "shuffle did not change the order"
    # bytes: sample mode reads exactly one sample extent per consumed sample
    sample_bytes = int(np.sqrt(4096)) ** 2
    per_epoch = steps * 2 * size * sample_bytes
    assert summary["metric"]["train_bytes_read"] == 3 * per_epoch
    assert summary["metric"]["train_bytes_requested"] == 3 * per_epoch
    assert summary["metric"]["train_requests"] == 3 * steps * 2 * size
    assert summary["num_accelerators"] == size


def test_same_seed_gives_same_order_and_rerun_skips_generated_files(shared_tmp):
    comm = _comm()
    cfg, _ = _run(shared_tmp / "a", **SHUFFLED)
    first = [access_logs(cfg.output.folder, [e], comm.Get_size()) for e in (1, 2)]
    data = cfg.dataset.data_folder
    mtimes = {p: os.stat(os.path.join(data, "train", p)).st_mtime_ns
              for p in os.listdir(os.path.join(data, "train"))}
    comm.Barrier()
    cfg2, _ = _run(shared_tmp / "a", **SHUFFLED)
    again = [access_logs(cfg2.output.folder, [e], comm.Get_size()) for e in (1, 2)]
    for a, b in zip(first, again):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert mtimes == {p: os.stat(os.path.join(data, "train", p)).st_mtime_ns
                      for p in os.listdir(os.path.join(data, "train"))}, "files were rewritten"
    manifest = json.loads((Path(data) / "dlio_mpi_manifest.json").read_text())
    assert manifest["complete"] and manifest["params"]["num_files_train"] == 10


def test_generated_bytes_do_not_depend_on_rank_count(shared_tmp):
    from dlio_mpi.config import load_config
    from dlio_mpi.data.dataset import describe_dataset
    from dlio_mpi.data.generate import generate

    comm = _comm()
    over = dict(dataset__num_files_train=5, dataset__num_files_eval=2,
                dataset__record_length_bytes=10000, dataset__record_length_bytes_stdev=3000)
    cfg_all = load_config("demo", workload_overrides(shared_tmp / "all", **over))
    generate(comm, cfg_all, describe_dataset(cfg_all))
    solo = comm.Split(0 if comm.Get_rank() == 0 else 1, comm.Get_rank())
    if comm.Get_rank() == 0:
        cfg_one = load_config("demo", workload_overrides(shared_tmp / "one", **over))
        generate(solo, cfg_one, describe_dataset(cfg_one))
    comm.Barrier()
    solo.Free()
    sizes = set()
    for split in ("train", "valid"):
        names = sorted(os.listdir(shared_tmp / "all" / "data" / split))
        assert len(names) == (5 if split == "train" else 2)
        for name in names:
            a = (shared_tmp / "all" / "data" / split / name).read_bytes()
            b = (shared_tmp / "one" / "data" / split / name).read_bytes()
            assert a == b, f"{split}/{name} differs between 2 ranks and 1 rank"
            sizes.add(len(a))
    assert len(sizes) > 1, "record_length_bytes_stdev should vary file sizes"


def test_a_bad_config_raises_the_same_error_on_every_rank():
    from dlio_mpi.config import ConfigError, load_config
    from dlio_mpi.errors import JobError, check_all

    with pytest.raises(JobError, match="dataset.num_files_train"):
        check_all(_comm(), lambda: load_config("demo", ["dataset.num_file_train=3"]),
                  expected=(ConfigError,))


def test_an_error_on_one_rank_only_reaches_every_rank():
    from dlio_mpi.errors import JobError, UserError, check_all, on_root

    comm = _comm()

    def fail_on_last():
        if comm.Get_rank() == comm.Get_size() - 1:
            raise UserError("disk on fire")
        return 1

    with pytest.raises(JobError, match=f"disk on fire \\(on rank {comm.Get_size() - 1}\\)"):
        check_all(comm, fail_on_last)

    def fail_on_root():
        raise UserError("root cannot list the folder")

    with pytest.raises(JobError, match="root cannot list"):
        on_root(comm, fail_on_root)


def test_the_other_ranks_sleep_while_rank_0_works_when_asked_to_nap():
    import time

    from dlio_mpi.errors import JobError, UserError, on_root

    comm = _comm()

    def work():  # half a second on a CPU, as writing many epochs' results
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            pass
        return "written"

    cpu = time.process_time()
    assert on_root(comm, work, nap=True) == "written"
    if comm.Get_rank():  # a blocking bcast spins all along on a waiting rank
        assert time.process_time() - cpu < 0.15

    def fail_on_root():
        raise UserError("root cannot write")

    with pytest.raises(JobError, match="root cannot write"):
        on_root(comm, fail_on_root, nap=True)


def test_evaluation_runs_when_due_and_reads_every_valid_sample_once(shared_tmp):
    comm = _comm()
    cfg, summary = _run(shared_tmp, dataset__num_files_train=12, dataset__num_files_eval=6,
                        reader__batch_size_eval=1,
                        workflow__evaluation="true", evaluation__eval_after_epoch=2,
                        evaluation__epochs_between_evals=1, evaluation__eval_time=0.001,
                        train__epochs=3, output__access_log="true",
                        dataset__format="npy", reader__read_mode="sample")
    size = comm.Get_size()
    metric = summary["metric"]
    assert len(metric["eval_au_percentage"]) == 2  # after epochs 2 and 3, not 1
    logs = os.listdir(os.path.join(cfg.output.folder, "access_log"))
    assert not any(name.startswith("eval_epoch1_") for name in logs)
    for epoch in (2, 3):
        ids = np.concatenate([np.load(os.path.join(cfg.output.folder, "access_log",
                                                   f"eval_epoch{epoch}_rank{r}.npy"))
                              for r in range(size)])
        kept = 6 // size * size
        assert sorted(ids.tolist()) == list(range(kept)), f"eval epoch {epoch}: {ids}"
    assert metric["eval_bytes_read"] == 2 * (6 // size * size) * 64 * 64
    stats = json.loads((Path(cfg.output.folder) / "per_epoch_stats.json").read_text())
    assert "eval" not in stats["1"] and stats["2"]["eval"]["steps"] == 6 // size


def test_real_compute_time_is_compute_and_au_follows_the_known_timings(shared_tmp):
    comm = _comm()
    size = comm.Get_size()
    steps, compute = 12, 0.02
    cfg, summary = _run(shared_tmp, dataset__num_files_train=steps * size,
                        dataset__format="npy", reader__batch_size=1,
                        train__computation_time=compute, train__epochs=2)
    stats = json.loads((Path(cfg.output.folder) / "per_epoch_stats.json").read_text())
    for epoch in ("1", "2"):
        for r in stats[epoch]["per_rank"]:
            assert r["steps"] == steps
            # the compute wait lasts the planned time (plus its small measured overshoot) ...
            assert steps * compute <= r["compute_seconds"] < steps * (compute + 0.002), r
            assert r["overshoot_us_per_step"] == pytest.approx(
                (r["compute_seconds"] - steps * compute) / steps * 1e6, abs=1.0)
            # ... and storage (tiny files in the page cache) hardly makes anyone wait
            assert r["wait_seconds"] < 0.25 * r["compute_seconds"], r
            # AU: planned compute of steps 1.. over the block less step 0
            assert r["au_percentage"] == pytest.approx(
                100 * (steps - 1) * compute / r["au_span_seconds"], rel=1e-9)
            assert 75 < r["au_percentage"] <= 100
            assert r["au_without_barrier_percentage"] >= r["au_percentage"]
            # DLIO 2.0.0's throughput: all steps x batch over the block's wall time
            assert r["samples_per_second"] == pytest.approx(steps / r["block_seconds"])
            assert r["samples_per_second"] == pytest.approx(1 / compute, rel=0.25)
            overhead = (r["overshoot_us_per_step"] + r["sync_wakeup_us_per_step"]
                        + r["loop_us_per_step"])
            assert 0 <= overhead < 2000, r
            assert r["sync_seconds"] == pytest.approx(
                r["sync_imbalance_seconds"] + r["sync_wakeup_us_per_step"] * steps / 1e6,
                abs=1e-6)
    metric = summary["metric"]
    assert metric["train_throughput_mean_samples_per_second"] == pytest.approx(
        size / compute, rel=0.25)
    assert metric["train_io_mean_MB_per_second"] == pytest.approx(
        metric["train_throughput_mean_samples_per_second"] * 4096 / 2**20)
    assert 75 < metric["train_au_mean_percentage"] <= 100
    overhead = metric["train_emulator_overhead_us_per_step"]
    assert set(overhead) == {"sleep_overshoot", "sync_wakeup", "loop", "total"}
    assert summary["dlio_mpi"]["pacing"]["compute_spin_us"] == "auto"


def test_emulated_nodes_split_the_ranks_and_the_host_fields_follow(shared_tmp, monkeypatch):
    comm = _comm()
    size = comm.Get_size()
    monkeypatch.setenv("DLIO_MPI_RANKS_PER_NODE", "1")
    cfg, summary = _run(shared_tmp, dataset__num_files_train=4 * size)
    assert summary["num_hosts"] == size and summary["dlio_mpi"]["nodes"] == size
    assert summary["dlio_mpi"]["emulated_nodes"] is True
    assert len(summary["host_memory_GB"]) == len(summary["host_cpu_count"]) == size
    assert summary["potential_caching"] == [1] * size
    # DLIO's data per host: ranks per node x samples / ranks x record length
    assert summary["data_size_per_host_GB"] == pytest.approx(4 * size // size * 4096 / 2**30)
    # the batch poll's "auto" counts the host's ranks, not an emulated node's
    from dlio_mpi.mpi.pacing import auto_batch_spin_ns, models_loader_costs, usable_cpus

    pacing = summary["dlio_mpi"]["pacing"]
    assert pacing["batch_spin_us"] == "auto"
    assert pacing["batch_spin_us_now"]["max"] == auto_batch_spin_ns(
        size, cfg.reader.read_threads, usable_cpus(), models_loader_costs(cfg.reader)) / 1e3


def test_a_bad_ranks_per_node_is_one_clear_error(monkeypatch):
    from dlio_mpi.errors import JobError, check_all
    from dlio_mpi.mpi.topology import emulated_ranks_per_node

    monkeypatch.setenv("DLIO_MPI_RANKS_PER_NODE", "two")
    with pytest.raises(JobError, match="DLIO_MPI_RANKS_PER_NODE='two'"):
        check_all(_comm(), emulated_ranks_per_node)


def test_the_step_loop_falls_back_to_mpi4py_without_the_mpi_symbols(shared_tmp, monkeypatch):
    import dlio_mpi.mpi.pacing

    dlio_mpi.mpi.pacing.mpi_functions.cache_clear()
    monkeypatch.setattr(dlio_mpi.mpi.pacing, "mpi_functions", lambda: None)
    comm = _comm()
    cfg, summary = _run(shared_tmp, dataset__num_files_train=6 * comm.Get_size(),
                        train__computation_time=0.005, reader__batch_size=1,
                        output__access_log="true")
    stats = json.loads((Path(cfg.output.folder) / "per_epoch_stats.json").read_text())
    for r in stats["1"]["per_rank"]:
        assert r["steps"] == 6 and r["compute_seconds"] >= 6 * 0.005
    shards = access_logs(cfg.output.folder, [1], comm.Get_size())
    union = np.concatenate(shards)
    assert len(set(union.tolist())) == len(union) == 6 * comm.Get_size()


def test_a_stuck_read_is_reported_by_its_rank_alone_while_the_others_wait(shared_tmp,
                                                                          monkeypatch, capfd):
    comm = _comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    files = 4 * size  # unshuffled, one sample per file: rank r reads files 4r .. 4r + 3
    stuck = f"img_{4 * size - 3:0{len(str(files))}d}_of_{files}.npz"
    if rank == size - 1:  # the engine's test hook: this read hangs for 2 s
        monkeypatch.setenv("DLIO_MPI_TEST_STALL", f"read:2:{stuck}")
    _run(shared_tmp, dataset__num_files_train=files, reader__batch_size=1, train__epochs=1,
         reader__io_watchdog_seconds=0.5,
         reader__file_shuffle="off", reader__sample_shuffle="off")
    reports = [line for line in capfd.readouterr().err.splitlines() if "watchdog" in line]
    if rank == size - 1:
        assert len(reports) == 1 and reports[0].startswith(
            f"dlio-mpi: rank {rank}: watchdog: a read of ") and stuck in reports[0], reports
    else:
        assert reports == []
