"""TFRecord files (DLIO's tfrecord): one record per sample, each a serialized tf.train.Example
holding the sample's bytes, as DLIO's generator writes them; and DLIO's index of each file.

DLIO 2.0's TFRecordGenerator writes per sample an Example with two features,
    'image': bytes_list of one value, the sample (a dim1 x dim2 uint8 image: dim^2 bytes)
    'size':  int64_list of one value, the dimension int(sqrt(record_length))
and then runs DALI's `tfrecord2idx` on the file, which writes
`<data_folder>/index/<train|valid>/<file name>.idx`: one text line "<offset> <bytes>\n" per
record (the record's file offset and its whole framed size, both in decimal); subfolders are
not mirrored there. (DLIO's generator picks index/valid when "valid" is anywhere in the file's
path, so a data folder named so gets train indexes there too; its DALI reader looks them up
by split, as here.) The 'size'
value here is isqrt(sample bytes): the dimension itself when record_length_bytes_stdev is 0
(square samples); with a stdev DLIO writes the mean dimension in every file, this the file's.

Record framing (TFRecord): uint64 data length (little-endian), uint32 masked CRC-32C of those
8 bytes, the data, uint32 masked CRC-32C of the data (mask: see _core.masked_crc32c). The data
is the Example in protobuf wire format, written by hand (tensorflow is not needed). Each
field is a tag byte (field number << 3 | wire type; 2: length-delimited) and, for
length-delimited fields, a varint length (7 bits a byte, low first, high bit = more). With
the map entries in key order (what SerializeToString(deterministic=True) gives; TensorFlow's
default order is its hash table's and varies between processes) the data of one record is:

    0A <Ls>                         Example.features (Features), Ls bytes
      0A <Le1>                        Features.feature map entry, Le1 bytes
        0A 05 'image'                   entry key
        12 <Lf1>                        entry value: Feature, Lf1 bytes
          0A <Lb>                         Feature.bytes_list (BytesList), Lb bytes
            0A <N>                          BytesList.value[0]: N bytes
              <N image bytes>                 <- the sample
      0A <Le2>                        second map entry
        0A 04 'size'                    entry key
        12 <Lf2>                        entry value: Feature
          1A <Li>                         Feature.int64_list (Int64List)
            0A <Lv> <varint dim>            Int64List.value, packed: Lv bytes of varints

For a 4096-byte sample (64 x 64) a record is 4149 bytes: 0-7 length 4133, 8-11 its CRC,
12-33 `0a a2 20 | 0a 90 20 | 0a 05 'image' | 12 86 20 | 0a 83 20 | 0a 80 20`, 34-4129 the
image, 4130-4144 `0a 0d | 0a 04 'size' | 12 05 | 1a 03 | 0a 01 40`, 4145-4148 the data CRC;
so a file of equal samples has equal records, and sample i's bytes sit at
data_offset + i * record_bytes: data_offset = 12 + the Example bytes before the image bytes,
record_bytes = 12 + data + 4. The C core writes the records (_core.write_tfrecords): the
constant bytes from here, the image bytes from the file's payload stream (record i: bytes
[i*N, (i+1)*N) of it), each record's data CRC."""

from __future__ import annotations

import math
import os
import struct

import numpy as np

from .. import _core
from ..storage import Handle, Storage, storage_for
from .base import FileLayout, Format, SampleSpec, StagedWrites, StoredRows, opened
from .loader import TF_BUFFER, TFRecordStreams

HEADER = 12  # uint64 length + uint32 masked CRC of it
FOOTER = 4   # uint32 masked CRC of the data
SPLIT_FOLDERS = ("train", "valid")  # DLIO's split folders (dataset.SPLITS)
_LEN_DELIMITED = 2


# ------------------------------------------------------------------ the Example's encoding

def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _vlen(value: int | np.ndarray) -> int | np.ndarray:
    """Bytes of the varint of `value` (an int or an int64 array: elementwise)."""
    return 1 + sum(value >= 1 << (7 * k) for k in range(1, 9))


