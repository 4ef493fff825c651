"""Timing the accelerator's share of a training step: a user's torch module trained on one
batch of the Dataset's items on the local device (the batch copied from pinned host memory,
forward, loss, backward, optimizer step; bf16 autocast on CUDA), each step waited for
(torch.cuda.synchronize) so that it is timed whole, as the fidelity reference's step. The
emulator stands this time in by a wait (train.computation_time): a GPU step costs the host
no CPU beyond launching it.

torch is imported here: only calibration and the fidelity reference job import this module."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import UserError
from .datasets import load_callable

DEVICES = ("cpu", "cuda")


def check_device(device: str) -> None:
    """Refuse a device this host does not have (one message, before any work)."""
    if device not in DEVICES:
        raise UserError(f"--device {device}: expected one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch finds no CUDA device on this host (torch "
                        f"{torch.__version__}, built {'with' if torch.version.cuda else 'without'}"
                        " CUDA); run calibration on the GPU host, or time the step there and "
                        "give it with --compute-time SECONDS")


def load_model(spec: str) -> torch.nn.Module:
    """The module MODULE:CALLABLE returns (called without arguments), checked."""
    make = load_callable(spec, "--model")
    try:
        model = make()
    except Exception as exc:  # noqa: BLE001 - the user's code failed: say so, once
        raise UserError(f"--model {spec}: calling it failed: {type(exc).__name__}: {exc}") \
            from None
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"--model {spec}: returned a {type(model).__name__}, expected a "
                        f"torch.nn.Module")
    return model


@dataclass(frozen=True)
class StepTiming:
    """A training step's timing on one device."""

    device: str             # its name (torch.cuda.get_device_name, or "cpu")
    step_seconds: float     # median wall time of the timed steps
    steps: int


def _inputs(batch):
    """(model input, labels or None) of a collated batch: a tensor, or (input, labels, ...)."""
    if isinstance(batch, (list, tuple)):
        labels = batch[1] if len(batch) > 1 and torch.is_tensor(batch[1]) else None
        return batch[0], labels
    return batch, None


def _loss(output: torch.Tensor, labels) -> torch.Tensor:
    if labels is not None and output.dim() == 2 and labels.dim() == 1:
        return torch.nn.functional.cross_entropy(output.float(), labels % output.shape[1])
    return output.float().square().mean()


def time_training_step(model: torch.nn.Module, batch, device: str, steps: int = 10,
                       warmup: int = 3, clock: Callable[[], float] = time.perf_counter
                       ) -> StepTiming:
    """Train `model` on `batch` (a collated batch of the Dataset) on `device`: `warmup` steps,
    then `steps` timed ones, each waited for; their median."""
    model = model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    cuda = device == "cuda"
    host, host_labels = _inputs(batch)
    if cuda:  # the DataLoader's pin_memory: the copy to the device is asynchronous
        host = host.pin_memory()

    def step() -> None:
        inputs = host.to(device, non_blocking=True)
        labels = host_labels.to(device, non_blocking=True) if host_labels is not None else None
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = _loss(model(inputs), labels)
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = clock()
        step()
        times.append(clock() - start)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    return StepTiming(name, float(sorted(times)[len(times) // 2]), steps)
