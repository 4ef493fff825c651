"""tfrecord: TensorFlow reads the files dlio-mpi writes (records, CRCs and Examples as DLIO's
generator writes them, byte for byte as TFRecordWriter frames them), the computed extents are
where each sample's image bytes are, DLIO's index files are there, files TensorFlow wrote are
probed and read, and the shipped tfrecord workloads generate and train on 2 ranks."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import mpiexec
from dlio_mpi import _core
from dlio_mpi.config import load_config
from dlio_mpi.data.dataset import describe_dataset
from dlio_mpi.data.generate import file_seed
from dlio_mpi.formats import SampleSpec, get_format
from dlio_mpi.formats.base import StagedWrites
from dlio_mpi.formats.tfrecord import example_parts, record_geometry, record_parts
from helpers import run_cli, signal_one_rank_when, workload_overrides

tf = pytest.importorskip("tensorflow")

FMT = get_format("tfrecord")
# DLIO's TFReader parses every record with these features
DLIO_FEATURES = {"image": tf.io.FixedLenFeature([], tf.string),
                 "size": tf.io.FixedLenFeature([], tf.int64)}


def tf_example(image: bytes, size: int) -> tf.train.Example:
    """The Example DLIO's TFRecordGenerator makes of one sample."""
    return tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "size": tf.train.Feature(int64_list=tf.train.Int64List(value=[size]))}))


def size_first(image: bytes, size: int) -> bytes:
    """The same Example with its map entries the other way round (TensorFlow's default
    serialization orders them by its hash table, which differs between processes)."""
    entries = (tf.train.Features(feature={"size": tf_example(image, size).features.feature["size"]})
               .SerializeToString()
               + tf.train.Features(feature={"image": tf_example(image, size).features
                                            .feature["image"]}).SerializeToString())
    return b"\x0a" + _varint(len(entries)) + entries


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def dali_index(path: Path) -> str:
    """What DALI's tfrecord2idx, which DLIO's generator runs on every file, writes: a line
    '<offset> <framed record bytes>' per record, from the records' length fields."""
    data, lines, at = path.read_bytes(), [], 0
    while at < len(data):
        framed = 8 + 4 + struct.unpack_from("<Q", data, at)[0] + 4
        lines.append(f"{at} {framed}\n")
        at += framed
    return "".join(lines)


def write(path: Path, spec: SampleSpec, seed: int) -> int:
    staged = StagedWrites("0a1b2c")
    size = FMT.write(str(path), spec, seed, staged)
    staged.commit()
    return size


def records(path: Path) -> list[bytes]:
    return list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())


def extent(data: bytes, layout, index: int) -> bytes:
    start = layout.data_offset + index * layout.sample_step
    return data[start:start + layout.sample_span]


# ------------------------------------------------------------------------------ checksums

def test_crc32c_known_vectors_and_mask():
    assert _core.crc32c(b"123456789") == 0xE3069283
    # RFC 3720 (iSCSI) B.4
    assert _core.crc32c(bytes(32)) == 0x8A9136AA
    assert _core.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert _core.crc32c(bytes(range(32))) == 0x46DD794E
    assert _core.crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C
    crc = 0xE3069283
    assert _core.masked_crc32c(b"123456789") == \
        (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    big = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8)
    assert _core.masked_crc32c(big[1000:], _core.crc32c(big[:1000])) == _core.masked_crc32c(big)


@pytest.mark.parametrize("data", [b"", b"x", b"hello tfrecord", bytes(range(256)) * 41])
def test_masked_crc32c_frames_records_as_tensorflow_does(tmp_path, data):
    path = tmp_path / "r.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(data)
    framed = path.read_bytes()
    length = struct.pack("<Q", len(data))
    assert framed == (length + struct.pack("<I", _core.masked_crc32c(length)) + data
                      + struct.pack("<I", _core.masked_crc32c(data)))


# ------------------------------------------------------------------------------ records

# sample sizes around the varint boundaries of every nested length (127/128, 16384, 2^21)
SIZES = [1, 64, 100, 127, 128, 4096, 16359, 16360, 16370, 16380, 16383, 16384, 114244,
         2**21 - 40, 2**21 - 20, 2**21 - 5, 2**21, 2**21 + 3]


@pytest.mark.parametrize("n", SIZES)
def test_example_encoding_is_tensorflows(n):
    before, after = example_parts(n)
    image = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    dim = int(np.sqrt(n))
    assert tf_example(image, dim).SerializeToString(deterministic=True) == before + image + after
    offset, record = record_geometry(n)
    assert (offset, record) == (12 + len(before), 12 + len(before) + n + len(after) + 4)
    offsets, sizes = record_geometry(np.array([n, n], dtype=np.int64))
    assert offsets.tolist() == [offset] * 2 and sizes.tolist() == [record] * 2


