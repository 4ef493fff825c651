"""The commands the README and docs/ show, run as a new user types them: every command of every
```bash block, from the checkout's root, one shell per page (so `source scripts/_env.sh` and
variables carry on to the page's next commands). A command that cannot run on one machine
in a test's time is run scaled down (SCALED) or not at all (NOT_RUN), each with its reason;
```sh blocks are cluster recipes and are not run. Both tables must match the pages, so the
front door cannot rot without this test failing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

# a block holding this text -> why none of its commands is run here
BLOCKS_NOT_RUN = {
    "$HOME/darshan/lib/libdarshan.so": "needs Darshan built from source (the sh block above it)",
}
# command as written (its start) -> the same command scaled down to a test's time
SCALED = {
    "python scripts/small_files_study.py --work ./small-files --files 4096":
        "python scripts/small_files_study.py --work ./small-files --files 256 "
        "--sample-bytes 16384 --epochs 2",
    "python scripts/bench/stop_latency.py --work ./bench-data/stop":
        "python scripts/bench/stop_latency.py --work ./bench-data/stop --rounds 1 compute "
        "snapshot",
    "python scripts/bench/results_writing.py --work ./bench-data/results-writing":
        "python scripts/bench/results_writing.py --work ./bench-data/results-writing "
        "--epochs 500 --repeat 1 --turns 1 --after 3 --cases train write stop",
    "python scripts/bench/checkpoint_bytes.py --work ./bench-data":
        "python scripts/bench/checkpoint_bytes.py --work ./bench-data --gib 0.25 --rounds 1",
    "python scripts/bench/tensor_ratios.py": "python scripts/bench/tensor_ratios.py --quick",
    "python scripts/fidelity/compare.py scripts/fidelity/workloads/jpeg_vm.yaml":
        "python scripts/fidelity/compare.py scripts/fidelity/workloads/jpeg_vm.yaml "
        "--work output/fidelity/compare --workers 1 --ranks 1 --repeat 1 --baseline",
}
# command as written (its start) -> why it is not run here
NOT_RUN = {
    "scripts/test.sh": "the test suite this test is part of",
    "apt-get install -y fio": "a system package, installed as root",
    "python scripts/bench/bench.py --work ./bench-data overhead hosts":
        "the whole benchmark set takes over an hour; each benchmark is run by hand",
    "python scripts/bench/bench.py --work ./bench-data fidelity":
        "the fidelity benchmark takes about 20 minutes",
    "PYTHONPATH=scripts/fidelity python scripts/fidelity/compare.py":
        "a second compare run (a user's Dataset), minutes long; the calibration with that "
        "Dataset runs in docs/fidelity.md's first block",
}


def _logical_lines(block: str) -> list[str]:
    """The commands of a bash block: continuation lines and here-documents joined, comment
    lines left out."""
    commands, current, heredoc = [], "", None
    for line in block.splitlines():
        if heredoc is None and not current and (
                not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line + "\n"
        if heredoc is None:
            m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
            heredoc = m.group(1) if m else None
        elif line.strip() == heredoc:
            heredoc = None
        if heredoc is None and not line.rstrip().endswith("\\"):
            commands.append(current.rstrip("\n"))
            current = ""
    return commands


def _normal(command: str) -> str:
    """One line, spaces collapsed, a trailing comment dropped: the form the tables use."""
    text = " ".join(command.replace("\\\n", " ").split())
    for m in re.finditer(r" #", text):
        before = text[:m.start()]
        if before.count("'") % 2 == 0 and before.count('"') % 2 == 0:
            return before.rstrip()
    return text


def page_blocks(page: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(), re.S)


def page_commands(page: str, runnable: bool = False) -> list[str]:
    """The commands of a page's bash blocks (with `runnable`, of those this machine runs)."""
    return [c for block in page_blocks(page)
            if not (runnable and any(key in block for key in BLOCKS_NOT_RUN))
            for c in _logical_lines(block)]


def _match(table: dict, command: str) -> str | None:
    keys = [k for k in table if _normal(command).startswith(k)]
    assert len(keys) <= 1, f"{command!r} matches {keys}"
    return keys[0] if keys else None


def test_every_table_entry_is_a_command_on_a_page():
    shown = [_normal(c) for page in PAGES for c in page_commands(page)]
    for table in (SCALED, NOT_RUN):
        for key in table:
            assert any(c.startswith(key) for c in shown), f"no page shows {key!r} any more"
    blocks = [b for page in PAGES for b in page_blocks(page)]
    for key in BLOCKS_NOT_RUN:
        assert any(key in b for b in blocks), f"no page shows {key!r} any more"


