"""An example of a user's own pipeline for `dlio-mpi calibrate --dataset` and the reference
job (`--dataset example_pipeline:make_dataset`, with this folder on PYTHONPATH): an
evaluation-style image transform (decode, RGB, shorter side resized to 256, centre crop of
224, float32 CHW scaled to [0, 1]), written with Pillow and numpy. Item i is made from
files[i]."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset


class CentreCrop(Dataset):
    def __init__(self, files: list[str], side: int = 256, crop: int = 224) -> None:
        self.files, self.side, self.crop = files, side, crop

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[i]) as image:
            rgb = image.convert("RGB")
        scale = self.side / min(rgb.size)
        rgb = rgb.resize((max(self.crop, round(rgb.width * scale)),
                          max(self.crop, round(rgb.height * scale))), Image.BILINEAR)
        left, top = (rgb.width - self.crop) // 2, (rgb.height - self.crop) // 2
        rgb = rgb.crop((left, top, left + self.crop, top + self.crop))
        chw = np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1) / 255.0
        return torch.from_numpy(np.ascontiguousarray(chw)), i % 1000


def make_dataset(files: list[str]) -> Dataset:
    return CentreCrop(files)
