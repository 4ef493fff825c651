"""dlio-mpi calibrate (issue 19): the real torch DataLoader pipeline measured on a tiny
dataset, with the built-in Datasets (imagenet for jpeg, none for npz) and a user's own
MODULE:CALLABLE (imported from the current directory), a model's training step timed on the
CPU; the written workload loads, says what was measured and runs under mpiexec with each
modelled cost in its time split. Bad input: one message, exit status 2, nothing written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import run_cli, workload_overrides

pytestmark = pytest.mark.timeout(300)
pytest.importorskip("torch")  # dlio-mpi calibrate runs the real torch DataLoader

FILES = 32
USER_MODULE = textwrap.dedent("""
    import numpy as np
    import torch
    from torch.utils.data import Dataset


    class Bytes(Dataset):
        def __init__(self, files):
            self.files = files

        def __len__(self):
            return len(self.files)

        def __getitem__(self, i):
            with open(self.files[i], "rb") as fp:
                data = fp.read()
            x = np.frombuffer(data, dtype=np.uint8)[:256].astype(np.float32)
            for _ in range(200):  # some CPU work a sample
                x = np.sqrt(x * x + 1.0)
            return torch.from_numpy(x), i % 10


    def make(files):
        return Bytes(files)


    def broken(files):
        raise RuntimeError("no such dataset")


    def wrong_length(files):
        return Bytes(files[:1])


    class FailsLater(Bytes):
        def __getitem__(self, i):
            if i == 5:
                raise ValueError(f"cannot decode {self.files[i]}")
            return super().__getitem__(i)


    def fails_later(files):
        return FailsLater(files)


    def tiny():
        return torch.nn.Linear(256, 10)


    not_callable = 3
