"""checkpoint.content: what each 4 KiB granule of a checkpoint holds, as the C core's
checkpoint stream takes it (csrc/dio_ckpt_stream.c, dio_content).

By default (both ratios 1) every granule is fresh pseudo-random bytes: nothing compresses and
no two granules of a job are equal. A compression ratio R keeps round(4096 / R) random bytes
of each granule and zeros the rest, so that zstd and lz4 (per record or whole file) keep
about 1/R of it; a deduplication ratio D makes granule g of a file (a rank's share of a shared
file) equal to granule g mod ceil(G / D), G the file's granules: G / ceil(G / D) ~ D of its
granules are duplicates, a file's length / D apart, beyond a compressor's window."""

from __future__ import annotations

import math

GRANULE = 4096
HEAD = 64  # bytes of each granule a restore compares: kept random whatever R


def core_content(content, nbytes: int) -> tuple[int, int] | None:
    """The C core's content (random bytes of each granule, 0 for all; granules before one
    repeats, 0 for none) of a file of `nbytes` under checkpoint.content `content` (None or
    both ratios 1: the fresh stream, None)."""
    if content is None or (content.compression_ratio == 1 and content.dedup_ratio == 1):
        return None
    random_bytes = 0
    if content.compression_ratio > 1:
        random_bytes = max(HEAD, round(GRANULE / content.compression_ratio))
    unique = 0
    if content.dedup_ratio > 1:
        unique = max(1, math.ceil(math.ceil(nbytes / GRANULE) / content.dedup_ratio))
    return random_bytes, unique
