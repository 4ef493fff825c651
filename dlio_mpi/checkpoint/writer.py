"""The checkpoint writers' protocol: what the checkpointer knows of a writer (file_per_rank,
shared, pt_save), every hook declared with its default, and what a save or load moved."""

from __future__ import annotations

from dataclasses import dataclass

from .sizing import RankShard


@dataclass
class IoStats:
    """What one rank's save or load of one checkpoint did."""

    bytes: int = 0
    files: int = 0
    calls: int = 0
    syncs: int = 0
    sync_ns: int = 0
    verified: int = 0

    def add(self, stats: dict) -> None:
        self.bytes += stats["bytes"]
        self.calls += stats["calls"]
        self.syncs += stats["syncs"]
        self.sync_ns += stats["sync_ns"]
        self.verified += stats["verified"]
        self.files += 1


class CheckpointWriter:
    """Saves and loads one rank's share of each checkpoint."""

    collective: bool = False  # save and load are collective calls: every rank makes them

    def allocate(self, shard: RankShard) -> None:
        """Made once before the first save, outside its time (pt_save's tensors, as DLIO
        allocates them at start); nothing by default."""
        return None

    def file_names(self, shards: list[RankShard]) -> list[str]:
        """The files of one checkpoint, for every rank's `shards`."""
        raise NotImplementedError

    def save(self, checkpoint: int, checkpoint_id: str, shard: RankShard) -> IoStats:
        raise NotImplementedError

    def load(self, checkpoint: int, checkpoint_id: str, shard: RankShard,
             drop_cache: bool = False) -> IoStats:
        raise NotImplementedError
