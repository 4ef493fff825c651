"""JPEG and PNG files (DLIO's jpeg and png): one grayscale uint8 image of the sample's dims
(dim1 rows, dim2 columns) per file, encoded by Pillow as DLIO's generators do
(`Image.fromarray(pixels).save(path, format=JPEG|PNG)`, Pillow's defaults: JPEG quality 75).
Pixels are pseudo-random values in [0, 255) from the file's seed.

DLIO ignores dataset.num_samples_per_file when writing images (one image a file) and its image
reader returns the whole image for every sample of a file: the samples of a file would all be
the same image, so num_samples_per_file other than 1 is refused (config/loader.py). A sample
is the whole file, read and decoded whole.

Sizes depend on the content (JPEG is lossy, PNG deflates): they are recorded at generation
(formats/sized.py). Reads: DLIO's reader loads with `np.asarray(PIL.Image.open(path))`; the
native engine issues Pillow's read calls for jpeg (modelled in libload.py: 64 KiB reads to
the end) and one read of the whole file for png (Pillow reads each IDAT chunk on its own,
with lseeks between); the framework engine runs Pillow itself."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .base import SampleSpec, StagedWrites
from .libload import LibraryLoads, jpeg_reads
from .sized import SizedFormat, StoredWhole, payload_values

MAGIC = {"jpeg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n"}
PIL_FORMAT = {"jpeg": "JPEG", "png": "PNG"}


def image_shape(spec: SampleSpec) -> tuple[int, int]:
    """(rows, columns) of the image of `spec` (a single dim is one row)."""
    shape = tuple(int(d) for d in spec.shape)
    return shape if len(shape) == 2 else (1, shape[0])


class ImageFormat(SizedFormat):
    """dataset.format: jpeg or png"""

    library = "PIL"

    def __init__(self, name: str) -> None:
        self.name = self.extension = name

    def check_dataset(self, ds) -> None:
        super().check_dataset(ds)
        if ds.num_samples_per_file != 1:
            raise ConfigError(f"dataset.num_samples_per_file: {ds.num_samples_per_file} with "
                              f"dataset.format {ds.format} is not implemented yet (DLIO writes "
                              "one image per file and returns it for every sample of the file, "
                              "so the samples of a file would all be the same image); "
                              "expected 1")
        if len(ds.record_dims) > 2:
            raise ConfigError(f"dataset.record_dims: {ds.format} takes at most 2 dimensions, "
                              f"got {list(ds.record_dims)}")

    def estimated_sizes(self, sample_bytes: np.ndarray, samples: int) -> np.ndarray:
        n = sample_bytes.astype(np.float64)
        if self.name == "png":  # random pixels do not deflate: a filter byte a row, framing
            return ((n + np.sqrt(n)) * 1.0025 + 70).astype(np.int64)
        return (n * 0.56 + 330).astype(np.int64)  # Pillow's quality 75 on noise

    def write(self, path: str, spec: SampleSpec, seed: int, staged: StagedWrites) -> int:
        from PIL import Image

        shape = image_shape(spec)
        image = Image.fromarray(payload_values(seed, shape[0] * shape[1]).reshape(shape))
        return self.write_bytes(path, staged,
                                lambda fp: image.save(fp, format=PIL_FORMAT[self.name]))

    def check_head(self, head: bytes) -> str:
        magic = MAGIC[self.name]
        if head.startswith(magic):
            return ""
        return f"it starts with {head[:len(magic)]!r}, not the {self.name} signature {magic!r}"

    def loader_model(self, facts, itemsize: int, samples: int) -> LibraryLoads | None:
        return LibraryLoads(jpeg_reads) if self.name == "jpeg" else None  # png: one read

    def load_whole(self, path: str) -> np.ndarray:
        from PIL import Image

        return np.asarray(Image.open(path))

    def probe(self, path: str) -> StoredWhole:
        from PIL import Image, UnidentifiedImageError

        size = self.probe_size(path)
        try:
            with Image.open(path, formats=[PIL_FORMAT[self.name]]) as image:
                bands = len(image.getbands())
                width, height = image.size
        except (UnidentifiedImageError, OSError) as exc:
            raise ValueError(f"Pillow cannot read it as {self.name} ({exc})") from None
        shape = (height, width) if bands == 1 else (height, width, bands)
        return StoredWhole(size, 0, shape, "|u1", whole_file_sample=True)
