"""What the two framework loaders (reader.engine framework: the torch DataLoader and the
tf.data pipeline) share: their modules import no MPI, and the plan refuses what they cannot
read, in one message, before any I/O. Each loader's own behaviour is in test_torch_loader.py
and test_tf_loader.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_tf_loader import _overrides as tf_overrides

from dlio_mpi.config import load_config
from dlio_mpi.errors import UserError
from helpers import run_cli, workload_overrides

pytestmark = pytest.mark.timeout(300)

# a module, and the modules it must not import beside it (a spawned or forkserver torch worker
# imports torch_loader to unpickle the Dataset; the tf loader must not pull torch in either)
# (the code, and whether its output is that line alone: TensorFlow may print before it)
IMPORTS = {
    "pytorch": ("import sys, dlio_mpi.readers.torch_loader, torch.utils.data; "
                "print(sorted(m for m in sys.modules if m.startswith('mpi4py')))", True),
    "tensorflow": ("import sys, dlio_mpi.readers.tf_loader; "
                   "print(sorted(m for m in sys.modules if m.startswith('mpi4py') or "
                   "m == 'torch'))", False),
}


@pytest.mark.parametrize("loader", sorted(IMPORTS))
def test_the_loader_module_imports_no_mpi(loader):
    code, alone = IMPORTS[loader]
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert (out.stdout.strip() if alone else out.stdout.strip().splitlines()[-1]) == "[]"


TF = ["framework=tensorflow", "reader.data_loader=tensorflow", "dataset.format=tfrecord"]


@pytest.mark.parametrize("overrides,message", [
    (["reader.file_access=collective"],
     "reader.engine: framework reads through the loader's own file calls in each rank's "
     "worker processes, so reader.file_access must be multi (or posix), got collective"),
    (["reader.file_access=mpio"], "reader.file_access must be multi (or posix), got mpio"),
    (["framework=tensorflow", "reader.data_loader=tensorflow", "dataset.format=indexed_binary"],
     "reader.engine: framework with reader.data_loader tensorflow reads tfrecord, npy, npz, "
     "hdf5, jpeg, png, csv, parquet, got dataset.format indexed_binary"),
    (["framework=tensorflow", "reader.data_loader=tensorflow", "reader.file_access=shared"],
     "reader.file_access must be multi (or posix), got shared"),
    (["dataset.format=tfrecord"], "reader.engine: framework with reader.data_loader pytorch "
                                  "reads npy, npz, indexed_binary, hdf5, jpeg, png, csv, "
                                  "parquet, got dataset.format tfrecord"),
    (["reader.odirect=true"], "reader.odirect: true does not combine with reader.engine "
                              "framework"),
    (["reader.read_mode=sample"], "reader.read_mode: sample does not apply with reader.engine "
                                  "framework"),
    ([*TF, "reader.file_access=collective"],
     "reader.file_access must be multi (or posix), got collective"),
    ([*TF[:2], "dataset.format=indexed_binary"],
     "reader.engine: framework with reader.data_loader tensorflow reads tfrecord, npy, npz, "
     "hdf5, jpeg, png, csv, parquet, got dataset.format indexed_binary"),
    ([*TF, "reader.read_mode=sample"],
     "reader.read_mode: sample does not apply with reader.engine framework"),
])
def test_unsupported_combinations_are_refused_by_the_plan(overrides, message):
    from dlio_mpi.plan.derive import derive_plan

    cfg = load_config("demo", ["reader.engine=framework", *overrides])
    with pytest.raises(UserError) as info:
        derive_plan(cfg, 2)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def _torch_run(tmp_path) -> tuple[str, list[str]]:
    return "demo", workload_overrides(tmp_path, workflow__generate_data="true",
                                      reader__engine="framework")


def _tf_run(tmp_path) -> tuple[str, list[str]]:
    return "resnet50_h100", tf_overrides(tmp_path, workflow__generate_data="true")


@pytest.mark.parametrize("run,overrides,message", [
    (_torch_run, ["reader.file_access=collective"],
     "reader.file_access must be multi (or posix), got collective"),
    (_torch_run, ["framework=tensorflow", "reader.data_loader=tensorflow",
                  "dataset.format=indexed_binary"],
     "reader.engine: framework with reader.data_loader tensorflow reads tfrecord, npy, npz, "
     "hdf5, jpeg, png, csv, parquet, got dataset.format indexed_binary"),
    (_tf_run, ["reader.file_access=collective"],
     "reader.file_access must be multi (or posix), got collective"),
    (_tf_run, ["dataset.format=indexed_binary"],
     "reader.data_loader tensorflow reads tfrecord, npy, npz, hdf5, jpeg, png, csv, parquet, "
     "got dataset.format indexed_binary"),
], ids=["pytorch-collective", "pytorch-tf-indexed", "tensorflow-collective",
        "tensorflow-indexed"])
def test_a_refused_run_exits_2_with_one_message_before_any_io(tmp_path, run, overrides,
                                                              message):
    workload, args = run(tmp_path)
    res = run_cli(["run", workload, *args, *overrides], ranks=2)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("dlio-mpi: error: ") == 1 and message in res.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "out").exists()