@pytest.mark.parametrize("side,samples", [(8, 3), (64, 5), (127, 2), (338, 2)])
def test_file_is_byte_for_byte_what_tfrecordwriter_writes(tmp_path, side, samples):
    train = tmp_path / "data" / "train"
    train.mkdir(parents=True)
    spec = SampleSpec((side, side), "|u1", samples)
    path = train / "img_0_of_1.tfrecord"
    size = write(path, spec, seed=99)
    layout = FMT.layout(spec)
    assert size == layout.size == path.stat().st_size
    n = spec.sample_bytes
    stream = bytearray(n * samples)
    _core.fill_random(stream, 99)
    reference = tmp_path / "reference.tfrecord"
    with tf.io.TFRecordWriter(str(reference)) as writer:
        for i in range(samples):
            image = bytes(stream[i * n:(i + 1) * n])
            writer.write(tf_example(image, side).SerializeToString(deterministic=True))
    assert path.read_bytes() == reference.read_bytes()


def test_large_records_pass_the_write_buffer(tmp_path):
    """Records larger than the C core's buffer (8 MiB): the same bytes as small chunks."""
    (tmp_path / "train").mkdir()
    spec = SampleSpec((3000, 3000), "|u1", 2)
    path = tmp_path / "train" / "big.tfrecord"
    write(path, spec, 5)
    data = path.read_bytes()
    head, tail = record_parts(spec.sample_bytes)
    small = tmp_path / "small"
    fd = os.open(small, os.O_WRONLY | os.O_CREAT)
    try:
        _core.write_tfrecords(fd, 0, head, tail, spec.sample_bytes, 2, 5, chunk=4097)
    finally:
        os.close(fd)
    assert small.read_bytes() == data
    parsed = [tf.io.parse_single_example(r, DLIO_FEATURES) for r in records(path)]
    layout = FMT.layout(spec)
    assert [p["image"].numpy() for p in parsed] == [extent(data, layout, i) for i in range(2)]


def test_write_tfrecords_refuses_a_head_that_lies_about_the_length(tmp_path):
    head, tail = record_parts(100)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError, match="length field"):
            _core.write_tfrecords(fd, 0, head, tail, 101, 1, 0, path="f")
        with pytest.raises(OSError, match="invalid record"):
            _core.write_tfrecords(fd, 0, head[:11], tail, 100, 1, 0)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ generation

def test_generated_files_are_dlios_records_and_index_files(tmp_path):
    args = ["resnet50_h100", *workload_overrides(
        tmp_path, dataset__num_samples_per_file=5, reader__batch_size=1,
        dataset__num_files_train=3, dataset__num_files_eval=2,
        dataset__num_subfolders_train=2)]
    res = run_cli(["generate", *args])
    assert res.returncode == 0, res.stderr
    splits = describe_dataset(load_config(args[0], args[1:]))
    data = tmp_path / "data"
    seen = []
    for name, split in splits.items():
        layouts = split.expected_layouts()
        for index in range(split.num_files):
            path = Path(split.path(index))
            raw = path.read_bytes()
            layout = layouts.layout(index)
            assert len(raw) == layout.size == FMT.layout(split.spec(index)).size
            stream = bytearray(5 * 4096)
            _core.fill_random(stream, file_seed(name, index))
            parsed = [tf.io.parse_single_example(r, DLIO_FEATURES) for r in records(path)]
            assert len(parsed) == 5
            for i, example in enumerate(parsed):
                image = example["image"].numpy()
                assert example["size"].numpy() == 64 and len(image) == 4096
                assert image == extent(raw, layout, i) == bytes(stream[i * 4096:(i + 1) * 4096])
            idx = data / "index" / name / (path.name + ".idx")
            assert idx.read_text() == dali_index(path)
            assert FMT.side_files(str(path)) == [str(idx)]
            seen.append(str(path.relative_to(data)))
    assert seen == ["train/0/img_0_of_3.tfrecord", "train/1/img_1_of_3.tfrecord",
                    "train/0/img_2_of_3.tfrecord", "valid/img_0_of_2.tfrecord",
                    "valid/img_1_of_2.tfrecord"]
    assert sorted(os.listdir(data / "index")) == ["train", "valid"]
    assert [p.name for p in data.rglob("*") if ".dlio_mpi-" in p.name] == []


