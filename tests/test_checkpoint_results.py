"""checkpoint/results.py: a checkpoint's duration is the slowest rank's from a common start,
its bandwidth all ranks' bytes over it (MLPerf Storage's definition); the summary fields carry
DLIO's later names with GB = 2^30 B."""

from __future__ import annotations

import pytest

from dlio_mpi.checkpoint.results import GB, CheckpointRecord, gather_record, summary_fields


class Ranks:
    """Stands in for a communicator in allgather: each rank's part as given; one host name
    per rank (`hosts`)."""

    def __init__(self, parts, hosts):
        self.parts, self.hosts = parts, hosts

    def allgather(self, value):
        return list(self.hosts) if isinstance(value, str) else list(self.parts)


def test_one_hosts_checkpoint_lasts_from_the_first_start_to_the_last_end():
    s = 10**9
    parts = [(GB, s, 3 * s, 1, 10**8), (2 * GB, s + 10**8, 5 * s, 1, 3 * 10**8)]
    record = gather_record(Ranks(parts, ["a", "a"]), "save", 1, "global_epoch1_step1",
                           GB, s, 3 * s)
    assert record.bytes == 3 * GB
    assert record.seconds == pytest.approx(4.0)  # 5 s - 1 s, not rank 0's 2 s
    assert record.GB_per_second == pytest.approx(0.75)
    assert record.rank_seconds == pytest.approx((2.0, 3.9))
    assert record.syncs == 2 and record.sync_seconds == pytest.approx(0.3)
    assert record.to_json()["rank_seconds"] == {"min": 2.0, "median": pytest.approx(2.95),
                                                "max": 3.9}


def test_across_hosts_the_slowest_ranks_own_time_counts():
    s = 10**9
    parts = [(GB, 0, 2 * s, 0, 0), (GB, 100 * s, 103 * s, 0, 0)]  # clocks of two hosts
    record = gather_record(Ranks(parts, ["a", "b"]), "load", 1, "x", GB, 0, 2 * s)
    assert record.seconds == pytest.approx(3.0)


def test_summary_fields_are_means_and_population_stdevs_per_kind():
    records = [CheckpointRecord("save", 1, "a", 2 * GB, 1.0, (1.0,)),
               CheckpointRecord("save", 2, "b", 2 * GB, 4.0, (4.0,)),
               CheckpointRecord("load", 1, "a", 2 * GB, 0.5, (0.5,))]
    fields = summary_fields(records, 2 * GB)
    assert fields["checkpoint_size_GB"] == 2.0
    assert fields["save_checkpoint_io_mean_GB_per_second"] == pytest.approx((2 + 0.5) / 2)
    assert fields["save_checkpoint_io_stdev_GB_per_second"] == pytest.approx(0.75)
    assert fields["save_checkpoint_duration_mean_seconds"] == pytest.approx(2.5)
    assert fields["save_checkpoint_duration_stdev_seconds"] == pytest.approx(1.5)
    assert fields["load_checkpoint_io_mean_GB_per_second"] == pytest.approx(4.0)
    assert summary_fields(records[:2], GB).keys() == {
        "checkpoint_size_GB", "save_checkpoint_io_mean_GB_per_second",
        "save_checkpoint_io_stdev_GB_per_second", "save_checkpoint_duration_mean_seconds",
        "save_checkpoint_duration_stdev_seconds"}
