"""From a real loader's measurements to the emulator's model of it (what `dlio-mpi
calibrate` sets) and to the words that say what was measured.

The model (docs/fidelity.md): each sample costs a reader thread reader.preprocess_cpu_time of
CPU work after its read (the workers' CPU time per sample, and the training process's other
threads' (the pin-memory thread's, which works alongside the loader), less the CPU time the
emulator's own read of the sample takes, since the emulator does that read for real); each
step costs the thread taking the batches reader.step_cpu_time of CPU work and
reader.step_wait_time of waiting on the workers for the hand-over; the loader's first epoch
starts reader.startup_time late (its worker processes starting)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .measure import BYTES, CPU, OPENS, READS, Pass


@dataclass(frozen=True)
class ReadCost:
    """What the emulator's own native engine spends reading the same samples: CPU time per
    sample (this process's, the engine's threads), and the reads per sample."""

    cpu_s: float
    bytes: float
    reads: float
    opens: float


@dataclass(frozen=True)
class LoaderModel:
    """The calibrated costs, and the measurements behind them."""

    workers: int
    batch_size: int
    in_flight: int
    samples: int             # measured, over the measured passes
    steps: int
    samples_per_second: float
    worker_cpu_s: float      # per sample: the workers' CPU time (items, collation, hand-over)
    item_cpu_s: float        # per sample: in the Dataset's __getitem__
    item_cpu_stdev_s: float
    item_wall_s: float       # per sample: a worker's wall time per sample (workers x wall / n)
    main_cpu_s: float        # per step: CPU time of the thread taking the batches
    side_cpu_s: float        # per sample: the training process's other threads' (pinning)
    handover_wait_s: float   # per step: its wait on the workers taking a batch that is there
    startup_s: float         # the fresh loader: its start to the workers' first items (mean)
    iter_s: float            # of which in iter() (the main thread starting the workers)
    item_bytes: float
    item_reads: float
    item_opens: float
    read: ReadCost
    lone_item_s: float       # the usual practice: one item made alone in one process

    @property
    def preprocess_cpu_s(self) -> float:
        return max(self.worker_cpu_s + self.side_cpu_s - self.read.cpu_s, 0.0)

    @property
    def busy_fraction(self) -> float:
        """Of the workers' wall time, the share they were on a CPU."""
        return self.worker_cpu_s / self.item_wall_s if self.item_wall_s > 0 else 0.0


def _pass_costs(p: Pass, workers: int) -> tuple[float, float, float]:
    """One warm pass's (workers' CPU per sample, the taking thread's CPU per step, the
    training process's other threads' CPU per sample). Without workers the items are made
    on the taking thread: its CPU time holds them too."""
    n = max(p.samples, 1)
    worker = p.worker_cpu_s if workers else float(p.items[:, CPU].sum()) / 1e9
    taking = p.taking_cpu_s - (0.0 if workers else worker)
    return worker / n, max(taking, 0.0) / max(p.steps, 1), max(p.main_cpu_s - p.taking_cpu_s,
                                                              0.0) / n