def test_probe_of_generated_files_gives_their_layout(tmp_path):
    (tmp_path / "valid").mkdir()
    spec = SampleSpec((30, 30), "|u1", 4)
    path = tmp_path / "valid" / "f.tfrecord"
    write(path, spec, 3)
    stored = FMT.probe(str(path))
    assert stored.layout(stored.as_samples(4, "last_axis")) == FMT.layout(spec)
    os.unlink(tmp_path / "index" / "valid" / "f.tfrecord.idx")  # scanned from the framing
    stored = FMT.probe(str(path))
    assert stored.layout(stored.as_samples(4, "first_axis")) == FMT.layout(spec)
    with pytest.raises(ValueError, match="num_samples_per_file=5"):
        stored.as_samples(5, "first_axis")


def _write_with_tensorflow(path: Path, images: list[bytes], size: int, flip: bool) -> None:
    """Records as DLIO's generator writes them (TFRecordWriter), map entries in either order,
    and DALI's index."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for image in images:
            writer.write(size_first(image, size) if flip
                         else tf_example(image, size).SerializeToString(deterministic=True))
    idx = path.parent.parent / "index" / path.parent.name / (path.name + ".idx")
    idx.parent.mkdir(parents=True, exist_ok=True)
    idx.write_text(dali_index(path))


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("with_index", [True, False])
def test_probe_finds_the_image_bytes_of_files_tensorflow_wrote(tmp_path, flip, with_index):
    (tmp_path / "train").mkdir()
    path = tmp_path / "train" / "img_0_of_1.tfrecord"
    rng = np.random.default_rng(4)
    images = [rng.integers(0, 255, 40 * 40, dtype=np.uint8).tobytes() for _ in range(3)]
    _write_with_tensorflow(path, images, 40, flip)
    if not with_index:
        os.unlink(tmp_path / "index" / "train" / (path.name + ".idx"))
    stored = FMT.probe(str(path))
    spec = stored.as_samples(3, "first_axis")
    assert spec.sample_bytes == 1600
    layout = stored.layout(spec)
    raw = path.read_bytes()
    assert [extent(raw, layout, i) for i in range(3)] == images
    assert layout.size == len(raw) and layout.sample_step == len(raw) // 3


def test_ragged_records_are_refused(tmp_path):
    (tmp_path / "train").mkdir()
    path = tmp_path / "train" / "img_0_of_1.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for n in (100, 101):
            writer.write(tf_example(bytes(n), 10).SerializeToString(deterministic=True))
    with pytest.raises(ValueError, match="ragged records are not supported yet"):
        FMT.probe(str(path))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ValueError, match="past its end"):
        FMT.probe(str(path))


def test_files_outside_a_split_folder_have_no_index_path(tmp_path):
    with pytest.raises(ValueError, match="train/ or valid/"):
        FMT.side_files(str(tmp_path / "f.tfrecord"))


def test_computed_layouts_follow_each_files_varint_lengths(tmp_path):
    """With record_length_bytes_stdev the files' samples straddle the 16384-byte varint
    boundary: every file's computed layout is its own, and what generation writes."""
    args = ["cosmoflow_h100", *workload_overrides(
        tmp_path, dataset__num_files_train=24, dataset__record_length_bytes=16384,
        dataset__record_length_bytes_stdev=2500, dataset__num_samples_per_file=2,
        reader__batch_size=1)]
    splits = describe_dataset(load_config(args[0], args[1:]))
    train = splits["train"]
    layouts = train.expected_layouts()
    sample_bytes = [train.spec(i).sample_bytes for i in range(24)]
    assert min(sample_bytes) < 16384 <= max(sample_bytes)
    computed = layouts.take(np.arange(24))
    for i in range(24):
        want = FMT.layout(train.spec(i))
        assert layouts.layout(i) == want
        assert computed.sample_step[i] == want.sample_step
    assert layouts.total("size") == sum(FMT.layout(train.spec(i)).size for i in range(24))
    res = run_cli(["generate", *args])
    assert res.returncode == 0, res.stderr
    for i in range(24):
        path = Path(train.path(i))
        assert path.stat().st_size == layouts.layout(i).size
        parsed = [tf.io.parse_single_example(r, DLIO_FEATURES) for r in records(path)]
        raw = path.read_bytes()
        assert [p["image"].numpy() for p in parsed] == \
            [extent(raw, layouts.layout(i), k) for k in range(2)]


# ------------------------------------------------------------------------------ runs

