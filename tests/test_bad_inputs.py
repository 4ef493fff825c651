"""Bad input, as a user types it: `mpiexec -n 2 dlio-mpi validate|run|generate ...` with a broken
workload file or override. Each must end with exit status 2 and exactly one line
"dlio-mpi: error: ..." naming the offending key or file, no traceback, no abort, in seconds.

The cases run as real MPI jobs, a few at a time (a thread pool), once for the whole table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import mpiexec

DLIO_MPI = str(Path(sys.executable).parent / "dlio-mpi")
MAX_SECONDS = 3.0
WORKERS = 2


@dataclass(frozen=True)
class Case:
    """`dlio-mpi COMMAND ARGS` run in a fresh folder holding `files`; the error must name
    `names` ("{tmp}" stands for that folder in args, files and names)."""

    id: str
    args: tuple[str, ...]
    names: tuple[str, ...]
    files: dict = field(default_factory=dict)
    command: str = "validate"


def case(id: str, args: str | tuple, names: str | tuple, files: dict | None = None,
         command: str = "validate") -> Case:
    args = tuple(args.split(" ")) if isinstance(args, str) else args
    names = (names,) if isinstance(names, str) else names
    return Case(id, args, names, files or {}, command)


ELF = b"\x7fELF\x02\x01\x01\x00" + bytes(range(0x80, 0x100))
SMALL = ("dataset.num_files_train=8", "dataset.record_length_bytes=4096",
         "dataset.record_length_bytes_stdev=0", "train.computation_time=0")

CASES = [
    # ---------------------------------------------------------------- the workload file
    case("binary-file", "{tmp}/prog", "{tmp}/prog", {"prog": ELF}),
    case("latin1-file", "{tmp}/w.yaml", "w.yaml", {"w.yaml": "model:\n  name: caf\xe9\n"
                                                   .encode("latin-1")}),
    case("directory", "{tmp}/adir/", "adir", {"adir/x": ""}),
    case("device", "/dev/null", "/dev/null"),
    case("missing-file", "{tmp}/nope.yaml", "nope.yaml"),
    case("unknown-workload", "unet3d_h10", "unet3d_h10"),
    case("empty-file", "{tmp}/w.yaml", "w.yaml", {"w.yaml": ""}),
    case("comments-only", "{tmp}/w.yaml", "w.yaml", {"w.yaml": "# nothing here\n"}),
    case("empty-workload", "{tmp}/w.yaml", "w.yaml", {"w.yaml": "workload:\n"}),
    case("syntax-error", "{tmp}/w.yaml", "w.yaml",
         {"w.yaml": "dataset:\n  format: npz\n bad: : x\n"}),
    case("tab-indent", "{tmp}/w.yaml", "w.yaml", {"w.yaml": "dataset:\n\tformat: npz\n"}),
    case("unclosed-quote", "{tmp}/w.yaml", "w.yaml", {"w.yaml": "model:\n  name: 'abc\n"}),
    case("duplicate-section", "{tmp}/w.yaml", ("'dataset'", "lines 1 and 3"),
         {"w.yaml": "dataset:\n  format: npz\ndataset:\n  format: npy\n"}),
    case("duplicate-key", "{tmp}/w.yaml", ("'dataset.format'", "lines 2 and 3"),
         {"w.yaml": "dataset:\n  format: npz\n  format: npy\n"}),
    case("duplicate-nested-workload", "{tmp}/w.yaml", "'workload.reader.batch_size'",
         {"w.yaml": "workload:\n  reader:\n    batch_size: 2\n    batch_size: 4\n"}),
    case("top-level-list", "{tmp}/w.yaml", "w.yaml", {"w.yaml": "- dataset\n- reader\n"}),
    case("top-level-scalar", "{tmp}/w.yaml", "w.yaml", {"w.yaml": "hello\n"}),
    case("section-as-list", "{tmp}/w.yaml", "dataset", {"w.yaml": "dataset: [1, 2]\n"}),
    case("section-as-number", "{tmp}/w.yaml", "reader", {"w.yaml": "reader: 5\n"}),
    case("workload-and-top-level", "{tmp}/w.yaml", "w.yaml",
         {"w.yaml": "workload:\n  train: {epochs: 1}\ndataset: {format: npz}\n"}),
    case("unhashable-key", "{tmp}/w.yaml", "w.yaml", {"w.yaml": "? [a, b]\n: 1\n"}),
    case("nul-in-path", "{tmp}/w.yaml", "dataset.data_folder",
         {"w.yaml": 'dataset:\n  data_folder: "data\\0x"\n'}),
    case("nul-in-name", "{tmp}/w.yaml", "model.name", {"w.yaml": 'model:\n  name: "a\\0"\n'}),
    case("huge-file", "{tmp}/w.yaml", "w.yaml", {"w.yaml": b"#" * (17 << 20)}),
    case("number-key", "{tmp}/w.yaml", "dataset.1", {"w.yaml": "dataset:\n  1: 2\n"}),
    # ---------------------------------------------------------------- the command line
    case("dashed-override", "demo --reader.batch_size=4", "--reader.batch_size=4"),
    case("bad-ranks", "demo --ranks x", "--ranks"),
    case("zero-ranks", "demo --ranks 0", "--ranks 0"),
    case("ranks-on-run", "demo --ranks 4", "--ranks", command="run"),
    case("repeated-override", "demo reader.batch_size=2 reader.batch_size=4",
         ("reader.batch_size=2", "reader.batch_size=4")),
    case("repeated-spellings", "demo ++workload.train.epochs=2 train.epochs=3",
         ("++workload.train.epochs=2", "train.epochs=3")),
    case("repeated-alias", "demo dataset.record_length=10 dataset.record_length_bytes=20",
         ("dataset.record_length=10", "dataset.record_length_bytes=20")),
    case("override-without-value", "demo train.epochs", "train.epochs"),
    case("override-into-number", "demo train.epochs.x=1", "train.epochs"),
    case("override-bad-yaml", "demo dataset.record_dims=[1,2", "dataset.record_dims"),
    case("unknown-key", "demo dataset.num_file_train=3", "dataset.num_files_train"),
    case("unknown-section", "demo datset.format=npz", "datset"),
    # ---------------------------------------------------------------- types and ranges
    case("string-for-int", "demo dataset.num_files_train=abc", "dataset.num_files_train"),
    case("fraction-for-int", "demo reader.batch_size=2.5", "reader.batch_size"),
    case("int-for-bool", "demo workflow.train=1", "workflow.train"),
    case("scalar-for-list", "demo dataset.record_dims=7", "dataset.record_dims"),
    case("list-for-string", "demo dataset.file_prefix=[img]", "dataset.file_prefix"),
    case("mapping-for-string", ("demo", "model.name={a: 1}"), "model.name"),
    case("bad-choice", "demo dataset.format=npzz", "dataset.format"),
    case("bad-framework", "demo framework=jax", "framework"),
    case("bad-dtype", "demo dataset.record_element_type=float33", "dataset.record_element_type"),
    case("negative-size", "demo dataset.record_length_bytes=-5", "dataset.record_length_bytes"),
    case("zero-size", "demo dataset.record_length_bytes=0", "dataset.record_length_bytes"),
    case("infinite-size", "demo dataset.record_length_bytes=1e400",
         "dataset.record_length_bytes"),
    case("nan-size", "demo dataset.record_length_bytes=.nan", "dataset.record_length_bytes"),
    case("huge-size", "demo dataset.record_length_bytes=1e30", "dataset.record_length_bytes"),
    case("zero-dim", "demo dataset.record_dims=[3,0] dataset.record_length_bytes_stdev=0",
         "dataset.record_dims[1]"),
    case("too-many-dims", "demo dataset.record_length_bytes_stdev=0 "
         "dataset.record_dims=[1,1,1,1,1,1,1,1,1,1,1,1,1]", "dataset.record_dims"),
    case("overflowing-dims", "demo dataset.record_length_bytes_stdev=0 "
         "dataset.record_dims=[1e7,1e7,1e7]", "dataset.record_dims"),
    case("dims-past-memory", "demo dataset.record_length_bytes_stdev=0 "
         "dataset.record_dims=[1e5,1e5,1e5]", "dataset.record_dims"),
    case("stdev-past-memory", "demo dataset.record_length_bytes_stdev=1e18",
         "dataset.record_length_bytes"),
    case("files-1e18", "demo dataset.num_files_train=1e18", "dataset.num_files_train"),
    case("files-past-int64", "demo dataset.num_files_eval=99999999999999999999999",
         "dataset.num_files_eval"),
    case("no-files", "demo dataset.num_files_train=0", "dataset.num_files_train"),
    case("samples-1e18", "demo dataset.num_samples_per_file=1e18",
         "dataset.num_samples_per_file"),
    case("prefetch-1e10", "demo reader.prefetch_size=1e10", "reader.prefetch_size"),
    case("prefetch-past-memory", "demo reader.prefetch_size=1000000", "reader.prefetch_size"),
    case("fd-cache-1e10", "demo reader.fd_cache_size=1e10", "reader.fd_cache_size"),
    case("read-threads", "demo reader.read_threads=5000", "reader.read_threads"),
    case("batch-1e18", "demo reader.batch_size=1e18", "reader.batch_size"),
    case("negative-seed", "demo train.seed=-1", "train.seed"),
    case("huge-seed", "demo train.seed=1e30", "train.seed"),
    case("steps-past-int64", "demo train.total_training_steps=1e30",
         "train.total_training_steps"),
    case("steps-past-epoch", "demo train.total_training_steps=1000",
         "train.total_training_steps"),
    case("au-above-1", "demo metric.au=1.5", "metric.au"),
    case("all-steps-excluded", "demo output.metric.exclude_start_steps=100",
         "output.metric.exclude_start_steps"),
    case("compute-1e300", "demo train.computation_time=1e300", "train.computation_time"),
    case("compute-negative", "demo train.computation_time=-1", "train.computation_time"),
    case("compute-unknown-type", ("demo", "train.computation_time={type: lognormal}"),
         "train.computation_time.type"),
    case("eval-huge-int", "demo evaluation.eval_time=" + "9" * 400, "evaluation.eval_time"),
    # ---------------------------------------------------------------- paths
    case("prefix-parent", "demo dataset.file_prefix=../x", "dataset.file_prefix"),
    case("prefix-dotdot", "demo dataset.file_prefix=..", "dataset.file_prefix"),
    case("prefix-empty", ("demo", "dataset.file_prefix=''"), "dataset.file_prefix"),
    case("prefix-slash", "demo dataset.file_prefix=a/b", "dataset.file_prefix"),
    case("data-folder-null", "demo dataset.data_folder=", "dataset.data_folder"),
    case("path-too-long", "demo dataset.data_folder=/tmp/" + "d" * 4200,
         "dataset.data_folder"),
    case("output-is-a-file", ("demo", *SMALL, "dataset.data_folder={tmp}/data",
                              "output.folder={tmp}/afile"), "output.folder",
         {"afile": ""}, command="run"),
    # ---------------------------------------------------------------- not implemented yet
    case("storage-s3", "demo storage.storage_type=s3", "storage.storage_type"),
    case("storage-aistore", "demo storage.storage_type=aistore", "storage.storage_type"),
    case("loader-dali", "demo reader.data_loader=dali", "reader.data_loader"),
    case("loader-native-dali", "demo reader.data_loader=native_dali", "reader.data_loader"),
    case("loader-custom", "demo reader.data_loader=custom", "reader.data_loader"),
    case("loader-synthetic", "demo reader.data_loader=synthetic", "reader.data_loader"),
    case("loader-none", "demo reader.data_loader=none", "reader.data_loader"),
    case("loader-framework-mismatch", "demo reader.data_loader=tensorflow",
         "reader.data_loader"),
    case("loader-class", "demo reader.data_loader_classname=my.Loader",
         "reader.data_loader_classname"),
    case("reader-class", "demo reader.reader_classname=my.Reader", "reader.reader_classname"),
    case("compression", "demo dataset.compression=xz", "dataset.compression"),
    case("compression-hdf5-mpiio-run", ("demo", *SMALL, "dataset.format=hdf5",
                                        "dataset.compression=gzip", "reader.file_access=shared",
                                        "dataset.data_folder={tmp}/data",
                                        "output.folder={tmp}/out"), "reader.file_access",
         command="run"),
    case("hdf5-chunk-dims", ("demo", *SMALL, "dataset.format=hdf5",
                             "dataset.hdf5.chunk_dims=[1,2]"), "dataset.hdf5.chunk_dims"),
    case("hdf5-datasets-without-dims", ("demo", *SMALL, "dataset.format=hdf5",
                                        "dataset.hdf5.num_dset_per_record=2"),
         "dataset.hdf5.num_dset_per_record"),
    case("format-csv-compression", "demo dataset.format=csv dataset.compression=gzip",
         ("dataset.compression", "dataset.format csv")),
    case("compression-parquet-codec-npz", "demo dataset.compression=zstd",
         ("dataset.compression", "'zstd' is not accepted", "dataset.format parquet only")),
    case("compression-parquet-codec-hdf5", "demo dataset.format=hdf5 dataset.compression=snappy",
         ("dataset.compression", "'snappy' is not accepted")),
    case("compression-lzf-parquet", "demo dataset.format=parquet dataset.compression=lzf",
         ("dataset.compression", "for parquet", "accepted: none, snappy, gzip, lz4, zstd")),
    case("format-png-samples-generate", ("demo", *SMALL, "dataset.format=png",
                                         "dataset.num_samples_per_file=2",
                                         "dataset.data_folder={tmp}/data"),
         "dataset.num_samples_per_file", command="generate"),
    case("s3-on-run", ("demo", *SMALL, "storage.storage_type=s3",
                       "dataset.data_folder={tmp}/data", "output.folder={tmp}/out"),
         "storage.storage_type", command="run"),
]


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{tmp}", str(tmp))


def _run(c: Case, tmp: Path) -> tuple[subprocess.CompletedProcess, float]:
    for name, content in c.files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    env = {k: v for k, v in os.environ.items() if k != "DLIO_MPI_DEBUG"}
    cmd = [mpiexec(), "-n", "2", DLIO_MPI, c.command, *(_fill(a, tmp) for a in c.args)]
    start = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp, env=env)
    return res, time.monotonic() - start


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict:
    """Every selected case, run a few at a time: id -> (result, seconds, its folder)."""
    wanted = {item.callspec.id for item in request.session.items
              if item.originalname == "test_bad_input_is_one_clear_error"}
    chosen = [c for c in CASES if c.id in wanted]
    folders = {c.id: tmp_path_factory.mktemp(c.id) for c in chosen}
    with ThreadPoolExecutor(WORKERS) as pool:
        done = pool.map(lambda c: _run(c, folders[c.id]), chosen)
        return {c.id: (*result, folders[c.id]) for c, result in zip(chosen, done)}


def test_the_table_is_large_and_distinct():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({(c.command, c.args, tuple(c.files.items())) for c in CASES}) == len(CASES)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_error(c: Case, outcomes):
    res, seconds, tmp = outcomes[c.id]
    output = res.stdout + res.stderr
    shown = f"$ dlio-mpi {c.command} {' '.join(c.args)}\nrc={res.returncode}\n{output}"
    errors = [line for line in output.splitlines() if line.startswith("dlio-mpi: error")]
    assert res.returncode == 2, shown
    assert len(errors) == 1, shown
    for name in c.names:
        assert _fill(name, tmp) in errors[0], shown
    assert "Traceback" not in output and not re.search(r"rank \d+: error", output), shown
    assert seconds < MAX_SECONDS, f"{seconds:.1f} s\n{shown}"
    assert not (tmp / "data").exists(), "storage was touched before the input was refused"
