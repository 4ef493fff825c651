"""What a run records to be reproduced (summary.json's dlio_mpi.environment and
dlio_mpi.config) and how it shows its progress (rank 0 only: lines in a log, a bar on a
terminal)."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from helpers import run_cli, workload_overrides

pytestmark = pytest.mark.timeout(180)


def test_summary_records_software_command_line_placement_folders_and_config(tmp_path,
                                                                             monkeypatch):
    import mpi4py
    import numpy
    from mpi4py import MPI

    monkeypatch.setenv("DLIO_MPI_RANKS_PER_NODE", "1")  # two emulated nodes of one rank
    args = ["run", "demo", *workload_overrides(
        tmp_path, workflow__checkpoint="true", checkpoint__checkpoint_folder=str(tmp_path / "ck"),
        checkpoint__epochs_between_checkpoints=1, model__model_size_bytes=1 << 20)]
    res = run_cli(args)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    ours = summary["dlio_mpi"]
    env = ours["environment"]
    versions = env["versions"]
    assert versions["dlio_mpi"] == ours["version"]
    assert versions["mpi4py"] == mpi4py.__version__ and versions["numpy"] == numpy.__version__
    assert versions["python"] == ".".join(str(v) for v in sys.version_info[:3])
    assert "torch" not in versions and "tensorflow" not in versions  # never imported to look
    name, version = MPI.get_vendor()
    assert env["mpi"]["name"] == name
    assert env["mpi"]["version"] == ".".join(map(str, version))
    first = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0].strip()
    assert env["mpi"]["library_version"] == first
    assert env["command_line"][1:] == args  # argv[0]: dlio_mpi's __main__
    assert env["ranks"] == 2 and sum(env["ranks_per_host"].values()) == 2
    assert [n["ranks"] for n in env["nodes"]] == [[0], [1]]
    assert [n["node"] for n in env["nodes"]] == [0, 1]
    assert {n["host"] for n in env["nodes"]} == set(env["ranks_per_host"]) == set(ours["hosts"])
    assert ours["nodes"] == 2 and ours["ranks_per_node"] == 1
    # every folder the run used, with its file system
    fs = ours["filesystems"]
    assert set(fs) == {"data_folder", "data_file", "checkpoint_folder", "output_folder"}
    assert fs["checkpoint_folder"]["path"] == str(tmp_path / "ck")
    assert all(f["type"] not in ("", "unknown") for f in fs.values())
    # the resolved configuration: every key, the overrides applied, as config.yaml holds it
    config = ours["config"]
    assert config["dataset"]["num_files_train"] == 8 and config["reader"]["batch_size"] == 2
    assert config["checkpoint"]["checkpoint_folder"] == str(tmp_path / "ck")
    assert config["output"]["folder"] == str(tmp_path / "out")
    written = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())["workload"]
    assert config == json.loads(json.dumps(written))
