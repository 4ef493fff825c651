"""Which of the storage and the emulator limits a phase: checkpoint saves and restores, data
generation.

A rank's time is split into the storage's calls, timed around each call (writes, reads and
fsync in the C core; open, close, rename, syncfs around them), and the emulator's (the rest:
making or checking bytes, encoding, planning, barriers, Python)."""

from __future__ import annotations

EMULATOR_LIMIT = 0.10  # a phase whose emulator's share is above this is limited by it


def limited_by(emulator_share: float) -> str:
    """Which of the two limits a phase whose emulator's share is `emulator_share`."""
    return "emulator" if emulator_share > EMULATOR_LIMIT else "storage"


def split_of(own_ns: int, storage_ns: int) -> dict:
    """A rank's phase of `own_ns` split into the storage's calls (`storage_ns`) and the
    emulator's time, and which of the two limits it."""
    storage = min(max(storage_ns, 0), own_ns)
    share = (own_ns - storage) / own_ns if own_ns > 0 else 0.0
    return {"storage_seconds": storage / 1e9, "emulator_seconds": (own_ns - storage) / 1e9,
            "emulator_share": round(share, 6),
            "limited_by": limited_by(share)}


def verdict_text(split: dict) -> str:
    """The words a line of output gives a split."""
    return (f"the storage's calls {split['storage_seconds']:.3f} s, the emulator's "
            f"{split['emulator_seconds']:.3f} s ({100 * split['emulator_share']:.1f} %"
            + (": limited by the emulator)" if split["limited_by"] == "emulator" else ")"))
