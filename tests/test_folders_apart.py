"""Every folder key checked against every other, by real path, in one place (plan/folders.py;
issue 30): the same folder, one inside the other, or the same through a symlink is refused
before any I/O with one message naming both keys, in validate and in run; a job never
reports itself as "another job"; the data folder counts in a checkpoint-only run."""

from __future__ import annotations

import itertools
import os

import pytest

from dlio_mpi.config import load_config
from dlio_mpi.errors import UserError
from helpers import run_cli, workload_overrides

# key -> the override that sets its folder (the data folder through dataset.data_folder)
SETS = {"dataset.data_folder": "dataset.data_folder={}",
        "output.folder": "output.folder={}",
        "checkpoint.checkpoint_folder": "checkpoint.checkpoint_folder={}",
        "checkpoint.drain.to": "checkpoint.drain={{to: {}}}",
        "storage.stage_in.to": "storage.stage_in={{to: {}}}",
        "reader.cache.folder": "reader.cache={{folder: {}}}"}


def _apart(tmp_path) -> dict[str, str]:
    """Every folder key set, each to a folder of its own."""
    return {key: SETS[key].format(tmp_path / key.replace(".", "_")) for key in SETS}


def _refusal(overrides: list[str]) -> str | None:
    from dlio_mpi.plan.derive import derive_plan

    try:
        derive_plan(load_config("demo", ["workflow.checkpoint=true", *overrides]), 2)
    except UserError as exc:
        return str(exc)
    return None


def test_folders_apart_are_accepted(tmp_path):
    assert _refusal(list(_apart(tmp_path).values())) is None


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(SETS, 2)))
def test_every_pair_that_meets_is_refused_naming_both(tmp_path, a, b):
    shared = tmp_path / "shared"
    link = tmp_path / "link"
    shared.mkdir()
    link.symlink_to(shared)
    for folder_a, folder_b, how in ((shared, shared, "the same folder as"),
                                    (shared, link, "the same folder as"),  # by real path
                                    (shared, shared / "in", "inside"),
                                    (shared / "in", link, "a folder holding")):
        given = _apart(tmp_path)
        given[a], given[b] = SETS[a].format(folder_a), SETS[b].format(folder_b)
        said = _refusal(list(given.values()))
        assert said is not None, (a, b, how)
        assert said.startswith(f"{b}: {folder_b} is {how} {a} {folder_a}"), said
        assert "\n" not in said


def test_the_data_folder_counts_in_a_checkpoint_only_run(tmp_path):
    said = _refusal(["workflow.train=false", f"dataset.data_folder={tmp_path / 'data'}",
                     f"checkpoint.drain={{to: {tmp_path / 'data' / 'train'}}}"])
    assert said is not None and said.startswith("checkpoint.drain.to: ") \
        and "inside dataset.data_folder" in said


@pytest.mark.parametrize("drain_to", ["link", "out", "out/pfs", "data/train"])
def test_run_refuses_a_drain_into_another_folder_of_its_own_before_any_io(tmp_path, drain_to):
    """Through a symlink to the checkpoint folder, output.folder, inside it, the dataset: one
    message, exit 2, nothing written, no lock left, never "another job"."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "ck")
    over = workload_overrides(tmp_path, workflow__generate_data="false",
                              workflow__checkpoint="true",
                              checkpoint__checkpoint_folder=tmp_path / "ck",
                              checkpoint__drain=f"{{to: {tmp_path / drain_to}}}")
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("dlio-mpi: error: checkpoint.drain.to: ")
    assert "another dlio-mpi job" not in res.stderr
    assert sorted(os.listdir(tmp_path / "ck")) == []  # no lock, no manifest
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()
    # validate says the same
    res = run_cli(["validate", "demo", *over], ranks=1)
    assert res.returncode == 2 and "checkpoint.drain.to: " in res.stderr