def _field(number: int, length: int) -> bytes:
    """Tag and length of a length-delimited field of `length` bytes."""
    return bytes([number << 3 | _LEN_DELIMITED]) + varint(length)


def dimension(sample_bytes: int) -> int:
    """The 'size' feature's value: isqrt of the sample's bytes (DLIO's dimension)."""
    return math.isqrt(sample_bytes)


def example_parts(sample_bytes: int) -> tuple[bytes, bytes]:
    """The serialized Example of a sample of `sample_bytes` bytes as (bytes before the image
    bytes, bytes after them); see the module docstring for the layout."""
    n = sample_bytes
    image_list = _field(1, n)                                      # BytesList.value[0]
    image_feature = _field(1, len(image_list) + n) + image_list   # Feature.bytes_list
    image_entry = b"\x0a\x05image" + _field(2, len(image_feature) + n) + image_feature
    packed = varint(dimension(n))
    size_list = _field(1, len(packed)) + packed                    # Int64List.value, packed
    size_feature = _field(3, len(size_list)) + size_list           # Feature.int64_list
    size_entry = b"\x0a\x04size" + _field(2, len(size_feature)) + size_feature
    first = _field(1, len(image_entry) + n)                        # Features.feature[0]
    second = _field(1, len(size_entry)) + size_entry               # Features.feature[1]
    features = len(first) + len(image_entry) + n + len(second)
    return _field(1, features) + first + image_entry, second      # Example.features


def record_parts(sample_bytes: int) -> tuple[bytes, bytes]:
    """A record's constant bytes around the image bytes: (length, its masked CRC, the Example
    up to the image bytes; the Example after them). The data CRC follows the second part."""
    before, after = example_parts(sample_bytes)
    length = struct.pack("<Q", len(before) + sample_bytes + len(after))
    return length + struct.pack("<I", _core.masked_crc32c(length)) + before, after


def record_geometry(sample_bytes: int | np.ndarray
                    ) -> tuple[int, int] | tuple[np.ndarray, np.ndarray]:
    """(offset of the image bytes in a record, bytes of the record) for samples of
    `sample_bytes` bytes: ints, or int64 arrays elementwise (the same arithmetic as
    example_parts, for layouts of many files at once)."""
    n = sample_bytes
    bytes_list = 1 + _vlen(n) + n
    feature_image = 1 + _vlen(bytes_list) + bytes_list
    entry_image = 7 + 1 + _vlen(feature_image) + feature_image
    dim = _isqrt(n)
    int64_list = 1 + 1 + _vlen(dim)          # tag, length, packed varint
    entry_size = 6 + 1 + 1 + 1 + 1 + int64_list  # key, value's tag and length, Feature's
    features = 1 + _vlen(entry_image) + entry_image + 1 + 1 + entry_size
    data = 1 + _vlen(features) + features
    before = data - n - (1 + 1 + entry_size)
    return HEADER + before, HEADER + data + FOOTER


def _isqrt(n: int | np.ndarray) -> int | np.ndarray:
    if isinstance(n, np.ndarray):
        root = np.floor(np.sqrt(n.astype(np.float64))).astype(np.int64)
        root -= root * root > n
        return root + ((root + 1) * (root + 1) <= n)
    return math.isqrt(n)


# ------------------------------------------------------------------ reading an Example back

def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("holds a record whose Example is cut short or malformed")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes, start: int, end: int):
    """(field number, wire type, value start, value end) of the fields in buf[start:end];
    varints give their value's extent, length-delimited fields their payload's."""
    pos = start
    while pos < end:
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, after = _read_varint(buf, pos)
            yield number, wire, pos, after
            pos = after
        elif wire == _LEN_DELIMITED:
            length, pos = _read_varint(buf, pos)
            yield number, wire, pos, pos + length
            pos += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield number, wire, pos, pos + width
            pos += width
        else:
            raise ValueError(f"holds a record whose Example has wire type {wire}")
        if pos > end:
            raise ValueError("holds a record whose Example is cut short or malformed")


