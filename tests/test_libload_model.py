"""The jpeg and csv read models (dlio_mpi.formats.libload) against strace of DLIO's loads:
`np.asarray(PIL.Image.open(path))` of JPEG files and `pandas.read_csv(path)` of csv files,
written by dlio-mpi's writers and by Pillow and pandas, in one traced subprocess each (the
modules imported by a first load of another file first). Each file's reads (offset, bytes
returned, bytes asked) and fstat count must equal the model's exactly."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_npload_model import _strace

from dlio_mpi.formats import SampleSpec, get_format
from dlio_mpi.formats.base import StagedWrites
from dlio_mpi.formats.libload import csv_reads, jpeg_reads
from dlio_mpi.sampling.requests import AccessPolicy, plan_reads

pd = pytest.importorskip("pandas")

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

LOADER = """
import sys
import numpy as np
import pandas as pd
from PIL import Image

def load(path):
    if path.endswith(".csv"):
        return pd.read_csv(path, header=None).to_numpy()
    return np.asarray(Image.open(path))

for path in sys.argv[1:]:
    load(path)
"""
JPEG_SIDES = [1, 8, 64, 100, 255, 512, 1024]
CSV_SHAPES = [((1,), 1), ((8, 8), 3), ((64, 64), 1), ((256, 256), 2), ((300, 300), 4)]


def _dataset(folder: Path) -> list[Path]:
    paths = []
    for fmt in ("jpeg", "csv"):  # a first load imports the modules: not measured
        warm = folder / f"warm.{fmt}"
        paths.append(warm)
        if fmt == "jpeg":
            Image.fromarray(np.zeros((4, 4), np.uint8)).save(warm, format="JPEG")
        else:
            warm.write_text("1,2\n")
    staged = StagedWrites("11b0ad")
    for side in JPEG_SIDES:
        get_format("jpeg").write(str(folder / f"ours{side}.jpeg"),
                                 SampleSpec((side, side), "|u1", 1), side, staged)
        rng = np.random.RandomState(side)
        Image.fromarray(rng.randint(255, size=(side, side + 3), dtype=np.uint8)).save(
            folder / f"pil{side}.jpeg", format="JPEG")
    for shape, rows in CSV_SHAPES:
        name = "x".join(map(str, shape))
        get_format("csv").write(str(folder / f"ours{name}-{rows}.csv"),
                                SampleSpec(shape, "|u1", rows), rows, staged)
        record = np.random.RandomState(rows).randint(255, size=int(np.prod(shape)),
                                                     dtype=np.uint8)
        pd.DataFrame(data=[record] * rows).to_csv(folder / f"pandas{name}-{rows}.csv",
                                                  header=False, index=False)
    staged.commit()
    return paths + sorted(p for p in folder.iterdir() if not p.name.startswith("warm"))


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    folder = tmp_path_factory.mktemp("libload")
    paths = _dataset(folder)
    got = _strace(paths, tmp_path_factory.mktemp("strace") / "log", LOADER)
    return {p: got[str(p)] for p in paths if not p.name.startswith("warm")}


def test_the_models_issue_the_loaders_reads(traced):
    assert len(traced) == 2 * len(JPEG_SIDES) + 2 * len(CSV_SHAPES)
    for path, rec in traced.items():
        st = path.stat()
        model = (csv_reads if path.suffix == ".csv" else jpeg_reads)(st.st_size, st.st_blksize)
        reads = list(zip(model.offset.tolist(), model.length.tolist(), model.asked.tolist()))
        assert rec["reads"] == reads, path.name
        assert rec["fstats"] == model.fstats, path.name
        assert rec["opens"] == rec["closes"] == 1, path.name


def test_the_plan_issues_the_model_for_each_file(tmp_path):
    fmt = get_format("csv")
    from dlio_mpi.data.dataset import SizedLayouts

    sizes = np.array([10, 300_000, 10, 600_000], dtype=np.int64)
    policy = AccessPolicy("loader", False, 4096, fmt.loader_model(None, 1, 1))
    plan = plan_reads(np.arange(4), 2, 2, 1, SizedLayouts(sizes, 1, fmt), "file", policy)
    for f, size in enumerate(sizes.tolist()):
        model = csv_reads(size, 4096)
        mine = plan.file_idx == f
        assert plan.offset[mine].tolist() == model.offset.tolist()
        assert plan.expect[mine].tolist() == model.length.tolist()
        assert plan.length[mine].tolist() == model.asked.tolist()
    assert int(plan.expect.sum()) == int(sizes.sum())
