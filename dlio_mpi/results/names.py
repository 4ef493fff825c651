"""The names of what a run writes in its output folder: written by run.py and results/folder.py,
read back by `dlio-mpi report` (report/), which must not import MPI."""

import functools
import math
import re
import time

from ..storage.ownership import LOCK_NAME, TMP_MARK

SUMMARY = "summary.json"
PER_EPOCH_STATS = "per_epoch_stats.json"
CONFIG = "config.yaml"
RESULTS_MANIFEST = "dlio_mpi_results.json"  # what the run wrote, for the next run to recognise
ACCESS_LOG = "access_log"
REPORT = "report"  # dlio-mpi report's plots of the results
REPORT_MANIFEST = "dlio_mpi_report.json"  # in REPORT: what the report wrote
INTERVAL_STATS = "interval_stats.json"  # output.stats_interval's time series
# what a run writes besides its log (output.log_file may not take these names)
RESERVED = (SUMMARY, PER_EPOCH_STATS, CONFIG, RESULTS_MANIFEST, ACCESS_LOG, REPORT,
            INTERVAL_STATS, LOCK_NAME)
# DLIO's RANK_output.json and MLPerf's fork's RANK_per_epoch_stats.json (results/per_rank.py)
PER_RANK_NAME = re.compile(r"\d+_(output|per_epoch_stats)\.json")
# output.trace's files (metrics/trace.py writes trace_rank<R>.json.gz; report reads both)
TRACE_NAME = re.compile(r"trace_rank(\d+)\.json(\.gz)?")
# what is_written_name refuses, for the messages of output.log_file and hydra.output_subdir
WRITTEN_TEXT = (f"{', '.join(RESERVED)}, RANK_output.json, RANK_per_epoch_stats.json, "
                f"trace_rankR.json[.gz] and names holding {TMP_MARK} (the run's temporaries)")


def is_written_name(name: str) -> bool:
    """Whether a run writes, or may write, a file or folder of this name in output.folder
    besides its log: what output.log_file and hydra.output_subdir may not be named."""
    return (name in RESERVED or PER_RANK_NAME.fullmatch(name) is not None
            or TRACE_NAME.fullmatch(name) is not None or TMP_MARK in name)


def iso_time(seconds: float) -> str:
    """A wall-clock time (seconds since the epoch) as DLIO's result files write it: local
    time to the microsecond."""
    return _whole_second(math.floor(seconds)) + f".{int(seconds % 1 * 1e6):06d}"


@functools.lru_cache(maxsize=1024)
def _whole_second(seconds: int) -> str:
    # results of many short epochs name the same seconds many times (the ranks' starts and
    # ends, in three files): strftime is most of iso_time's cost
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))