def image_extent(data: bytes) -> tuple[int, int]:
    """(offset, length) in a serialized Example of its 'image' feature's single bytes value;
    ValueError when the Example has none."""
    for number, wire, start, end in _fields(data, 0, len(data)):
        if number != 1 or wire != _LEN_DELIMITED:
            continue
        for f_number, f_wire, e_start, e_end in _fields(data, start, end):  # map entries
            if f_number != 1 or f_wire != _LEN_DELIMITED:
                continue
            entry = {n: (s, e) for n, w, s, e in _fields(data, e_start, e_end)
                     if w == _LEN_DELIMITED}
            if 1 not in entry or data[slice(*entry[1])] != b"image" or 2 not in entry:
                continue
            lists = [(n, s, e) for n, w, s, e in _fields(data, *entry[2]) if n == 1]
            values = [(s, e) for _, s0, e0 in lists for n, w, s, e in _fields(data, s0, e0)
                      if n == 1 and w == _LEN_DELIMITED]
            if len(values) != 1:
                raise ValueError(f"holds an Example whose 'image' has {len(values)} bytes "
                                 "values, not one")
            return values[0][0], values[0][1] - values[0][0]
    raise ValueError("holds a record whose Example has no 'image' bytes feature")


# ------------------------------------------------------------------ DLIO's index files

def index_path(path: str) -> str:
    """DLIO's index of the data file at `path` (<root>/<split>/[<sub>/]<name>):
    <root>/index/<split>/<name>.idx."""
    folder = os.path.dirname(path)
    if os.path.basename(folder) not in SPLIT_FOLDERS:  # a subfolder of the split's
        folder = os.path.dirname(folder)
    split = os.path.basename(folder)
    if split not in SPLIT_FOLDERS:
        raise ValueError(f"{path} is not in a train/ or valid/ folder, where DLIO's tfrecord "
                         "files and their index files live")
    return os.path.join(os.path.dirname(folder), "index", split, os.path.basename(path) + ".idx")


def index_text(records: int, record_bytes: int) -> bytes:
    """DLIO's (DALI tfrecord2idx's) index of `records` records of `record_bytes` bytes."""
    return "".join(f"{i * record_bytes} {record_bytes}\n" for i in range(records)).encode()


def _read_index(path: str) -> np.ndarray | None:
    """The (offset, bytes) rows of an index file, None when there is none."""
    try:
        with storage_for(path).stream(path) as fp:
            text = fp.read()
    except FileNotFoundError:
        return None
    try:
        values = np.array(text.split(), dtype=np.int64)
    except ValueError:
        raise ValueError(f"has an index file {path} that is not DALI's text index") from None
    if len(values) % 2:
        raise ValueError(f"has an index file {path} that is not DALI's text index")
    return values.reshape(-1, 2)


def _scan_framing(fs: Storage, handle: Handle, size: int) -> np.ndarray:
    """(offset, bytes) of every record, from the length fields."""
    rows, at = [], 0
    while at < size:
        head = fs.read_at(handle, 8, at)
        if len(head) < 8:
            raise ValueError(f"ends inside a record's length field at byte {at}")
        framed = HEADER + struct.unpack("<Q", head)[0] + FOOTER
        rows.append((at, framed))
        at += framed
    if at != size:
        raise ValueError(f"has a last record that runs past its end ({at} > {size} bytes)")
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


# ------------------------------------------------------------------ the format

