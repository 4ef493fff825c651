"""storage.lustre applies to the checkpoint folder as to the data folder: `lfs setstripe` on it
before any checkpoint file is created, the layout read back into summary.json; with
`required: true`, a checkpoint folder off Lustre is refused before any I/O. Lustre is faked as
in test_striping_study.py (a recording lfs on PATH, a mountinfo naming a folder a Lustre
mount, pointed at by a sitecustomize module in the ranks)."""

from __future__ import annotations

import json
import os
import sys

from test_filesystems import FakeLustre
from test_striping_study import LAYOUT, SITECUSTOMIZE

from conftest import mpiexec
from helpers import run_in_session


def _run(tmp_path, lustre: FakeLustre, folder, *overrides: str):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "FAKE_MOUNTINFO": str(lustre.mountinfo),
           "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [
               os.environ.get("PYTHONPATH")])])}
    return run_in_session([
        mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", "run", "llama_7b",
        "model.type=null", "model.num_layers=-1", "model.model_size_bytes=1048576",
        f"checkpoint.checkpoint_folder={folder}", f"output.folder={tmp_path / 'out'}",
        "checkpoint.num_checkpoints_write=1", "checkpoint.num_checkpoints_read=1",
        "checkpoint.time_between_checkpoints=0", *overrides], env=env)


def test_the_checkpoint_folder_is_striped_before_any_checkpoint_file(tmp_path, monkeypatch):
    lustre = FakeLustre(tmp_path, monkeypatch)
    lustre.getstripe_prints(LAYOUT)
    folder = lustre.mount / "ckpt"
    done = _run(tmp_path, lustre, folder, "storage.lustre.stripe_count=2",
                "storage.lustre.stripe_size=1M", "storage.lustre.required=true")
    assert done.returncode == 0, done.stdout + done.stderr
    calls = lustre.calls()  # the plan's description of each folder runs getstripe too
    setstripe = calls.index(["setstripe", "-c", "2", "-S", "1048576", str(folder)])
    assert calls[setstripe + 1] == ["getstripe", "-d", str(folder)]
    assert sum(c[0] == "setstripe" for c in calls) == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    striping = summary["dlio_mpi"]["checkpoint"]["striping"]
    assert striping["status"] == "applied" and striping["layout"]["stripe_count"] == 2
    assert "mismatch" not in striping
    assert sorted(os.listdir(folder / "global_epoch1_step1")) == ["model_states-0.pt",
                                                                   "model_states-1.pt"]


def test_a_required_layout_off_lustre_is_refused_before_any_io(tmp_path, monkeypatch):
    lustre = FakeLustre(tmp_path, monkeypatch)
    folder = tmp_path / "not lustre" / "ckpt"
    done = _run(tmp_path, lustre, folder, "storage.lustre.stripe_count=2",
                "storage.lustre.required=true")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "storage.lustre.required is true, but" in done.stderr
    assert "not Lustre" in done.stderr and str(folder) in done.stderr
    assert not (tmp_path / "not lustre").exists() and lustre.calls() == []
