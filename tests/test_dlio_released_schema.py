"""The released DLIO package's workload files (dlio-benchmark 2.0.0 from PyPI, copied unchanged
into tests/data/dlio_2_0_0) load and run in dlio-mpi, scaled down only by overrides: a model
named by a string, the legacy key names (model keys under `checkpoint:` included), and the keys
that package sets but never reads (accepted with a plan note)."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml

from dlio_mpi.config import ALIASES, load_config, support_notes
from dlio_mpi.formats import implemented_formats
from helpers import error_of, merged, nest, run_cli, write_yaml

RELEASED = Path(__file__).parent / "data" / "dlio_2_0_0"
NAMES = [
    "bert_v100", "cosmoflow_a100", "cosmoflow_h100", "cosmoflow_v100", "default", "dlrm",
    "megatron_deepspeed", "resnet50_a100", "resnet50_h100", "resnet50_tf", "resnet50_v100",
    "unet3d_a100", "unet3d_h100", "unet3d_v100",
]
UNREAD_NOTE = ("accepted, no effect, as in DLIO 2.0.0 (set in its dlrm.yaml, never read by its "
               "configuration loader)")


def released(name: str) -> str:
    return str(RELEASED / f"{name}.yaml")


def raw(name: str) -> dict:
    return yaml.safe_load((RELEASED / f"{name}.yaml").read_text())


def value_at(cfg, dotted: str):
    return functools.reduce(getattr, dotted.split("."), cfg)


# --------------------------------------------------------------------------- the files
def test_the_copies_are_the_released_bytes():
    record = re.findall(r"^dlio_benchmark/configs/workload/(\w+)\.yaml,sha256=([\w-]+),(\d+)$",
                        (RELEASED / "README.md").read_text(), re.M)
    assert sorted(name for name, _, _ in record) == NAMES
    assert sorted(p.stem for p in RELEASED.glob("*.yaml")) == NAMES
    for name, digest, size in record:
        data = (RELEASED / f"{name}.yaml").read_bytes()
        assert len(data) == int(size), name
        assert base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode() \
            == digest, name


@pytest.mark.parametrize("name", NAMES)
def test_every_released_file_loads_unchanged(name, tmp_path):
    cfg = load_config(released(name))
    source = raw(name)
    assert cfg.model.name == source["model"]  # the model is named by a string
    assert cfg.dataset.format == source["dataset"]["format"]
    assert cfg.dataset.record_length_bytes == source["dataset"]["record_length"]
    assert cfg.framework == source["framework"]
    again = load_config(write_yaml(tmp_path, {"workload": cfg.to_dict()}))
    assert again == cfg  # written back in the current schema, it is the same workload


@pytest.mark.parametrize("name", NAMES)
def test_validate_plans_every_released_file_or_names_its_format(name, tmp_path):
    fmt = raw(name)["dataset"]["format"]
    res = run_cli(["validate", released(name)], cwd=tmp_path)
    if fmt in implemented_formats():
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith(f"workload        {raw(name)['model']}: {fmt}, ")
    else:
        assert res.returncode == 2, res.stdout
        assert res.stderr == (f"dlio-mpi: error: dataset.format: '{fmt}' is not implemented "
                              f"yet in dlio-mpi; implemented: "
                              f"{', '.join(implemented_formats())}\n")
    assert list(tmp_path.iterdir()) == []  # validate touches no storage


# --------------------------------------------------------------------------- the model's name
@pytest.mark.parametrize("name,expected", [("unet3d", "unet3d"), (3, "3")])
def test_a_model_named_by_a_string_is_model_name(name, expected, tmp_path):
    cfg = load_config(write_yaml(tmp_path, {"model": name, "checkpoint": {"model_size": 7}}))
    assert cfg.model.name == expected
    assert cfg.model.model_size_bytes == 7  # the model's keys from checkpoint: join it
    assert cfg.model.num_layers == -1 and cfg.model.type is None  # the rest: defaults


def test_a_model_that_is_neither_a_name_nor_a_mapping_is_refused(tmp_path):
    assert error_of(write_yaml(tmp_path, {"model": ["unet3d"]})) == \
        "model: expected a mapping of keys, got ['unet3d']"
    assert error_of(write_yaml(tmp_path, {"model": True})) == \
        "model: expected a mapping of keys, got True"
    moved = {"model": ["unet3d"], "checkpoint": {"model_size": 1}}
    assert error_of(write_yaml(tmp_path, moved)) == ("checkpoint.model_size: is read as "
                                                     "model.model_size_bytes, but model is "
                                                     "['unet3d'], not a mapping of keys")


@pytest.mark.parametrize("source", [released("unet3d_h100"), "unet3d_h100"])
def test_model_override_by_name_works_in_both_schemas(source):
    cfg = load_config(source, ["++workload.model=resnet50"])
    assert cfg.model.name == "resnet50"
    assert cfg.model.model_size_bytes == 499153191  # the other model keys are kept
    assert load_config(source, ["model={name: x}"]).model.model_size_bytes == 10240  # whole
    message = error_of(source, ["++workload.model=a", "model.name=b"])
    assert message == "overrides '++workload.model=a' and 'model.name=b' both set model.name; " \
                      "keep one"


# --------------------------------------------------------------------------- legacy names
# every ALIASES entry: (legacy key, a value, the canonical key, its typed value)
LEGACY = [
    ("data_reader", {"batch_size": 3}, "reader.batch_size", 3),
    ("dataset.record_length", 4096, "dataset.record_length_bytes", 4096),
    ("dataset.record_length_stdev", 512, "dataset.record_length_bytes_stdev", 512),
    ("dataset.record_length_resize", 1024, "dataset.record_length_bytes_resize", 1024),
    ("model.model_size", 123, "model.model_size_bytes", 123),
    ("checkpoint.model_size", 123, "model.model_size_bytes", 123),
    ("checkpoint.optimization_groups", [5, 6], "model.optimization_groups", (5, 6)),
    ("checkpoint.num_layers", 4, "model.num_layers", 4),
    ("checkpoint.layer_parameters", [7, 8], "model.layer_parameters", (7, 8)),
    ("checkpoint.tensor_parallelism", 2, "model.parallelism.tensor", 2),
    ("checkpoint.pipeline_parallelism", 2, "model.parallelism.pipeline", 2),
]


def test_every_legacy_name_has_a_case_here():
    assert sorted(legacy for legacy, *_ in LEGACY) == sorted(ALIASES)
    for legacy, _, canonical, _ in LEGACY:
        assert canonical.startswith(ALIASES[legacy])


@pytest.mark.parametrize("legacy,value,canonical,typed", LEGACY)
def test_legacy_key_in_a_file_is_read_as_its_canonical_key(legacy, value, canonical, typed,
                                                           tmp_path):
    cfg = load_config(write_yaml(tmp_path, merged({"model": "m"}, nest(legacy, value))))
    assert value_at(cfg, canonical) == typed


@pytest.mark.parametrize("legacy,value,canonical,typed", LEGACY)
def test_legacy_key_as_override_works_in_both_schemas(legacy, value, canonical, typed):
    if isinstance(value, dict):  # a section: one key of it
        (leaf, value), = value.items()
        legacy, typed = f"{legacy}.{leaf}", value
    text = f"++workload.{legacy}={json.dumps(value)}"
    for source in (released("unet3d_h100"), "unet3d_h100"):
        assert value_at(load_config(source, [text]), canonical) == typed, source


@pytest.mark.parametrize("legacy,value,canonical,typed", LEGACY)
def test_legacy_key_given_with_its_canonical_key_is_refused(legacy, value, canonical, typed,
                                                            tmp_path):
    key = ALIASES[legacy]
    both = merged(nest(legacy, value), nest(key, value))
    message = error_of(write_yaml(tmp_path, both))
    assert message == f"both '{legacy}' (legacy name of '{key}') and '{key}' are given; " \
                      f"keep '{key}'"


def test_model_keys_given_under_checkpoint_and_model_are_refused(tmp_path):
    both = {"model": {"model_size": 1}, "checkpoint": {"model_size": 2}}
    assert error_of(write_yaml(tmp_path, both)) == (
        "both 'model.model_size' and 'checkpoint.model_size' are given, legacy names of "
        "'model.model_size_bytes'; keep one, preferably 'model.model_size_bytes'")
    both = {"model": {"num_layers": 4}, "checkpoint": {"num_layers": 4}}
    assert error_of(write_yaml(tmp_path, both)) == (
        "both 'checkpoint.num_layers' (legacy name of 'model.num_layers') and "
        "'model.num_layers' are given; keep 'model.num_layers'")
    three = {"model": {"model_size": 1, "model_size_bytes": 1}, "checkpoint": {"model_size": 1}}
    assert error_of(write_yaml(tmp_path, three)) == (
        "'model.model_size', 'checkpoint.model_size' (legacy names of 'model.model_size_bytes') "
        "and 'model.model_size_bytes' are given; keep 'model.model_size_bytes'")


def test_an_override_of_a_legacy_key_replaces_the_value_read_from_the_file():
    # unet3d_h100 gives checkpoint.model_size (2.0.0) or model.model_size (ours): either way
    # the override sets the one key
    for source in (released("unet3d_h100"), "unet3d_h100"):
        for key in ("checkpoint.model_size", "model.model_size", "model.model_size_bytes"):
            cfg = load_config(source, [f"++workload.{key}=4096"])
            assert cfg.model.model_size_bytes == 4096, (source, key)


def test_released_megatron_checkpoint_keys_size_its_checkpoint():
    from dlio_mpi.checkpoint.sizing import checkpoint_layout

    cfg = load_config(released("megatron_deepspeed"))
    m = cfg.model
    assert (m.model_size_bytes, m.num_layers) == (30102, 44)
    assert m.optimization_groups == (1009254400, 865075200, 793600)
    assert m.layer_parameters == (129761280, 20971520)
    assert m.type is None and cfg.checkpoint.type == "all_ranks"  # which ranks, not model.type
    # one writer (rank 0): the flat model, the optimizer groups (a, b and their sum), and the
    # layer tensors once per layer, as DLIO 2.0.0 writes them
    layout = checkpoint_layout(cfg, 1)
    assert layout.total_bytes == 30102 + 3 * 1875123200 + 44 * (129761280 + 20971520)


@pytest.mark.parametrize("given,expected", [
    ({"checkpoint": {"num_layers": 3}}, (3, (17371, 24740228))),
    ({"checkpoint": {"layer_parameters": [10, 20]}}, (1, (10, 20))),
    ({"checkpoint": {"num_layers": 3, "layer_parameters": [10, 20]}}, (3, (10, 20))),
    ({"checkpoint": {"num_layers": 3}, "model": {"layer_parameters": [10]}}, (3, (10,))),
    ({"checkpoint": {"layer_parameters": [10]}, "model": {"num_layers": 2}}, (2, (10,))),
    ({"model": {"num_layers": 3}}, (3, ())),  # ours: a transformer by formula
    ({}, (-1, ())),
])
def test_released_layer_keys_take_dlio_2s_default_for_the_other(given, expected, tmp_path):
    cfg = load_config(write_yaml(tmp_path, {"model": "m", **given}))
    assert (cfg.model.num_layers, cfg.model.layer_parameters) == expected


@pytest.mark.parametrize("overrides,expected", [
    (["++workload.checkpoint.num_layers=3"], (3, (17371, 24740228))),
    (["++workload.checkpoint.layer_parameters=[10]"], (1, (10,))),
    (["++workload.checkpoint.num_layers=3", "model.layer_parameters=[10]"], (3, (10,))),
    (["model.layer_parameters=[10]", "++workload.checkpoint.num_layers=3"], (3, (10,))),
    (["model.num_layers=3"], (3, ())),
])
def test_released_layer_keys_as_overrides_take_the_same_defaults(overrides, expected):
    for source in (released("unet3d_h100"), "unet3d_h100"):
        cfg = load_config(source, overrides)
        assert (cfg.model.num_layers, cfg.model.layer_parameters) == expected, source


# --------------------------------------------------------------------------- keys never read
UNREAD = [
    ("workflow.do_eval", True, "workflow.do_eval=true"),
    ("dataset.eval_num_samples_per_file", 91681240,
     "dataset.eval_num_samples_per_file=91681240"),
    ("train.total_eval_steps", 2048, "train.total_eval_steps=2048"),
    ("evaluation.steps_between_evals", 16384, "evaluation.steps_between_evals=16384"),
]


def test_keys_dlio_2_never_reads_are_noted_and_do_nothing(tmp_path):
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.plan.render import describe_plan

    cfg = load_config(released("dlrm"))
    note = f"{', '.join(shown for *_, shown in UNREAD)}: {UNREAD_NOTE}"
    assert support_notes(cfg) == [note]
    plan = derive_plan(cfg, 2)
    assert note in plan.notes and f"note            {note}" in describe_plan(plan, cfg)
    assert cfg.workflow.evaluation is False  # do_eval is not workflow.evaluation
    # without them: the same plan, but for the note
    without = raw("dlrm")
    for key, *_ in UNREAD:
        section, leaf = key.split(".")
        del without[section][leaf]
    plain = derive_plan(load_config(write_yaml(tmp_path, without)), 2)
    assert (plain.steps_per_epoch, plain.eval_steps_per_epoch, plain.bytes_per_epoch) == (
        plan.steps_per_epoch, plan.eval_steps_per_epoch, plan.bytes_per_epoch)
    assert plain.notes == tuple(n for n in plan.notes if n != note)


@pytest.mark.parametrize("key,value,shown", UNREAD)
def test_each_key_dlio_2_never_reads_is_accepted_with_the_note(key, value, shown):
    cfg = load_config("demo", [f"++workload.{key}={json.dumps(value)}"])
    assert value_at(cfg, key) == value
    assert support_notes(cfg) == [f"{shown}: {UNREAD_NOTE}"]


@pytest.mark.parametrize("key,bad", [("workflow.do_eval", "maybe"),
                                     ("train.total_eval_steps", "many")])
def test_keys_dlio_2_never_reads_are_still_typed(key, bad):
    assert error_of("demo", [f"{key}={bad}"]).startswith(f"{key}: expected ")


# --------------------------------------------------------------------------- a released file runs
def test_released_unet3d_runs_on_two_ranks_scaled_down_by_overrides(tmp_path):
    overrides = {
        "workflow.generate_data": "True",
        "dataset.data_folder": tmp_path / "data",
        "output.folder": tmp_path / "out",
        "checkpoint.checkpoint_folder": tmp_path / "checkpoints",
        "dataset.num_files_train": 28,  # 14 per rank: 2 steps of the file's batch of 7
        "dataset.record_length": 4096,  # the legacy names, as DLIO 2.0.0 users write them
        "dataset.record_length_stdev": 0,
        "train.epochs": 1,
        "train.computation_time": 0.01,
        "checkpoint.checkpoint_after_epoch": 1,
        "checkpoint.model_size": 4096,
    }
    res = run_cli(["run", released("unet3d_h100"),
                   *(f"++workload.{k}={v}" for k, v in overrides.items())], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["dlio_mpi"]["steps_per_epoch"] == 2
    assert summary["dlio_mpi"]["batch_size"] == 7 and summary["num_files_train"] == 28
    metric = summary["metric"]
    assert len(metric["train_au_percentage"]) == 1
    assert metric["train_bytes_read"] == 2 * 2 * 7 * 64 * 64  # steps x ranks x batch x sample
    # the checkpoint after epoch 1: rank 0 writes the flat model of checkpoint.model_size bytes
    written = sorted((tmp_path / "checkpoints").glob("*/*.pt"))
    assert [(p.name, p.stat().st_size) for p in written] == [("model_states-0.pt", 4096)]
    resolved = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert resolved["workload"]["model"]["name"] == "unet3d"
