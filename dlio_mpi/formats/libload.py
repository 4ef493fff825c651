"""The read calls of DLIO's jpeg and csv loaders, modelled (as npload.py models np.load), so
that the native engine issues the same reads; checked against strace (tests/test_libload_model).

* jpeg, `np.asarray(PIL.Image.open(path))` (Pillow): `open(path, "rb")` (a BufferedReader of
  st_blksize bytes, one fstat), Image.open reads a 16-byte prefix (the first buffer) and
  parses the headers inside it, then the decoder seeks back to 0 and reads chunks of
  ImageFile.MAXBLOCK (64 KiB) until the image ends, which is the file's end.
* csv, `pandas.read_csv(path)`: a stat of the path, `open(path, "rb")`, then the C parser's
  reads of 256 KiB chunks until one returns nothing.
Both assume what DLIO's generators write: the JPEG headers within the first buffer, and rows
of fewer than about a million values (pandas reads wider rows in another way: not modelled).
png is read with one read of the whole file (Pillow reads each IDAT chunk on its own, which
depends on the chunks' sizes)."""

from __future__ import annotations

import numpy as np

from .loader import WholeFileReads, gather
from .npload import LoaderReads, _BufferedReader, _File

PIL_BLOCK = 65536      # PIL.ImageFile.MAXBLOCK: the decoder's reads
PIL_PREFIX = 16        # Image.open's first read, to tell the format
PANDAS_CHUNK = 262144  # pandas' C parser reads its source in chunks of 256 KiB


def jpeg_reads(size: int, blksize: int = 4096) -> LoaderReads:
    """Reads of `np.asarray(PIL.Image.open(path))` on a JPEG file of `size` bytes."""
    f = _File(size)
    fp = _BufferedReader(f, blksize)
    fp.read(PIL_PREFIX)
    fp.seek(0)
    got = 0
    while got < size:
        step = fp.read(PIL_BLOCK)
        if step == 0:
            break
        got += step
    return f.result()


def csv_reads(size: int, blksize: int = 4096) -> LoaderReads:
    """Reads of `pandas.read_csv(path)` on a csv file of `size` bytes."""
    f = _File(size)
    f.fstats += 1  # the path's stat before the open
    fp = _BufferedReader(f, blksize)
    while fp.read(PANDAS_CHUNK) > 0:
        pass
    return f.result()


class LibraryLoads:
    """The loader's reads of whole files whose model depends on the size alone."""

    def __init__(self, model) -> None:
        self.model = model
        self.cache: dict = {}

    def __call__(self, lay, blksize: int) -> WholeFileReads:
        keys = np.asarray(lay.size, dtype=np.int64).reshape(-1, 1)
        return gather(keys, lambda k: self.model(k[0], blksize),
                      self.cache.setdefault(blksize, {}))
