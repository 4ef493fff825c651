"""What one rank writes of one checkpoint, whatever the layout sizes it (sizing.py's
DeepSpeed files, dcp_layout.py's DCP files)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankShard:
    """The files one rank writes for one checkpoint: (name without folder, bytes) in write order."""

    rank: int
    files: tuple[tuple[str, int], ...]

    @property
    def nbytes(self) -> int:
        """Bytes this rank writes."""
        return sum(size for _, size in self.files)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.files)
