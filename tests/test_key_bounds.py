"""Every size, rate, time and count key has both bounds, and every value is either accepted
within them or refused with one message naming the key (issue 30).

The walk goes over the whole schema: for each numeric key, on a workload where every optional
section is present (so that each key acts), it tries 0, -1, a huge value, a wrong type and
the values just past either bound, through what `dlio-mpi validate` runs (the configuration's
loading and the derived plan, the same code `run` runs before any I/O)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from dlio_mpi.config import load_config
from dlio_mpi.config.schema import Config, Rule
from dlio_mpi.errors import UserError

NUMERIC = ("int", "number", "float", "ints", "timespec")


def numeric_keys(cls: type = Config, path: str = "") -> list[tuple[str, Rule]]:
    keys = []
    for f in fields(cls):
        rule, where = f.metadata["rule"], f"{path}.{f.name}" if path else f.name
        if rule.kind == "section":
            keys += numeric_keys(rule.section, where)
        elif rule.kind in NUMERIC:
            keys.append((where, rule))
    return keys


def base(tmp_path) -> list[str]:
    """The demo with every optional section present, checkpoints asynchronous and drained."""
    return [f"dataset.data_folder={tmp_path / 'data'}", f"output.folder={tmp_path / 'out'}",
            "workflow.checkpoint=true", "checkpoint.async_write=true",
            f"checkpoint.checkpoint_folder={tmp_path / 'ck'}",
            f"checkpoint.drain={{to: {tmp_path / 'pfs'}}}", "checkpoint.ksm={}",
            f"storage.stage_in={{to: {tmp_path / 'bb'}}}",
            f"reader.cache={{folder: {tmp_path / 'cache'}}}", "storage.lustre={}",
            "dataset.record_length_bytes_stdev=0"]


def validate(overrides: list[str]) -> str | None:
    """What validate says: None when it accepts, else its message."""
    from dlio_mpi.plan.derive import derive_plan

    try:
        derive_plan(load_config("demo", overrides), 2)
    except UserError as exc:
        return str(exc)
    return None


def probes(rule: Rule) -> list:
    values = [0, -1, 10**30 if rule.kind in ("int", "ints") else 1e300, "x"]
    for bound, step in ((rule.minimum, -1), (rule.maximum, 1)):
        if bound is not None:
            values += [bound, bound + step if rule.kind in ("int", "ints") else bound * 1.5
                       + step]
    return [f"[{v}]" if rule.kind == "ints" and not isinstance(v, str) else v for v in values]


def inside(rule: Rule, value) -> bool:
    """Whether `value` is one the rule documents as accepted (its kind, within its bounds,
    or the key's unset sentinel)."""
    if isinstance(value, str) and value.startswith("["):
        value = float(value[1:-1])
    if isinstance(value, str):
        return False
    if rule.unset is not None and value == rule.unset:
        return True
    if rule.choices:
        return value in rule.choices
    low = rule.minimum if rule.minimum is not None else 0  # times are never negative
    return low <= value <= rule.maximum


KEYS = numeric_keys()


def test_the_walk_covers_the_schema():
    assert len(KEYS) > 70
    assert {"checkpoint.drain.buffer_bytes", "checkpoint.snapshot_bytes_per_second",
            "train.epochs", "reader.prefetch_size"} <= {k for k, _ in KEYS}


@pytest.mark.parametrize(("key", "rule"), KEYS, ids=[k for k, _ in KEYS])
def test_every_numeric_key_has_both_bounds(key, rule):
    if rule.choices:
        return  # a closed set of values
    assert rule.maximum is not None, f"{key}: no upper bound"
    assert rule.minimum is not None or rule.kind == "timespec", f"{key}: no lower bound"


@pytest.mark.parametrize(("key", "rule"), KEYS, ids=[k for k, _ in KEYS])
def test_every_value_is_accepted_within_the_bounds_or_refused_naming_the_key(tmp_path, key,
                                                                             rule):
    common = base(tmp_path)
    assert validate(common) is None  # the base itself is valid
    for value in probes(rule):
        said = validate([*common, f"{key}={value}"])
        if said is None:
            assert inside(rule, value), f"{key}={value} accepted outside its bounds"
        else:
            assert key in said, f"{key}={value}: the message does not name it: {said}"
            assert "\n" not in said, f"{key}={value}: more than one line: {said}"
