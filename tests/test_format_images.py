"""jpeg and png: Pillow reads the images dlio-mpi writes (one grayscale image of the sample's
dims per file, as DLIO's generators write them); sizes depend on the content, so generation
records them and a run reads exactly those bytes; images Pillow wrote without dlio-mpi (DLIO's
data) are probed file by file; a file that is no image under an image's name is refused by
name; reader.read_mode sample and dataset.compression are refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dlio_mpi.config import load_config
from dlio_mpi.data.recorded_sizes import sizes_path
from dlio_mpi.errors import UserError
from dlio_mpi.formats import SampleSpec, get_format
from dlio_mpi.formats.base import StagedWrites
from dlio_mpi.formats.sized import payload_values
from dlio_mpi.plan.derive import derive_plan
from helpers import access_logs, error_of, run_cli, workload_overrides

FORMATS = ("jpeg", "png")


def write(fmt_name: str, path: Path, spec: SampleSpec, seed: int) -> int:
    staged = StagedWrites("0a1b2c")
    size = get_format(fmt_name).write(str(path), spec, seed, staged)
    staged.commit()
    return size


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# --------------------------------------------------------------------------- the files

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(64, 64), (30, 50), (1, 7)])
def test_pillow_reads_the_image_of_the_samples_dims(tmp_path, fmt, shape):
    path = tmp_path / f"f.{fmt}"
    size = write(fmt, path, SampleSpec(shape, "|u1", 1), 7)
    assert path.stat().st_size == size
    assert path.read_bytes()[:3] in (b"\xff\xd8\xff", b"\x89PN")
    with Image.open(path) as image:
        assert image.format == fmt.upper() and image.mode == "L"
        pixels = np.asarray(image)
    assert pixels.shape == shape and pixels.dtype == np.uint8
    if fmt == "png":  # lossless: the very values drawn from the file's seed
        assert np.array_equal(pixels, payload_values(7, shape[0] * shape[1]).reshape(shape))
    assert payload_values(7, 1000).max() <= 254  # DLIO's np.random.randint(255)
    assert [p.name for p in tmp_path.iterdir()] == [f"f.{fmt}"]  # no temporary left


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_same_seed_writes_the_same_file(tmp_path, fmt):
    spec = SampleSpec((40, 40), "|u1", 1)
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        write(fmt, tmp_path / f"{name}.{fmt}", spec, seed)
    a, b, c = ((tmp_path / f"{n}.{fmt}").read_bytes() for n in "abc")
    assert a == b and a != c


@pytest.mark.parametrize("fmt", FORMATS)
def test_probe_reads_dims_from_the_header_and_the_layout_is_the_whole_file(tmp_path, fmt):
    path = tmp_path / f"f.{fmt}"
    Image.fromarray(np.zeros((24, 36), dtype=np.uint8)).save(path, format=fmt.upper())
    stored = get_format(fmt).probe(str(path))
    assert stored.shape == (24, 36) and stored.size == path.stat().st_size
    spec = stored.as_samples(1, "first_axis")
    assert spec.sample_bytes == 24 * 36  # what the configuration's dims are checked against
    lay = stored.layout(spec)  # the sample is the whole file
    assert (lay.size, lay.data_offset, lay.sample_step, lay.sample_span, lay.sample_bytes) == \
        (stored.size, 0, stored.size, stored.size, stored.size)
    rgb = tmp_path / f"rgb.{fmt}"
    Image.fromarray(np.zeros((4, 5, 3), dtype=np.uint8)).save(rgb, format=fmt.upper())
    assert get_format(fmt).probe(str(rgb)).shape == (4, 5, 3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_that_is_no_image_is_refused_naming_it(tmp_path, fmt):
    path = tmp_path / f"f.{fmt}"
    np.save(tmp_path / "x.npy", np.zeros(8))
    os.rename(tmp_path / "x.npy", path)
    with pytest.raises(ValueError, match=f"{path} is not a {fmt} file: it starts with"):
        get_format(fmt).probe_size(str(path))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_plans_estimate_is_near_the_real_size(tmp_path, fmt):
    for side in (64, 224):
        spec = SampleSpec((side, side), "|u1", 1)
        real = write(fmt, tmp_path / f"{side}.{fmt}", spec, 1)
        assert abs(get_format(fmt).layout(spec).size - real) < 0.05 * real


def test_load_whole_is_dlios_image_read_and_every_sample_is_the_image(tmp_path):
    path = tmp_path / "f.png"
    write("png", path, SampleSpec((8, 9), "|u1", 1), 2)
    image = get_format("png").load_whole(str(path))
    assert image.shape == (8, 9)
    assert get_format("png").library_sample(image, 3, False) is image


# --------------------------------------------------------------------------- the plan

def _cfg(tmp: Path, **values):
    return load_config("demo", workload_overrides(tmp, dataset__format="png", **values))


def test_read_mode_sample_is_refused_and_auto_reads_whole_files(tmp_path):
    with pytest.raises(UserError, match="reader.read_mode: sample reads each sample's extent, "
                                        "but DLIO's png reader decodes whole files"):
        derive_plan(_cfg(tmp_path, reader__read_mode="sample"), 2)
    plan = derive_plan(_cfg(tmp_path, reader__read_mode="auto"), 2)
    assert plan.read_mode == "file" and plan.format == "png"
    assert any("file sizes depend on the content" in n for n in plan.notes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_compression_and_other_element_types_are_refused(tmp_path, fmt):
    assert error_of("demo", [f"dataset.format={fmt}", "dataset.compression=gzip"]).startswith(
        f"dataset.compression: gzip with dataset.format {fmt} is not implemented yet")
    assert "stores uint8 only" in error_of("demo", [f"dataset.format={fmt}",
                                                    "dataset.record_element_type=float32"])
    assert error_of("demo", [f"dataset.format={fmt}", "dataset.num_samples_per_file=2"]) \
        .startswith(f"dataset.num_samples_per_file: 2 with dataset.format {fmt} is not "
                    "implemented yet (DLIO writes one image per file")


# --------------------------------------------------------------------------- runs

@pytest.mark.parametrize("fmt,ranks", [("jpeg", 2), ("png", 3)])
def test_generation_records_the_sizes_and_a_run_reads_exactly_those_files(tmp_path, fmt,
                                                                         ranks):
    per_file = 1
    files = 12
    args = workload_overrides(tmp_path, dataset__format=fmt, dataset__num_files_train=files,
                              dataset__num_samples_per_file=per_file,
                              dataset__record_length_bytes=1024, dataset__num_files_eval=3,
                              workflow__generate_data="true", reader__batch_size=2,
                              output__access_log="true", reader__sample_shuffle="seed")
    res = run_cli(["run", "demo", *args], ranks=ranks, timeout=240)
    assert res.returncode == 0, res.stderr
    data = tmp_path / "data"
    manifest = json.loads((data / "dlio_mpi_manifest.json").read_text())
    for split, count in (("train", files), ("valid", 3)):
        recorded = np.load(sizes_path(str(data), split))
        real = [(data / split / f"img_{i:02d}_of_{count}.{fmt}").stat().st_size
                if count > 9 else (data / split / f"img_{i}_of_{count}.{fmt}").stat().st_size
                for i in range(count)]
        assert recorded.tolist() == real
        assert manifest["sizes"][split] == f"dlio_mpi_sizes_{split}.npy"
        assert manifest["bytes"][split] == sum(real)
    sizes = np.load(sizes_path(str(data), "train"))
    metric = summary(tmp_path / "out")["metric"]
    # read_mode file: every sample's whole file, on the rank that read the sample
    logs = access_logs(tmp_path / "out", (1, 2), ranks)
    per_rank = sorted(int(sum(sizes[ids // per_file].sum() for ids in logs[r::ranks]))
                      for r in range(ranks))
    assert metric["train_bytes_transferred"] == sum(per_rank)  # (asked: more, at the ends)
    spread = metric["train_bytes_read_per_rank"]
    assert (spread["min"], spread["max"]) == (per_rank[0], per_rank[-1])
    assert metric["train_file_opens"] == sum(len(ids) for ids in logs)
    # a second run trusts the manifest and its recorded sizes: nothing written
    again = run_cli(["run", "demo", *args], ranks=ranks, timeout=240)
    assert again.returncode == 0, again.stderr
    assert "generated 0 files" in again.stdout


def test_a_lost_file_is_written_again_and_unknown_sizes_are_taken_as_found(tmp_path):
    """`dlio-mpi generate` repairs a lost file (same seed, same bytes); a dataset of ours
    without recorded sizes (an interrupted generation) has its files' sizes taken as found:
    our files only ever get their names complete."""
    args = workload_overrides(tmp_path, dataset__format="jpeg", dataset__num_files_train=8)
    assert run_cli(["generate", "demo", *args]).returncode == 0
    data = tmp_path / "data"
    lost = data / "train" / "img_4_of_8.jpeg"
    before, sizes = lost.read_bytes(), np.load(sizes_path(str(data), "train"))
    lost.unlink()
    res = run_cli(["generate", "demo", *args])
    assert res.returncode == 0, res.stderr
    assert "generated 1 files" in res.stdout and lost.read_bytes() == before
    assert np.array_equal(np.load(sizes_path(str(data), "train")), sizes)
    # as an interrupted generation leaves it: incomplete, no sizes recorded
    manifest = json.loads((data / "dlio_mpi_manifest.json").read_text())
    manifest["complete"] = False
    del manifest["sizes"]
    (data / "dlio_mpi_manifest.json").write_text(json.dumps(manifest))
    os.unlink(sizes_path(str(data), "train"))
    os.unlink(sizes_path(str(data), "valid"))
    lost.unlink()
    res = run_cli(["generate", "demo", *args])
    assert res.returncode == 0, res.stderr
    assert "generated 1 files (" in res.stdout and "7 already complete" in res.stdout
    assert np.array_equal(np.load(sizes_path(str(data), "train")), sizes)
    # a changed file of known size is refused, not overwritten
    (data / "train" / "img_0_of_8.jpeg").write_bytes(b"\xff\xd8\xff changed")
    res = run_cli(["generate", "demo", *args])
    assert res.returncode != 0 and "img_0_of_8.jpeg has 11 bytes where dlio-mpi " \
                                   "generated" in res.stderr


def _pillow_dataset(train: Path, fmt: str, count: int, side: int) -> list[int]:
    """Images as DLIO's generator writes them, without dlio-mpi; their sizes."""
    train.mkdir(parents=True)
    rng = np.random.RandomState(10)
    for i in range(count):
        Image.fromarray(rng.randint(255, size=(side, side), dtype=np.uint8)).save(
            train / f"img_{i}_of_{count}.{fmt}", format=fmt.upper())
    return [(train / f"img_{i}_of_{count}.{fmt}").stat().st_size for i in range(count)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_images_pillow_wrote_are_probed_and_read_whole(tmp_path, fmt):
    sizes = _pillow_dataset(tmp_path / "data" / "train", fmt, 8, 32)
    res = run_cli(["run", "demo", *workload_overrides(
        tmp_path, dataset__format=fmt, dataset__num_files_train=8,
        dataset__record_length_bytes=1024, workflow__generate_data="false",
        train__epochs=1)])
    assert res.returncode == 0, res.stderr
    metric = summary(tmp_path / "out")["metric"]
    assert metric["train_bytes_transferred"] == sum(sizes)
    assert not (tmp_path / "data" / "dlio_mpi_manifest.json").exists()


def test_a_foreign_file_that_is_no_jpeg_is_refused_by_name(tmp_path):
    train = tmp_path / "data" / "train"
    _pillow_dataset(train, "jpeg", 8, 32)
    bad = train / "img_5_of_8.jpeg"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not a jpeg")
    res = run_cli(["run", "demo", *workload_overrides(
        tmp_path, dataset__format="jpeg", dataset__num_files_train=8,
        dataset__record_length_bytes=1024, workflow__generate_data="false")])
    assert res.returncode == 2, res.stderr
    assert f"{bad} is not a jpeg file: it starts with" in res.stderr


def test_foreign_images_of_other_dims_are_refused(tmp_path):
    _pillow_dataset(tmp_path / "data" / "train", "png", 8, 16)
    res = run_cli(["run", "demo", *workload_overrides(
        tmp_path, dataset__format="png", dataset__num_files_train=8,
        dataset__record_length_bytes=1024, workflow__generate_data="false")])
    assert res.returncode == 2
    assert "holds 1 samples of 256 bytes (array (16, 16) of |u1), but " \
           "dataset.record_length_bytes=1024 gives 1024 bytes per sample" in res.stderr


def test_keep_files_false_removes_the_recorded_sizes_too(tmp_path):
    res = run_cli(["run", "demo", *workload_overrides(
        tmp_path, dataset__format="png", workflow__generate_data="true",
        dataset__keep_files="false", train__epochs=1)])
    assert res.returncode == 0, res.stderr
    assert "removed the dataset" in res.stdout
    assert not (tmp_path / "data").exists()
