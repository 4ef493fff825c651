"""The limits a plan is checked against: what the C engine and the sample ids can address, and
what drawn sample shapes cost in memory."""

from __future__ import annotations

MAX_FILE_BYTES = 2**62  # the C engine refuses offsets past INT64_MAX / 2 (csrc/dio_engine.c)

MAX_SAMPLES = 2**62     # sample ids are int64 everywhere

MAX_PATH_BYTES = 4095   # the C engine formats file names into 4096-byte buffers (PATH_MAX_LEN)

SHAPE_BYTES_PER_FILE = 8  # drawn sample shapes: two int32 per file, on every rank

CHECKPOINT_BLOCK = 64 << 20  # the C core's and MPI-IO's checkpoint block (dio_shard_chunk)

# rank 0's record of one rank's epoch (metrics.summary.EpochRecord with its latency
# histogram of ~700 bins): 9.8 KiB measured with tracemalloc, rounded up
EPOCH_RECORD_BYTES = 12 << 10

CACHE_FILL_BUFFER = 8 << 20  # a cache fill's copy buffer, per engine thread (FILL_BUF)
