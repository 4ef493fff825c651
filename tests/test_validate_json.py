"""`dlio-mpi validate --json`: the whole derived plan as one JSON object, equal field for field
to the text plan; bad input exits 2 with one JSON error object on stdout (the message, its key,
the status); storage too small for the dataset is a warning for validate and a refusal before
any I/O for run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import run_cli, workload_overrides

pytestmark = pytest.mark.timeout(180)

TIB = 2**40  # a sample of 1 TiB: a few files outgrow any test machine's disk


def _size(n: float) -> str:
    from dlio_mpi.units import size_text

    return size_text(n)


def _validate(args: list[str], json_out: bool, ranks: int = 1):
    res = run_cli(["validate", *args, *(["--json"] if json_out else [])], ranks=ranks)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _lines(text: str) -> dict[str, list[str]]:
    """The text plan's lines by their label (the first 16 columns)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        out.setdefault(line[:16].strip(), []).append(line[16:])
    return out


def _free_masked(lines: list[str]) -> list[str]:
    """Warnings with the free space they quote masked: the JSON and the text plan come from
    two runs, and whatever else writes to the disk meanwhile changes it."""
    return [re.sub(r"has [\d,.]+ GiB( \([\d,]+ bytes\))? free", "has N GiB free", line)
            for line in lines]


def _check_equal(plan: dict, text: str) -> None:
    """Every field of the JSON plan says what the text plan says."""
    lines = _lines(text)
    assert lines["workload"] == ([f"{plan['workload']}: {plan['format']}, read mode "
                                  f"{plan['read_mode']}, O_DIRECT "
                                  f"{'on' if plan['odirect'] else 'off'}"]
                                 if plan["uses_dataset"] else
                                 [f"{plan['workload']}: no dataset"])
    assert lines["ranks"] == [f"{plan['ranks']} ({plan['ranks_per_node']} per node)"]
    assert lines["workload file"] == [plan["workload_file"]]
    notes = lines.get("note", [])
    if not plan["uses_dataset"]:
        assert "dataset" in lines and "training data" not in lines
    else:
        train, ev = plan["train"], plan["eval"]
        assert lines["training data"] == [f"{train['files']} files, {train['samples']} samples "
                                          f"({train['samples_per_file']} per file)"]
        assert train["samples_per_rank"] == train["steps_per_epoch"] * train["batch_size"]
        assert lines["per epoch"] == [
            f"{train['steps_per_epoch']} steps of batch {train['batch_size']} per rank = "
            f"{train['samples_per_rank']} samples per rank; {plan['epochs']} epochs"]
        if ev["steps_per_epoch"]:
            assert lines["evaluation"][0].startswith(
                f"{ev['steps_per_epoch']} steps of batch {ev['batch_size']} per rank")
        else:
            assert "evaluation" not in lines
        assert lines["bytes per epoch"] == [
            f"{_size(plan['bytes_per_epoch'])} read by all ranks "
            f"({_size(plan['bytes_per_node_per_epoch'])} per node)"]
        assert lines["dataset size"] == [
            f"{_size(plan['dataset_bytes'])} vs {_size(plan['memory_bytes'])} of memory on the "
            f"{plan['nodes']} node(s)"]
        assert plan["fits_in_memory"] == (plan["dataset_bytes"] <= plan["memory_bytes"])
        if plan["page_cache_note"]:
            assert notes[0] == plan["page_cache_note"] and plan["fits_in_memory"]
            notes = notes[1:]
        if plan["generation"]:
            assert lines["generation"] == [plan["generation"]["text"]]
            assert str(plan["generation"]["files"]) in plan["generation"]["text"]
        else:
            assert "generation" not in lines
    assert notes == plan["notes"]
    assert _free_masked(lines.get("warning", [])) == _free_masked(plan["warnings"])
    storage = [line for line in text.splitlines()
               if line.startswith(("file system ", "striping "))]
    assert storage == [line for line in plan["storage"]
                       if line.startswith(("file system ", "striping "))]
    assert isinstance(plan["file_access"], str)


@pytest.mark.parametrize("args,ranks", [
    (["demo"], 2),
    (["demo", "dataset.num_files_train=512"], 64),
    (["demo", "workflow.evaluation=true", "dataset.num_files_eval=8", "reader.odirect=true",
      "storage.lustre.stripe_count=4", "reader.file_access=shared"], 4),
    (["unet3d_h100", "workflow.generate_data=true"], 8),
    (["llama_7b"], 8),  # no dataset: checkpointing only
])
def test_json_plan_equals_the_text_plan(tmp_path, args, ranks):
    args = [*args, f"dataset.data_folder={tmp_path / 'data'}"]
    plan = json.loads(_validate([*args, "--ranks", str(ranks)], json_out=True))
    text = _validate([*args, "--ranks", str(ranks)], json_out=False)
    assert plan["ranks"] == ranks and plan["workload"] in text
    _check_equal(plan, text)
    assert not (tmp_path / "data").exists()


def test_json_plan_fields_and_values():
    plan = json.loads(_validate(["demo", "--ranks", "2"], json_out=True))
    assert {"workload", "format", "read_mode", "odirect", "file_access", "ranks",
            "ranks_per_node", "nodes", "train", "eval", "epochs", "bytes_per_epoch",
            "bytes_per_node_per_epoch", "dataset_bytes", "memory_bytes", "fits_in_memory",
            "generation", "storage", "notes", "warnings"} <= set(plan)
    assert (plan["workload"], plan["format"], plan["file_access"]) == ("demo", "npz", "multi")
    from dlio_mpi.config.loader import workload_dir  # the shipped file that was read

    assert plan["workload_file"] == str(Path(workload_dir().joinpath("demo.yaml")).resolve())
    assert plan["train"]["files"] == plan["train"]["samples"] == 32
    assert plan["train"]["steps_per_epoch"] == 32 // 2 // plan["train"]["batch_size"]
    assert plan["generation"]["how"] == "round_robin" and plan["generation"]["writers"] == 2
    assert isinstance(plan["notes"], list) and plan["warnings"] == []


