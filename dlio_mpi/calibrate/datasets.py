"""The training pipeline calibration and the fidelity reference job run: a torch Dataset over
a list of files (the user's own, or a built-in one) behind a real torch DataLoader set up as
DLIO's pytorch loader sets it up.

A user's Dataset is named MODULE:CALLABLE: `CALLABLE(files: list[str])` returns a torch
Dataset whose item i is made from files[i]; MODULE is imported from the current directory or
PYTHONPATH. Built-in ones (`--transform`):
- `imagenet`: the torchvision ImageNet training transform, written with Pillow and numpy
  (torchvision does not import beside the CPU torch wheel everywhere): decode, convert to RGB,
  RandomResizedCrop(224) (torchvision's parameter draw and its crop-then-bilinear-resize),
  RandomHorizontalFlip, ToTensor and Normalize to float32 CHW; the label is i mod 1000;
- `none`: the format's own load as DLIO's pytorch reader does it (np.load of the whole file,
  Pillow's decode, ...), the item the decoded sample in the shape DLIO hands to the collation
  (dataset.decoded_item): no transform.

torch is imported here: only calibration and the reference job import this module."""

from __future__ import annotations

import importlib
import math
import os
import random
import sys
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..errors import UserError
from ..formats import get_format, implemented_formats
from ..formats.base import Format
from ..readers import torch_prefetch_factor
from ..readers.base import as_item

TRANSFORMS = ("imagenet", "none")


def _names(formats: Callable[[Format], bool]) -> str:
    """The formats for which `formats` holds, by name."""
    return ", ".join(name for name in implemented_formats() if formats(get_format(name)))
IMAGENET_SIZE = 224
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)


def crop_box(width: int, height: int, rng) -> tuple[int, int, int, int]:
    """RandomResizedCrop's crop (left, top, w, h), drawn as torchvision draws it: up to 10
    tries of an area in CROP_SCALE and a log-uniform aspect ratio in CROP_RATIO, else the
    centred crop of the ratio nearest the image's."""
    area = width * height
    log_ratio = (math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*CROP_SCALE)
        ratio = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < CROP_RATIO[0]:
        w, h = width, int(round(width / CROP_RATIO[0]))
    elif in_ratio > CROP_RATIO[1]:
        w, h = int(round(height * CROP_RATIO[1])), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


class ImagenetDataset(Dataset):
    """Item i: files[i] decoded by Pillow, as torchvision's ImageNet training transform makes
    it (see the module), and its label."""

    def __init__(self, files: Sequence[str]) -> None:
        self.files = list(files)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        rng = random  # torch seeds each worker's random module (base_seed + worker id)
        with Image.open(self.files[i]) as image:
            rgb = image.convert("RGB")
        left, top, w, h = crop_box(rgb.width, rgb.height, rng)
        crop = rgb.crop((left, top, left + w, top + h)).resize(
            (IMAGENET_SIZE, IMAGENET_SIZE), Image.BILINEAR)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        pixels = np.asarray(crop, dtype=np.uint8).transpose(2, 0, 1)  # ToTensor: CHW ...
        chw = np.ascontiguousarray(pixels).astype(np.float32) / 255.0  # ... float in [0, 1]
        chw -= IMAGENET_MEAN[:, None, None]  # Normalize
        chw /= IMAGENET_STD[:, None, None]
        return torch.from_numpy(chw), i % 1000


class FormatDataset(Dataset):
    """Item i: files[i] loaded whole as DLIO's pytorch reader loads a sample of its format
    (Format.load_whole; its first sample), shaped as the item DLIO hands to the collation."""

    def __init__(self, files: Sequence[str], fmt: Format, last_axis: bool,
                 item: tuple[tuple[int, ...], str]) -> None:
        self.files, self.fmt, self.last_axis, self.item = list(files), fmt, last_axis, item

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        sample = self.fmt.library_sample(self.fmt.load_whole(self.files[i]), 0, self.last_axis)
        return torch.from_numpy(as_item(sample, *self.item))


