"""The native engine's model of DLIO's tensorflow reader on TFRecord files
(formats.loader.TFRecordStreams) against strace of a real tf.data.TFRecordDataset streaming
the files dlio-mpi wrote: for buffer sizes that divide a file, do not, or exceed it, each
file's preads (offset, bytes returned, bytes asked) must equal the model's exactly, and the
plan of a whole-file read mode must issue them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from test_npload_model import _strace

from dlio_mpi.formats import SampleSpec, get_format
from dlio_mpi.formats.base import StagedWrites
from dlio_mpi.formats.loader import TF_BUFFER, TFRecordStreams

pytestmark = [pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace"),
              pytest.mark.timeout(300)]
pytest.importorskip("tensorflow")

STREAM = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
buffer = None if sys.argv[1] == "none" else int(sys.argv[1])
for path in sys.argv[2:]:
    for _ in tf.data.TFRecordDataset([path], buffer_size=buffer):
        pass
"""


def _files(folder: Path) -> list[Path]:
    (folder / "train").mkdir(parents=True)
    staged = StagedWrites("7f0c1e")
    paths = []
    for side, samples in ((8, 1), (300, 8), (512, 4), (1000, 3)):
        path = folder / "train" / f"f{side}.tfrecord"
        get_format("tfrecord").write(str(path), SampleSpec((side, side), "|u1", samples),
                                     side, staged)
        paths.append(path)
    staged.commit()
    return paths


@pytest.mark.parametrize("buffer", [None, 100_000, 4096])
def test_the_model_issues_the_preads_tf_data_makes(tmp_path, buffer):
    paths = _files(tmp_path)
    sizes = [p.stat().st_size for p in paths]
    loader = STREAM.replace("sys.argv[1]", repr("none" if buffer is None else str(buffer)))
    loader = loader.replace("sys.argv[2:]", "sys.argv[1:]")
    traced = _strace(paths, tmp_path / "trace.log", loader)

    class Lay:
        size = np.array(sizes, dtype=np.int64)

    model = TFRecordStreams(buffer)(Lay, 4096)
    for k, path in enumerate(paths):
        got = traced[str(path)]
        first, last = model.start[k], model.start[k + 1]
        want = list(zip(model.offset[first:last].tolist(), model.expect[first:last].tolist(),
                        model.length[first:last].tolist()))
        assert got["reads"] == want, path.name
        assert got["opens"] == got["closes"] == 1 and got["fstats"] == 0
    assert TFRecordStreams(None).buffer == TF_BUFFER


def test_whole_buffers_end_with_a_read_at_the_end_of_the_file():
    class Lay:
        size = np.array([0, 8192, 5000], dtype=np.int64)

    m = TFRecordStreams(4096)(Lay, 4096)
    assert m.start.tolist() == [0, 1, 4, 7]
    assert m.offset.tolist() == [0, 0, 4096, 8192, 0, 4096, 5000]
    assert m.length.tolist() == [4096, 4096, 4096, 4096, 4096, 4096, 3192]
    assert m.expect.tolist() == [0, 4096, 4096, 0, 4096, 904, 0]
