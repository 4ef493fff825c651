"""Sizes, durations and counts as the plan and the reader backends' notes print them."""

from __future__ import annotations


def number_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def duration_text(seconds: float) -> str:
    for unit, length in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600),
                         ("minutes", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f} {unit}"
    return f"{seconds:.3g} s"


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"