def derive(first: Pass, measured: list[Pass], workers: int, batch_size: int,
           in_flight: int, read: ReadCost, lone_item_s: float,
           handover_waits: np.ndarray) -> LoaderModel:
    """The model from the fresh loader's pass (`first`: its start-up), the warm passes (each
    cost the median over them: a shared host's slow moment moves one pass, not the model)
    and the paced pass's hand-over waits (their median: a wait for a batch not made yet is
    not the hand-over's)."""
    items = np.concatenate([p.items for p in measured])
    n = len(items)
    steps = sum(p.steps for p in measured)
    wall = sum(p.wall_s for p in measured)
    worker_cpu, main_step, side = (float(np.median(c)) for c in
                                   zip(*(_pass_costs(p, workers) for p in measured)))
    starts = first.worker_start_s() if workers else [0.0]
    return LoaderModel(
        workers=workers, batch_size=batch_size, in_flight=in_flight, samples=n, steps=steps,
        samples_per_second=n / wall if wall > 0 else 0.0,
        worker_cpu_s=worker_cpu, item_cpu_s=float(items[:, CPU].mean()) / 1e9,
        item_cpu_stdev_s=float(items[:, CPU].std()) / 1e9,
        item_wall_s=max(workers, 1) * wall / n, main_cpu_s=main_step, side_cpu_s=side,
        handover_wait_s=float(np.median(handover_waits)) if len(handover_waits) else 0.0,
        startup_s=float(np.mean(starts)) if workers else 0.0, iter_s=first.iter_s,
        item_bytes=float(items[:, BYTES].mean()), item_reads=float(items[:, READS].mean()),
        item_opens=float(items[:, OPENS].mean()), read=read, lone_item_s=lone_item_s)


def model_keys(m: LoaderModel) -> dict:
    """The reader keys the model sets (ours), as YAML values."""
    spread = m.item_cpu_stdev_s if m.preprocess_cpu_s > 0 else 0.0
    cpu = round(m.preprocess_cpu_s, 6)
    return {"preprocess_cpu_time": {"mean": cpu, "stdev": round(spread, 6)} if spread else cpu,
            "step_cpu_time": round(m.main_cpu_s, 6),
            "step_wait_time": round(m.handover_wait_s, 6),
            "startup_time": round(m.startup_s, 4)}


def report_lines(m: LoaderModel) -> list[str]:
    """What was measured and where the time went, for the terminal and the YAML's comments."""
    ms = 1e3
    handover = max(m.worker_cpu_s - m.item_cpu_s, 0.0)
    lines = [
        f"loader: {m.samples_per_second:,.1f} samples/s, warm and data-bound ({m.samples} "
        f"samples in {m.steps} batches of {m.batch_size}, {m.workers} worker(s), "
        f"{m.in_flight} batch(es) in flight)",
        f"per sample, in the workers: {m.item_cpu_s * ms:.3f} ms CPU in the Dataset (stdev "
        f"{m.item_cpu_stdev_s * ms:.3f}) + {handover * ms:.3f} ms collating and handing over "
        f"= {m.worker_cpu_s * ms:.3f} ms CPU, in {m.item_wall_s * ms:.3f} ms of a worker's "
        f"wall time (workers x wall / samples)",
        f"the workers' wall time: {100 * min(m.busy_fraction, 1):.0f} % on a CPU, "
        f"{100 * max(1 - m.busy_fraction, 0):.0f} % waiting (for a core, storage or the "
        f"queue)" if m.workers else
        "no workers: the training process makes every item itself",
        f"the training process: {m.main_cpu_s * ms:.3f} ms CPU per step on the thread taking "
        f"the batches (receiving, rebuilding), and {m.handover_wait_s * ms:.3f} ms waiting on "
        f"the workers for a batch that was there (its hand-over; median of a paced pass); its "
        f"other threads (pinning memory) {m.side_cpu_s * m.batch_size * ms:.3f} ms CPU per "
        f"batch, alongside the loader (in the per-sample work)",
        f"start-up: the workers' first items began {m.startup_s * ms:.1f} ms after the loader's "
        f"start (mean; {m.iter_s * ms:.1f} ms of it in iter(), starting them)",
        f"reads per sample: the Dataset {m.item_bytes:,.0f} bytes in {m.item_reads:.1f} read "
        f"calls, {m.item_opens:.2f} opens; dlio-mpi's loader model {m.read.bytes:,.0f} bytes in "
        f"{m.read.reads:.1f} read calls, {m.read.opens:.2f} opens, {m.read.cpu_s * ms:.3f} ms CPU",
        f"the usual practice (one sample made alone in one process): {m.lone_item_s * ms:.3f} "
        f"ms per sample",
    ]
    return lines