def builtin_dataset(transform: str, files: Sequence[str], fmt: Format,
                    last_axis: bool = False,
                    item: tuple[tuple[int, ...], str] = ((), "|u1")) -> Dataset:
    """The built-in Dataset `transform` over `files` of format `fmt` (configured; UserError
    if it does not apply to the format)."""
    if transform == "imagenet":
        if not fmt.whole_file_sample:
            raise UserError(f"--transform imagenet decodes images: dataset.format is "
                            f"{fmt.name}, expected one of "
                            f"{_names(lambda f: f.whole_file_sample)} (or --transform "
                            f"none, or --dataset MODULE:CALLABLE)")
        return ImagenetDataset(files)
    if transform == "none":
        if not fmt.loads_whole_array:
            raise UserError(f"--transform none loads whole files with the format's library: "
                            f"dataset.format {fmt.name} is read by extent, not whole (formats: "
                            f"{_names(lambda f: f.loads_whole_array)}); give your own "
                            f"--dataset MODULE:CALLABLE")
        return FormatDataset(files, fmt, last_axis, item)
    raise UserError(f"--transform {transform}: expected one of {', '.join(TRANSFORMS)}")


def default_transform(fmt: Format) -> str:
    """The built-in Dataset calibration uses for format `fmt` unless told otherwise."""
    return "imagenet" if fmt.whole_file_sample else "none"


def load_callable(spec: str, option: str = "--dataset") -> Callable:
    """The callable MODULE:CALLABLE names, MODULE imported from the current directory or
    PYTHONPATH (UserError naming `option` and what went wrong)."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise UserError(f"{option} {spec}: expected MODULE:CALLABLE (a module importable from "
                        f"the current directory or PYTHONPATH, and a callable in it)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"{option} {spec}: cannot import module {module_name} from the "
                        f"current directory or PYTHONPATH ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing
        raise UserError(f"{option} {spec}: importing module {module_name} failed: "
                        f"{type(exc).__name__}: {exc}") from None
    target = module
    for part in name.split("."):
        if not hasattr(target, part):
            raise UserError(f"{option} {spec}: module {module_name} has no attribute {name}")
        target = getattr(target, part)
    if not callable(target):
        raise UserError(f"{option} {spec}: {name} is a {type(target).__name__}, not a "
                        f"callable")
    return target


def user_dataset(spec: str, files: Sequence[str]) -> Dataset:
    """The Dataset the user's MODULE:CALLABLE makes of `files`, checked: it has an item per
    file (UserError otherwise, naming the callable)."""
    make = load_callable(spec)
    try:
        dataset = make(list(files))
    except Exception as exc:  # noqa: BLE001 - the user's code failed: say so, once
        raise UserError(f"--dataset {spec}: calling it with {len(files)} file(s) failed: "
                        f"{type(exc).__name__}: {exc}") from None
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise UserError(f"--dataset {spec}: returned a {type(dataset).__name__}, expected a "
                        f"torch Dataset (with __getitem__ and __len__) whose item i is made "
                        f"from files[i]")
    if len(dataset) != len(files):
        raise UserError(f"--dataset {spec}: its Dataset has {len(dataset)} items for "
                        f"{len(files)} files; expected item i made from files[i]")
    return dataset


class EpochSampler(Sampler):
    """Yields the indices set by `start(indices)` for the next epoch, in that order (the
    job's own shard of each epoch's permutation)."""

    def __init__(self) -> None:
        self.indices: list[int] = []

    def start(self, indices: Sequence[int]) -> None:
        self.indices = [int(i) for i in indices]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def make_loader(dataset: Dataset, sampler: Sampler, batch_size: int, workers: int,
                prefetch_size: int, pin_memory: bool = True, context: str = "fork",
                worker_init_fn=None) -> DataLoader:
    """The DataLoader DLIO's pytorch loader builds: `workers` processes, prefetch_factor =
    ceil(prefetch_size / workers) (2 when 0), persistent workers, pinned memory (torch pins
    only where it finds an accelerator), drop_last."""
    extra = {}
    if workers > 0:
        extra = {"prefetch_factor": torch_prefetch_factor(prefetch_size, workers),
                 "persistent_workers": True, "multiprocessing_context": context,
                 "worker_init_fn": worker_init_fn}
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                      pin_memory=pin_memory and torch.cuda.is_available(), drop_last=True,
                      **extra)