class TFRecordFormat(Format):
    """dataset.format: tfrecord"""

    name = "tfrecord"
    written_whole = "each record is framed with checksums of its length and data"
    streams_files = True  # loader_model takes reader.transfer_size
    extension = "tfrecord"

    def native_read_note(self, cfg, read_mode: str) -> str:
        if read_mode == "sample":
            return ""
        buffer = cfg.reader.transfer_size or TF_BUFFER
        return ("the native C engine reads tfrecord as DLIO's "
                "tensorflow reader's tf.data.TFRecordDataset streams it: each file of the plan "
                f"once, whole, in preads of buffer_size={buffer:,} bytes ("
                + ("reader.transfer_size" if cfg.reader.transfer_size
                   else "reader.transfer_size unset: TensorFlow's") + "), "
                "files read by reader.read_threads threads at once")

    def layout(self, spec: SampleSpec) -> FileLayout:
        offset, record = record_geometry(spec.sample_bytes)
        return FileLayout(spec.samples * record, offset, record, spec.sample_bytes,
                          spec.sample_bytes)

    def layout_columns(self, sample_bytes: np.ndarray, samples: int) -> np.ndarray:
        """Layouts of many files at once (dataset.ComputedLayouts: record lengths are varints,
        whose sizes do not follow the digits of the dims), one row per file: size,
        data_offset, sample_step, sample_span, sample_bytes."""
        n = np.asarray(sample_bytes, dtype=np.int64)
        offset, record = record_geometry(n)
        return np.stack([record * samples, offset, record, n, n], axis=1)

    def write(self, path: str, spec: SampleSpec, seed: int, staged: StagedWrites) -> int:
        # The index first: the data file's rename is what marks the set complete.
        self.write_side_files(path, spec, staged)
        head, tail = record_parts(spec.sample_bytes)
        fs = staged.storage_of(path)
        return staged.write(path, lambda handle: fs.write_tfrecords(
            handle, 0, head, tail, spec.sample_bytes, spec.samples, seed, start=0, path=path))

    def write_side_files(self, path: str, spec: SampleSpec, staged: StagedWrites) -> None:
        idx = index_path(path)
        text = index_text(spec.samples, self.layout(spec).sample_step)
        fs = staged.storage_of(idx)
        try:
            staged.write(idx, lambda handle: fs.append(handle, text))
        except FileNotFoundError:  # the first index of the split: make its folder
            fs.make_folders(os.path.dirname(idx))
            staged.write(idx, lambda handle: fs.append(handle, text))

    def probe(self, path: str) -> StoredRows:
        with opened(path) as (fs, handle):
            size = fs.handle_size(handle)
            rows = _read_index(index_path(path))
            if rows is None:
                rows = _scan_framing(fs, handle, size)
            if len(rows) == 0:
                raise ValueError("holds no records")
            record = int(rows[0, 1])
            if not (np.all(rows[:, 1] == record)
                    and np.array_equal(rows[:, 0], np.arange(len(rows)) * record)):
                raise ValueError("holds records of unequal sizes (ragged records are not "
                                 "supported yet)")
            if len(rows) * record != size:
                raise ValueError(f"has {size} bytes where its index lists {len(rows)} records "
                                 f"of {record} bytes")
            extents = {self._image_extent(fs, handle, int(at), record)
                       for at in (0, rows[-1, 0])}
        if len(extents) != 1:
            raise ValueError("holds records whose image bytes sit at different places (ragged "
                             "records are not supported yet)")
        offset, length = extents.pop()
        return StoredRows(size, offset, (len(rows), length), "|u1", record, "records")

    @staticmethod
    def _image_extent(fs: Storage, handle: Handle, at: int, record: int) -> tuple[int, int]:
        """(offset in its record, bytes) of the image of the record at `at`."""
        data = fs.read_at(handle, record, at)
        if len(data) != record or HEADER + struct.unpack("<Q", data[:8])[0] + FOOTER != record:
            raise ValueError(f"has a record at byte {at} whose length field disagrees with its "
                             "index")
        offset, length = image_extent(data[HEADER:record - FOOTER])
        return HEADER + offset, length

    def side_files(self, path: str) -> list[str]:
        return [index_path(path)]

    def loader_model(self, facts, itemsize: int, samples: int,
                     transfer_size: int | None = None) -> TFRecordStreams:
        """DLIO's TF reader streams whole files through tf.data.TFRecordDataset, in reads of
        its buffer_size, reader.transfer_size (run.py passes it: streams_files)."""
        return TFRecordStreams(transfer_size)
