"""`dlio-mpi datasize`: MLPerf Storage's dataset sizing rule (Rules.md 3.1.2) gives the numbers
MLPerf's own datasize step printed for published submissions; bad options are refused with one
message; validate warns when a run's dataset is smaller than the rule asks for its ranks and
hosts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import run_cli

pytestmark = pytest.mark.timeout(180)

GIB = 2**30

# What MLPerf Storage v1.0's `benchmark.sh datasize` printed for YanRongTech's closed
# submission (mlcommons/storage_results_v1.0, commit 1c5efa73dc3064cc0d1cf3aac2196ef520183217,
# Closed/YanRongTech/code/benchmark_code_v1.0/*_gen_*.sh): workload, accelerators, client
# hosts, GB per host -> "Minimum F files are required which will consume G GB of storage".
# The workloads' batch, samples per file and record length are those of the shipped h100 ones.
PUBLISHED = [
    ("unet3d_h100", 36, 1, 251, 126000, 17203),
    ("unet3d_h100", 48, 1, 251, 168000, 22937),
    ("unet3d_h100", 66, 3, 251, 231000, 31539),
    ("resnet50_h100", 600, 3, 251, 95923, 12814),     # 120,000,000 / 1251 rounded down
    ("cosmoflow_h100", 60, 1, 251, 476419, 1254),     # 476419.54 by memory, rounded down
    ("cosmoflow_h100", 180, 3, 251, 1429258, 3764),
]


def _datasize(args: list[str], capsys) -> tuple[int, str, str]:
    from dlio_mpi.cli import main

    code = main(["datasize", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("workload", "accelerators", "hosts", "gb", "files", "disk_gb"),
                         PUBLISHED)
def test_the_rule_gives_mlperf_s_published_numbers(workload, accelerators, hosts, gb, files,
                                                   disk_gb, capsys):
    from dlio_mpi.config import load_config
    from dlio_mpi.plan.datasize import sizing_for

    s = sizing_for(load_config(workload), accelerators, hosts, gb * GIB * hosts)
    assert s.files == files
    assert int(s.disk_bytes / GIB) == disk_gb  # the shell script's bc truncated the GB
    code, out, err = _datasize([workload, "--accelerators", str(accelerators), "--hosts",
                                str(hosts), "--host-memory-gb", str(gb)], capsys)
    assert (code, err) == (0, "")
    assert f"Number of training files: {files}\n" in out
    assert f"\noverrides: dataset.num_files_train={files}\n" in out


def test_the_output_says_files_samples_space_and_which_bound_set_them(capsys):
    code, out, _ = _datasize(["resnet50_h100", "--accelerators", "600", "--hosts", "3",
                              "--host-memory-gb", "251", "reader.read_threads=4"], capsys)
    assert code == 0
    assert "500 steps x batch 400 x 600 accelerator(s) = 120000000 samples: 95923 files" in out
    assert "5 x 753 GiB of host memory / (1251 x 114660.07-byte samples per file): " \
           "28183 files" in out
    assert "Number of training samples: 119999673\n" in out  # 95923 x 1251
    assert "Total disk space required for training: 12814.23 GB\n" in out
    assert "dictated by 500 step requirement" in out
    assert "dataset.num_subfolders_train=9 keeps near 10,000 files per folder" in out
    # the user's overrides are kept, num_files_train replaced by the rule's
    assert out.endswith("run it with: dlio-mpi run resnet50_h100 reader.read_threads=4 "
                        "dataset.num_files_train=95923\n")
    code, out, _ = _datasize(["cosmoflow_h100", "--accelerators", "60", "--host-memory-gb",
                              "251", "dataset.num_files_train=10"], capsys)
    assert "dictated by dataset size to memory size ratio" in out
    assert out.endswith("run it with: dlio-mpi run cosmoflow_h100 "
                        "dataset.num_files_train=476419\n")


def test_samples_per_file_and_batch_come_from_the_overrides(capsys):
    # 500 x 4 x 3 = 6000 samples in files of 7: 857 files (6000 / 7 = 857.1, rounded down)
    code, out, _ = _datasize(["demo", "--accelerators=3", "--host-memory-gb=0.001",
                              "reader.batch_size=4", "dataset.num_samples_per_file=7"], capsys)
    assert code == 0 and "Number of training files: 857\n" in out
    assert "Number of training samples: 5999\n" in out


@pytest.mark.parametrize(("args", "record"), [
    # no record_length_bytes: the columns as mlpstorage counts them (rules/utils.py @4234cd9b):
    # float32 x (1 + 128 + 256 + 64 + 512) = 3,844 bytes, read: false columns included
    ([], 3844),
    # float64 and int64 count 8, uint8 and bool 1, float16 and every other dtype 4
    (['dataset.parquet.columns=[{name: a, dtype: float64, size: 3}, {name: b, dtype: bool},'
      ' {name: c, dtype: float16, size: 2}, {name: d, dtype: int64}]'], 24 + 1 + 8 + 8),
    # given, it decides, as in mlpstorage, whatever the columns hold
    (["dataset.record_length_bytes=512"], 512),
])
def test_a_parquet_workload_without_a_record_length_is_sized_by_its_columns(args, record,
                                                                             capsys):
    code, out, _ = _datasize(["mlperf/parquet_selective_read_example", "--accelerators=1",
                              "--host-memory-gb=64", *args], capsys)
    files = 5 * 64 * GIB // (1000 * record)  # 1,000 rows a file
    assert code == 0 and f"(1000 x {record}-byte samples per file): {files} files" in out
    assert f"Number of training files: {files}\n" in out


@pytest.mark.parametrize(("args", "words"), [
    (["--accelerators", "0", "--host-memory-gb", "1"],
     "--accelerators 0: expected a whole number from 1 to 16,777,216"),
    (["--accelerators", "2.5", "--host-memory-gb", "1"],
     "--accelerators 2.5: expected a whole number from 1 to 16,777,216"),
    (["--accelerators", "2", "--hosts", "x", "--host-memory-gb", "1"],
     "--hosts x: expected a whole number from 1 to 16,777,216"),
    (["--accelerators", "100000000000000000000", "--host-memory-gb", "1"],
     "--accelerators 100000000000000000000: expected a whole number from 1 to 16,777,216"),
    (["--accelerators", "2", "--hosts", "3", "--host-memory-gb", "1"],
     "--hosts 3: more hosts than --accelerators 2; expected at most one host per accelerator"),
    (["--accelerators", "2", "--host-memory-gb", "1e308"],  # was an OverflowError
     "--host-memory-gb 1e308: expected a number of GiB > 0 and <= 1,048,576"),
    (["--accelerators", "2", "--host-memory-gb", "-3"],
     "--host-memory-gb -3: expected a number of GiB > 0"),
    (["--accelerators", "2", "--host-memory-gb", "nan"],
     "--host-memory-gb nan: expected a number of GiB > 0"),
    (["--accelerators", "2", "--host-memory-gb", "1", "reader.batch_size=0"],
     "reader.batch_size: expected an integer >= 1"),
    (["llama_7b", "--accelerators", "2", "--host-memory-gb", "1"],
     "llama_7b: workflow.train is false; the sizing rule is for training workloads"),
])
def test_bad_options_are_refused_with_one_message(args, words, capsys):
    code, out, err = _datasize(args, capsys)
    assert code == 2 and out == ""
    assert err == f"dlio-mpi datasize: error: {words}" + err[len("dlio-mpi datasize: error: ")
                                                            + len(words):]
    assert err.count("\n") == 1


def test_a_missing_option_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        _datasize(["demo", "--accelerators", "2"], capsys)
    assert info.value.code == 2
    assert "the following arguments are required: --host-memory-gb" in capsys.readouterr().err


def test_datasize_runs_without_mpi():
    code = ("import sys; from dlio_mpi.cli import main; "
            "rc = main(['datasize', 'unet3d_h100', '--accelerators', '8', '--host-memory-gb', "
            "'64']); assert 'mpi4py.MPI' not in sys.modules; sys.exit(rc)")
    res = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "Number of training files: 28000" in res.stdout  # 500 x 7 x 8


@pytest.mark.parametrize("ranks", [2, 3])
def test_datasize_started_by_mpiexec_prints_once(ranks):
    """It runs without MPI: each process started computes the same; the launcher's rank 0
    alone prints, its output and its refusals."""
    res = run_cli(["datasize", "unet3d_h100", "--accelerators", "8", "--host-memory-gb", "64"],
                  ranks=ranks)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("Number of training files: 28000\n") == 1, res.stdout
    res = run_cli(["datasize", "unet3d_h100", "--accelerators", "8", "--host-memory-gb", "0"],
                  ranks=ranks)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("dlio-mpi datasize: error: --host-memory-gb 0") == 1, res.stderr


def _rule_warnings(args: list[str], ranks: int, env: dict | None = None) -> list[str]:
    res = run_cli(["validate", "demo", *args, "--ranks", str(ranks), "--json"], ranks=1,
                  env=env)
    assert res.returncode == 0, res.stderr
    return [w for w in json.loads(res.stdout)["warnings"] if "dataset sizing rule" in w]


def test_validate_warns_below_the_rule_for_its_ranks_and_hosts(tmp_path):
    from dlio_mpi.config import load_config
    from dlio_mpi.mpi.topology import host_info
    from dlio_mpi.plan.datasize import sizing_for

    # samples of 100 MB, batch 1: the memory bound sets the count on this host
    base = ["model.name=unet3d", f"dataset.data_folder={tmp_path / 'none'}",
            "dataset.record_length_bytes=100000000",
            "dataset.record_length_bytes_stdev=0", "reader.batch_size=1"]
    memory = host_info().memory_bytes
    need = sizing_for(load_config("demo", base), 1, 1, memory)
    assert need.memory_bound and need.files > 500
    assert _rule_warnings([*base, f"dataset.num_files_train={need.files}"], 1) == []
    [warning] = _rule_warnings([*base, f"dataset.num_files_train={need.files - 1}"], 1)
    assert warning.startswith(f"dataset.num_files_train={need.files - 1} is below MLPerf "
                              "Storage's dataset sizing rule (Rules.md 3.1.2): 1 rank(s) on "
                              f"1 host(s) need {need.files} files (5 x the hosts' ")
    # two emulated nodes (DLIO_MPI_RANKS_PER_NODE=1) count as two hosts: twice the memory
    two = sizing_for(load_config("demo", base), 2, 2, 2 * memory)
    [warning] = _rule_warnings([*base, f"dataset.num_files_train={need.files}"], 2,
                               env={"DLIO_MPI_RANKS_PER_NODE": "1"})
    assert f"2 rank(s) on 2 host(s) need {two.files} files" in warning
    assert "--accelerators 2 --hosts 2 --host-memory-gb" in warning
    # the steps bound: 500 steps x batch 16 x 4 ranks is 32000 files (the memory bound is
    # fewer on hosts of less than 640 GB)
    steps = [*base[:4], "reader.batch_size=16"]
    assert not sizing_for(load_config("demo", steps), 4, 1, memory).memory_bound
    [warning] = _rule_warnings([*steps, "dataset.num_files_train=31999"], 4)
    assert "need 32000 files (500 steps x batch 16 x 4 ranks)" in warning
    assert _rule_warnings([*steps, "dataset.num_files_train=32000"], 4) == []
    # a run that does not train, or of a model MLPerf Storage does not benchmark, is not
    # sized by the rule
    assert _rule_warnings([*steps, "workflow.train=false"], 4) == []
    assert _rule_warnings([*steps[1:], "dataset.num_files_train=31999"], 4) == []  # demo
    assert not (tmp_path / "none").exists()