def test_json_is_printed_once_on_several_ranks():
    res = run_cli(["validate", "demo", "--json"], ranks=2)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["ranks"] == 2  # one object: json.loads refuses two


@pytest.mark.parametrize("args,words,key", [
    (["demo", "--ranks", "64"], "reader.batch_size=2 is larger than a rank's share",
     "reader.batch_size"),
    (["demo", "reader.batch_size=0"], "reader.batch_size: expected an integer >= 1",
     "reader.batch_size"),
    (["demo", "dataset.num_file_train=3"], "did you mean 'dataset.num_files_train'",
     "dataset.num_file_train"),
    (["demo", "--ranks", "0"], "--ranks 0: a plan needs at least 1 rank", None),
    (["no_such_workload"], "no_such_workload", None),
    # usage errors, found by argparse before any configuration is read
    (["demo", "--ranks", "x"], "argument --ranks: invalid int value: 'x'", None),
    (["demo", "--bogus"], "unrecognized arguments: --bogus", None),
])
def test_json_with_bad_input_exits_2_with_one_json_error_object(args, words, key):
    res = run_cli(["validate", *args, "--json"], ranks=2)
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("dlio-mpi: error:")]
    assert len(errors) == 1 and words in errors[0], res.stderr
    record = json.loads(res.stdout)  # one object, printed once (json.loads refuses two)
    assert record == {"error": errors[0][len("dlio-mpi: error: "):], "key": key, "status": 2}


def _too_big(tmp_path) -> list[str]:
    """A dataset of 4 files of 1 TiB: more than the test machine's free space."""
    return workload_overrides(tmp_path, dataset__num_files_train=4,
                              dataset__record_length_bytes=TIB, reader__batch_size=1,
                              reader__keep_data="false")


def test_validate_warns_when_the_storage_cannot_hold_the_dataset(tmp_path):
    import shutil

    assert shutil.disk_usage(tmp_path).free < 4 * TIB
    plan = json.loads(_validate(["demo", *_too_big(tmp_path), "--ranks", "2"], json_out=True))
    assert plan["dataset_bytes"] > 4 * TIB
    [warning] = plan["warnings"]
    assert warning.startswith("run would refuse: dataset.data_folder: the dataset takes")
    text = _validate(["demo", *_too_big(tmp_path), "--ranks", "2"], json_out=False)
    assert _free_masked([f"warning         {warning}"])[0] in _free_masked(text.splitlines())
    _check_equal(plan, text)
    assert not any(tmp_path.iterdir())
    # data already there (generate_data off): nothing to warn about
    plan = json.loads(_validate(["demo", *_too_big(tmp_path), "workflow.generate_data=false"],
                                json_out=True))
    assert plan["warnings"] == [] and plan["generation"] is None


@pytest.mark.parametrize("command", ["run", "generate"])
def test_run_refuses_a_dataset_the_storage_cannot_hold_before_any_io(tmp_path, command):
    res = run_cli([command, "demo", *_too_big(tmp_path)])
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert res.stderr.count("dataset.data_folder: the dataset takes") == 1, res.stderr
    assert re.search(r"has [\d,.]+ GiB \([\d,]+ bytes\) free", res.stderr)
    assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())  # no output, no data folder


@pytest.mark.parametrize(("workload", "ranks"), [("llama_7b", 8), ("llama_70b", 64),
                                                 ("llama_405b", 512)])
def test_the_checkpoint_sizing_is_in_the_json_and_the_text_plan(workload, ranks):
    from dlio_mpi.checkpoint.sizing import checkpoint_layout
    from dlio_mpi.config import load_config

    plan = json.loads(_validate([workload, "--ranks", str(ranks)], json_out=True))
    layout = checkpoint_layout(load_config(workload, []), ranks)
    assert plan["checkpoint"]["total_bytes"] == layout.total_bytes > 0
    assert plan["checkpoint"]["bytes_per_rank"] == list(layout.bytes_per_rank)
    assert plan["checkpoint"]["files_per_rank"] == list(layout.files_per_rank)
    text = _validate([workload, "--ranks", str(ranks)], json_out=False)
    line = [x for x in text.splitlines() if x.startswith("checkpoint ")]
    assert len(line) == 1 and line[0].split()[1] == _size(layout.total_bytes).split()[0], line


def test_without_checkpointing_the_json_has_no_checkpoint():
    plan = json.loads(_validate(["demo", "--ranks", "2"], json_out=True))
    assert plan["checkpoint"] is None


def test_impossible_parallelism_is_refused_by_validate_and_run_before_any_io(tmp_path):
    res = run_cli(["validate", "llama_70b", "--ranks", "6", "--json"], ranks=1)
    assert res.returncode == 2 and json.loads(res.stdout)["status"] == 2
    assert "tensor × pipeline = 8 × 4 = 32 must divide the rank count" in res.stderr
    run = run_cli(["run", "llama_70b", f"checkpoint.checkpoint_folder={tmp_path / 'ck'}",
                   f"output.folder={tmp_path / 'out'}"], ranks=3)
    assert run.returncode == 2, run.stderr
    assert "must divide the rank count" in run.stderr
    assert list(tmp_path.iterdir()) == []  # nothing created
