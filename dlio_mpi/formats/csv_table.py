"""CSV files (DLIO's csv): a table of dataset.num_samples_per_file identical rows, each the
sample's dim1*dim2 values (pseudo-random integers in [0, 255) from the file's seed, as DLIO's
np.random.randint(255, dtype=uint8)) in decimal, separated by commas, each row ending in a
newline, no header and no index column: exactly the text pandas'
`DataFrame(rows).to_csv(path, header=False, index=False)` writes, which DLIO's generator
runs. The text is made here with NumPy (tests check it against pandas). Sample i is row i:
rows are identical, so each is size / num_samples_per_file bytes.

Sizes depend on the values' digits: they are recorded at generation (formats/sized.py).
Reads: DLIO's reader loads with `pandas.read_csv(path)`, whose calls the native engine issues
(modelled in libload.py: 256 KiB reads to the end), the framework engine runs pandas itself
(read_csv with header=None, so that every row is a sample; DLIO's default header=0 takes the
first row for column names)."""

from __future__ import annotations

import numpy as np

from ..storage import storage_for
from .base import SampleSpec, StagedWrites
from .libload import LibraryLoads, csv_reads
from .sized import SizedFormat, StoredWhole, payload_values

_TEXT = np.zeros((255, 3), dtype=np.uint8)   # each value's decimal digits, left-aligned
_LENGTH = np.array([len(str(v)) for v in range(255)], dtype=np.int64)
for _v in range(255):
    _TEXT[_v, :_LENGTH[_v]] = np.frombuffer(str(_v).encode(), dtype=np.uint8)
MEAN_DIGITS = float(_LENGTH.mean())  # 2.57 digits per value in [0, 255)
TEXT_BYTES = set(b"0123456789,.-+eE \t\r\n")  # what a numeric table's text is made of


def row_text(values: np.ndarray) -> bytes:
    """The csv row of uint8 `values`: decimal, comma-separated, newline-terminated."""
    v = np.asarray(values, dtype=np.uint8).astype(np.intp)
    length = _LENGTH[v]
    ends = np.cumsum(length + 1)
    starts = ends - length - 1
    out = np.empty(int(ends[-1]) if len(v) else 1, dtype=np.uint8)
    for k in range(3):  # the k-th digit of every value that has one
        has = length > k
        out[starts[has] + k] = _TEXT[v[has], k]
    out[ends - 1] = ord(",")
    out[-1] = ord("\n")
    return out.tobytes()


def elements(spec: SampleSpec) -> int:
    count = 1
    for d in spec.shape:
        count *= int(d)
    return count


class CsvFormat(SizedFormat):
    """dataset.format: csv"""

    name = extension = "csv"
    library = "pandas"
    whole_file_sample = False  # sample i is row i

    def estimated_sizes(self, sample_bytes: np.ndarray, samples: int) -> np.ndarray:
        return samples * np.round(sample_bytes * (MEAN_DIGITS + 1)).astype(np.int64)

    def write(self, path: str, spec: SampleSpec, seed: int, staged: StagedWrites) -> int:
        row = row_text(payload_values(seed, elements(spec)))

        def render(fp) -> None:
            for _ in range(spec.samples):
                fp.write(row)

        return self.write_bytes(path, staged, render)

    def check_head(self, head: bytes) -> str:
        if not head:
            return "it is empty"
        at = next((k for k, byte in enumerate(head) if byte not in TEXT_BYTES), None)
        return "" if at is None else (f"it holds byte {head[at]:#04x} at offset {at}, not "
                                      "numeric csv text")

    def loader_model(self, facts, itemsize: int, samples: int) -> LibraryLoads:
        return LibraryLoads(csv_reads)

    def load_whole(self, path: str) -> np.ndarray:
        """pandas.read_csv (the framework engine refuses csv without pandas)."""
        import pandas

        return pandas.read_csv(path, header=None).to_numpy()

    def probe(self, path: str) -> StoredWhole:
        """Rows (newlines) and values of the first row, reading the whole file (a few files
        only: the spot checks of foreign data)."""
        size = self.probe_size(path)
        rows, first, tail, first_done = 0, b"", b"", False
        with storage_for(path).stream(path) as fp:
            while chunk := fp.read(1 << 22):
                if not first_done:
                    head, newline, _ = chunk.partition(b"\n")
                    first += head
                    first_done = bool(newline)
                rows += chunk.count(b"\n")
                tail = chunk[-1:]
        if tail not in (b"\n", b""):
            rows += 1  # a last row without its newline
        values = first.count(b",") + 1 if first.strip() else 0
        return StoredWhole(size, 0, (rows, values), "|u1", whole_file_sample=False)