""")


def _overrides(tmp: Path, fmt: str = "jpeg") -> list[str]:
    size = 4096 if fmt == "jpeg" else 65536
    return workload_overrides(tmp, dataset__format=fmt, dataset__num_files_train=FILES,
                              dataset__num_samples_per_file=1, dataset__record_length_bytes=size,
                              reader__batch_size=4, reader__read_threads=1,
                              reader__prefetch_size=2, reader__data_loader="pytorch",
                              framework="pytorch", train__computation_time=0.002)


def _generated(tmp: Path, fmt: str = "jpeg") -> list[str]:
    overrides = _overrides(tmp, fmt)
    res = run_cli(["generate", "demo", *overrides], ranks=1)
    assert res.returncode == 0, res.stderr
    return overrides


def calibrate(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "dlio_mpi", "calibrate", *args],
                          capture_output=True, text=True, timeout=240, cwd=cwd)


def _reads(text: str) -> tuple[str, str]:
    """(the Dataset's reads per sample, dlio-mpi's model's), as the comments say them."""
    found = re.search(r"reads per sample: the Dataset ([0-9,]+ bytes in [0-9.]+ read calls, "
                      r"[0-9.]+ opens); dlio-mpi's loader model ([0-9,]+ bytes in [0-9.]+ read "
                      r"calls, [0-9.]+ opens)", text)
    assert found, text
    return found.group(1), found.group(2)


def test_the_imagenet_pipeline_calibrated_runs_with_each_cost_in_its_time_split(tmp_path):
    from dlio_mpi.config import load_config

    overrides = _generated(tmp_path)
    out = tmp_path / "calibrated.yaml"
    res = calibrate(["demo", *overrides, "--workers", "1", "--files", str(FILES),
                     "--out", str(out)])
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert text.startswith("# dlio-mpi calibrate:")
    assert "--transform imagenet over the first 32 jpeg training files" in text
    # the Dataset's reads are the ones dlio-mpi's model of Pillow's makes
    dataset, model = _reads(text)
    assert dataset == model and dataset.endswith("1.00 opens")
    cfg = load_config(str(out))
    rd = cfg.reader
    assert rd.read_threads == 1 and rd.engine == "native" and rd.preprocess_time.mean == 0
    assert rd.preprocess_cpu_time.mean > 0 and rd.step_cpu_time.mean > 0
    assert rd.startup_time > 0 and rd.step_wait_time.mean >= 0
    assert cfg.train.computation_time.mean == 0.002  # the workload's, as given
    folder = tmp_path / "emulated"
    res = run_cli(["run", str(out), "train.epochs=2", f"output.folder={folder}"], ranks=2)
    assert res.returncode == 0, res.stderr
    metric = json.loads((folder / "summary.json").read_text())["metric"]
    steps = FILES // 2 // 4 * 2  # per rank, both epochs
    assert metric["train_preprocess_cpu_seconds_per_rank"]["min"] == pytest.approx(
        FILES // 2 * 2 * rd.preprocess_cpu_time.mean, rel=0.5)  # drawn per sample
    assert metric["train_host_seconds_per_rank"]["min"] >= steps * rd.step_cpu_time.mean
    assert metric["train_loader_startup_seconds_per_rank"]["min"] == pytest.approx(
        rd.startup_time)


def test_a_users_dataset_and_model_are_calibrated_from_the_current_directory(tmp_path):
    from dlio_mpi.config import load_config

    overrides = _generated(tmp_path)
    (tmp_path / "mypipeline.py").write_text(USER_MODULE)
    out = tmp_path / "mine.yaml"
    res = calibrate(["demo", *overrides, "--workers", "2", "--dataset", "mypipeline:make",
                     "--model", "mypipeline:tiny", "--device", "cpu", "--out", str(out)],
                    cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "--dataset mypipeline:make" in text
    assert "training step of --model mypipeline:tiny on cpu" in text
    dataset, _ = _reads(text)
    sizes = [p.stat().st_size for p in sorted((tmp_path / "data" / "train").iterdir())]
    assert dataset.startswith(f"{sum(sizes) / len(sizes):,.0f} bytes")
    assert dataset.endswith("1.00 opens")  # open() seen by the audit hook
    cfg = load_config(str(out))
    assert cfg.reader.read_threads == 2
    step = re.search(r"on cpu: ([0-9.]+) ms", text).group(1)
    assert cfg.train.computation_time.mean == pytest.approx(float(step) / 1e3, abs=1e-5)


def test_npz_calibrates_with_the_formats_own_load(tmp_path):
    from dlio_mpi.config import load_config

    overrides = _generated(tmp_path, "npz")
    out = tmp_path / "npz.yaml"
    res = calibrate(["demo", *overrides, "--workers", "1", "--compute-time", "0.005",
                     "--out", str(out)])
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "--transform none" in text
    dataset, model = _reads(text)
    assert dataset == model  # np.load's reads, as dlio-mpi models them
    cfg = load_config(str(out))
    assert cfg.train.computation_time.mean == 0.005
    assert cfg.reader.preprocess_cpu_time.mean > 0
    # a second calibration replaces the first one's file (its own)
    res = calibrate(["demo", *overrides, "--workers", "1", "--out", str(out)])
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("args,message", [
    (["--dataset", "mypipeline:broken"], "--dataset mypipeline:broken: calling it with 32 "
                                         "file(s) failed: RuntimeError: no such dataset"),
    (["--dataset", "nowhere:make"], "--dataset nowhere:make: cannot import module nowhere"),
    (["--dataset", "mypipeline:missing"], "module mypipeline has no attribute missing"),
    (["--dataset", "mypipeline:not_callable"], "not_callable is a int, not a callable"),
    (["--dataset", "mypipeline:wrong_length"], "its Dataset has 1 items for 32 files"),
    (["--dataset", "mypipeline"], "expected MODULE:CALLABLE"),
    (["--dataset", "mypipeline:fails_later"], "the DataLoader over --dataset "
                                              "mypipeline:fails_later failed: ValueError"),
    (["--model", "mypipeline:tiny", "--device", "cuda"], "--device cuda: torch finds no CUDA "
                                                         "device on this host"),
    (["--device", "cuda"], "give --model MODULE:CALLABLE too"),
    (["--workers", "-1"], "--workers -1: expected 0 or more"),
    (["--files", "2"], "--files 2: 2 file(s) make no batch of reader.batch_size=4"),
    (["reader.file_access=shared"], "reader.preprocess_cpu_time: not implemented yet with "
                                    "reader.file_access shared"),
])
def test_bad_input_is_one_message_exit_2_and_nothing_written(tmp_path, args, message):
    if "torch finds no CUDA" in message:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this host has a CUDA device")
    overrides = _generated(tmp_path)
    (tmp_path / "mypipeline.py").write_text(USER_MODULE)
    out = tmp_path / "never.yaml"
    res = calibrate(["demo", *overrides, "--workers", "1", *args, "--out", str(out)],
                    cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlio-mpi calibrate: error: "), lines
    assert message in lines[0]
    assert not out.exists() and list(tmp_path.glob("never.yaml*")) == []


@pytest.mark.parametrize("name,content,message", [
    ("out.txt", None, "expected a .yaml file to write"),
    ("mine.yaml", "reader: {}\n", "a file dlio-mpi calibrate did not write is there"),
    ("nowhere/out.yaml", None, "does not exist"),
])
def test_an_out_file_of_the_users_is_never_replaced(tmp_path, name, content, message):
    out = tmp_path / name
    if content is not None:
        out.write_text(content)
    res = calibrate(["demo", *_overrides(tmp_path), "--workers", "1", "--out", str(out)])
    assert res.returncode == 2 and message in res.stderr, res.stderr
    if content is not None:
        assert out.read_text() == content


def test_without_torch_the_message_names_the_extra_to_install(tmp_path):
    code = ("import sys; sys.modules['torch'] = None; from dlio_mpi.cli import main; "
            f"sys.exit(main(['calibrate', 'demo', '--workers', '1', '--out', "
            f"'{tmp_path / 'x.yaml'}']))")
    res = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" \
        in res.stderr