def test_the_pages_have_commands_and_cluster_recipes_apart():
    assert len(page_commands("README.md")) >= 10
    # the cluster-only commands (srun, sbatch, module) sit in ```sh blocks, never run here
    for page in PAGES:
        for command in page_commands(page):
            assert not re.match(r"(srun|sbatch|module) ", _normal(command)), (page, command)


def _script(page: str) -> tuple[str, list[str]]:
    lines, skipped = ["set -euo pipefail", f"cd {ROOT}"], []
    for command in page_commands(page, runnable=True):
        if _match(NOT_RUN, command):
            skipped.append(command)
            continue
        key = _match(SCALED, command)
        lines.append(SCALED[key] if key else command)
    return "\n".join(lines) + "\n", skipped


def _check_readme(out: str, _since: float) -> None:
    for folder in ("demo", "demo-3", "demo-1", "llama_8b", "llama_8b_bb", "demo-packed"):
        summary = json.loads((ROOT / "output" / folder / "summary.json").read_text())
        assert summary["dlio_mpi"]["complete"], folder
    ckpt = json.loads((ROOT / "output/llama_8b/summary.json").read_text())["dlio_mpi"]
    records = ckpt["checkpoint"]["records"]
    assert [r["kind"] for r in records] == ["save", "load"]
    assert records[0]["bytes"] == records[1]["bytes"] > 200 * 2**20  # 2 of 1,024 ranks' shares
    bb = json.loads((ROOT / "output/llama_8b_bb/summary.json").read_text())["dlio_mpi"]
    kinds = [(r["kind"], r["checkpoint_id"]) for r in bb["checkpoint"]["records"]]
    ids = ["global_epoch1_step1", "global_epoch1_step2"]
    assert sorted(kinds) == sorted([("save", ids[0]), ("save", ids[1]), ("drain", ids[0]),
                                    ("drain", ids[1]), ("load", ids[0])])
    assert all("async" in r for r in bb["checkpoint"]["records"] if r["kind"] == "save")
    assert sorted(os.listdir(ROOT / "checkpoints/bb")) == [  # keep: last
        "dlio_mpi_checkpoints.json", "global_epoch1_step2"]
    assert "format: indexed_binary" in (ROOT / "output/demo-packed/config.yaml").read_text()
    assert re.search(r"^[1-9][0-9]{9,}$", out, re.M)  # validate --json | jq: bytes per epoch
    assert (ROOT / "output/compare/compare.csv").read_text().count("\n") == 3  # header, 2 runs


def _summary(folder: str) -> dict:
    return json.loads((ROOT / folder / "summary.json").read_text())


def _new(pattern: str, since: float) -> list[Path]:
    return [p for p in ROOT.glob(pattern) if p.stat().st_mtime >= since]


def _check_clusters(_out: str, since: float) -> None:
    readers = _summary("output/demo")["dlio_mpi"]["readers"]["train"]
    assert "Open MPI" in readers["mpi_library"], readers  # the Open MPI recipe ran on it
    assert len(_new("dft/trace-*.pfw", since)) == 2  # DFTracer: one trace per rank
    assert _summary("out")["dlio_mpi"]["complete"]
    assert "MAX_RECORDS" in (ROOT / "output/darshan/darshan.conf").read_text()


def _check_fidelity(_out: str, since: float) -> None:
    for name in ("calibrated", "mine"):
        assert "preprocess_cpu_time" in (ROOT / f"data/fidelity/{name}.yaml").read_text()
    assert _summary("output/fidelity/jpeg")["dlio_mpi"]["complete"]
    assert _new("output/fidelity/compare/fidelity.csv", since)  # compare.py's table


def _check_results(_out: str, since: float) -> None:
    assert _new("output/demo/report/report.html", since)
    assert _new("output/compare/compare.csv", since)


def _check_studies(_out: str, since: float) -> None:
    assert _new("striping-results/study.csv", since)
    rows = (ROOT / "small-files/small_files_study.csv").read_text().splitlines()
    assert len(rows) == 5 and _new("small-files/small_files_study.png", since)


CHECKS = {"README.md": _check_readme, "docs/clusters.md": _check_clusters,
          "docs/fidelity.md": _check_fidelity, "docs/results.md": _check_results,
          "docs/studies.md": _check_studies}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES)
def test_the_commands_of_each_page_run_as_written(page):
    script, _skipped = _script(page)
    if script.count("\n") <= 2:
        pytest.skip(f"{page} shows no command to run on one machine")
    if "| jq" in script and shutil.which("jq") is None:
        pytest.fail("jq is not installed (apt-get install jq): the README's pipeline needs it")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "OMPI_", "PMI"))}
    since = time.time() - 1
    res = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=850)
    assert res.returncode == 0, f"{page}:\n{script}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    if page in CHECKS:
        CHECKS[page](res.stdout, since)
