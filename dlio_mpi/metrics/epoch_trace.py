"""What one rank measured in one epoch, as the step loop recorded it: per step six clock
stamps and the bytes and reads of its batch (the step records; EpochTrace.stamps holds their
first six columns), per request its latency (and, with output.trace, its start, thread and
bytes). Everything reported about time is derived from these; the readers fill them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class RequestTrace:
    """Per request of an epoch, for output.trace: when its read began (CLOCK_MONOTONIC ns),
    the reader thread that served it (-1: the step loop's own thread) and the bytes it
    transferred; its latency is the backend's lat_ns."""

    start_ns: np.ndarray
    thread: np.ndarray
    nread: np.ndarray

    @staticmethod
    def empty(requests: int) -> RequestTrace:
        """Zeroed, and its pages faulted in (np.full writes them; np.zeros would not)."""
        return RequestTrace(*(np.full(requests, 0, dtype=np.int64) for _ in range(3)))

    def head(self, requests: int) -> RequestTrace:
        """A copy of the first `requests` entries."""
        return RequestTrace(self.start_ns[:requests].copy(), self.thread[:requests].copy(),
                            self.nread[:requests].copy())


# Columns of the step records a reader's run_steps returns (CLOCK_MONOTONIC ns, then bytes and
# reads); EpochTrace.stamps holds the first six.
START, READY, GOT, DEADLINE, COMPUTED, SYNCED, BYTES, OPS = range(8)


@dataclass
class EpochTrace:
    """What one rank measured in one epoch.

    Per step (a row of `stamps`): START when it began waiting for its batch (the previous
    step's end), READY when the engine had the batch complete, GOT when the loop held it (its
    host work, reader.step_cpu_time and step_wait_time, then the compute, start), DEADLINE
    when the planned compute ends (it started at DEADLINE - planned), COMPUTED when the
    compute wait returned (the arrival at the synchronisation), SYNCED when the
    synchronisation returned."""

    epoch: int
    block_start_ns: int
    block_end_ns: int
    stamps: np.ndarray         # (steps, 6) int64
    planned_compute_ns: np.ndarray
    step_bytes: np.ndarray     # bytes storage returned for each step's batch
    step_read_ops: np.ndarray  # read calls for each step's batch
    payload_bytes: int         # sample bytes the batches delivered (headers etc. excluded)
    opens: int                 # file opens, closes and fstats of the epoch
    closes: int
    stats: int
    requests: int
    lat_ns: np.ndarray         # per request
    sample_ids: np.ndarray     # what this rank consumed, in order
    synchronised: bool         # a per-step barrier ran (training) or not (evaluation)
    # checkpoints that ended a block inside the epoch: (after step, start ns, end ns)
    pauses: list[tuple[int, int, int]] = field(default_factory=list)
    # per request, with output.trace and a backend that records it (readers.base)
    request_trace: RequestTrace | None = None
    # reader.cache: this rank's cache figures of the epoch (cache_tier.epoch_cache)
    cache: dict | None = None
    # the loader's modelled costs the reader spent (the native engine's): the CPU time of
    # reader.preprocess_cpu_time, the wall time it took, reader.startup_time's wait
    preprocess_cpu_ns: int = 0
    preprocess_wall_ns: int = 0
    loader_startup_ns: int = 0

    @property
    def steps(self) -> int:
        return len(self.stamps)

    @property
    def pause_ns(self) -> int:
        """Time in checkpoints between the epoch's blocks of steps."""
        return sum(end - start for _, start, end in self.pauses)

    @property
    def block_seconds(self) -> float:
        """The epoch's blocks of steps together: from the first step's start to the last
        step's end, less the checkpoints between blocks (DLIO times each block apart)."""
        return (self.block_end_ns - self.block_start_ns - self.pause_ns) / 1e9

    def column(self, name: int) -> np.ndarray:
        return self.stamps[:, name]

    @property
    def wait_ns(self) -> np.ndarray:
        return self.column(GOT) - self.column(START)

    @property
    def host_ns(self) -> np.ndarray:
        """The training process's work taking each batch (reader.step_*_time): from the
        batch in hand to the compute's start."""
        return self.column(DEADLINE) - self.planned_compute_ns - self.column(GOT)

    @property
    def compute_ns(self) -> np.ndarray:
        return self.column(COMPUTED) - (self.column(DEADLINE) - self.planned_compute_ns)

    @property
    def sync_ns(self) -> np.ndarray:
        return self.column(SYNCED) - self.column(COMPUTED)

    @property
    def stall_ns(self) -> np.ndarray:
        """Time the step waited for storage: from its start until its batch was complete."""
        return np.maximum(self.column(READY) - self.column(START), 0)

    @property
    def loop_ns(self) -> np.ndarray:
        """The emulator's own time between the batch being there and the compute starting."""
        return self.column(GOT) - np.maximum(self.column(READY), self.column(START))

    @property
    def overshoot_ns(self) -> np.ndarray:
        """How late the compute wait returned past its deadline."""
        return np.maximum(self.column(COMPUTED) - self.column(DEADLINE), 0)