def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("mode", ["auto", "sample"])
def test_resnet50_generates_and_trains_on_two_ranks(tmp_path, mode):
    data, out = tmp_path / "data", tmp_path / "out"
    res = run_cli(["run", "resnet50_h100", f"++workload.dataset.data_folder={data}",
                   "workflow.generate_data=true", "dataset.num_files_train=4",
                   "dataset.num_samples_per_file=8", "dataset.record_length_bytes=4096",
                   "reader.batch_size=4", "train.epochs=1", "train.computation_time=0.001",
                   f"reader.read_mode={mode}", f"output.folder={out}"])
    assert res.returncode == 0, res.stderr
    summary = _summary(out)
    record = FMT.layout(SampleSpec((64, 64), "|u1", 8)).sample_step
    assert summary["dlio_mpi"]["steps_per_epoch"] == 4  # 32 samples / 2 ranks / batch 4
    assert summary["dlio_mpi"]["read_mode"] == ("file_once" if mode == "auto" else "sample")
    metric = summary["metric"]
    assert metric["train_bytes_read"] == 32 * 4096
    if mode == "auto":  # DLIO's tf reader streams each file once per epoch, in preads of
        # TFRecordDataset's 256 KiB buffer (the file's bytes, then a read at its end)
        assert metric["train_bytes_requested"] == 4 * 2 * 256 * 1024 - 4 * 8 * record
        assert metric["train_requests"] == 4 * 2
        assert metric["train_file_opens"] == 4
    else:  # the image bytes of each sample
        assert metric["train_bytes_requested"] == 32 * 4096 and metric["train_requests"] == 32
    assert sorted(os.listdir(data / "index" / "train")) == [
        f"img_{i}_of_4.tfrecord.idx" for i in range(4)]


def test_data_tensorflow_wrote_is_read_as_dlio_wrote_it(tmp_path):
    """A data folder as DLIO's generator leaves it (no manifest; records serialized in either
    map order, as different processes do): probed, listed and read by extent."""
    train = tmp_path / "data" / "train"
    train.mkdir(parents=True)
    rng = np.random.RandomState(10)
    for i in range(4):
        images = [rng.randint(255, size=(48, 48), dtype=np.uint8).tobytes() for _ in range(6)]
        _write_with_tensorflow(train / f"img_{i}_of_4.tfrecord", images, 48, flip=i % 2 == 1)
    res = run_cli(["run", "resnet50_h100", *workload_overrides(
        tmp_path, dataset__num_files_train=4, dataset__num_samples_per_file=6,
        dataset__record_length_bytes=2304, reader__batch_size=3, train__epochs=1,
        reader__read_mode="sample", workflow__generate_data="false")])
    assert res.returncode == 0, res.stderr
    metric = _summary(tmp_path / "out")["metric"]
    assert metric["train_bytes_read"] == metric["train_bytes_requested"] == 24 * 2304
    assert not (tmp_path / "data" / "dlio_mpi_manifest.json").exists()


def test_a_killed_generation_leaves_no_index_temporaries(tmp_path):
    over = workload_overrides(tmp_path, dataset__num_files_train=3000,
                              dataset__num_samples_per_file=4, reader__batch_size=1)
    cmd = [mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", "generate",
           "resnet50_h100", *over]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    index = tmp_path / "data" / "index" / "train"

    def index_temporaries() -> list[str]:
        return [n for n in os.listdir(index) if ".dlio_mpi-" in n] if index.is_dir() else []

    signal_one_rank_when(job, str(tmp_path / "data"), lambda: len(index_temporaries()) > 100,
                         signal.SIGKILL)
    job.communicate(timeout=60)
    assert job.returncode != 0 and index_temporaries(), "the kill came too late to test anything"
    res = run_cli(["generate", "resnet50_h100", *over], timeout=120)
    assert res.returncode == 0, res.stderr
    assert index_temporaries() == []
    names = sorted(os.listdir(index))
    assert len(names) == 3000
    assert all((index / n).read_text() == dali_index(tmp_path / "data" / "train" / n[:-4])
               for n in names[::97])


def test_keep_files_false_removes_the_index_folders_too(tmp_path):
    data = tmp_path / "data"
    res = run_cli(["run", "resnet50_h100", f"++workload.dataset.data_folder={data}",
                   "workflow.generate_data=true", "dataset.num_files_train=4",
                   "dataset.num_samples_per_file=8", "dataset.record_length_bytes=4096",
                   "reader.batch_size=4", "train.epochs=1", "train.computation_time=0.001",
                   "dataset.keep_files=false", f"output.folder={tmp_path / 'out'}"])
    assert res.returncode == 0, res.stderr
    assert "removed the dataset" in res.stdout
    assert not data.exists()  # data files, index files and their folders all gone
