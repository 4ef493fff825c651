"""Configuration: shipped workloads, DLIO aliases, overrides, validation messages, TimeSpec."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml

from dlio_mpi.config import (
    ALIASES,
    Config,
    ConfigError,
    TimeSpec,
    list_workloads,
    load_config,
)
from dlio_mpi.config.timespec import parse_timespec

SHIPPED = {
    "bert_v100", "cosmoflow_a100", "cosmoflow_h100", "cosmoflow_v100", "default", "demo", "dlrm",
    "llama_405b", "llama_70b", "llama_70b_zero3", "llama_7b", "llama_7b_zero3", "llama_8b_zero3",
    "megatron_deepspeed_LLNL", "resnet50_a100", "resnet50_h100", "resnet50_tf", "resnet50_v100",
    "unet3d_a100", "unet3d_h100", "unet3d_v100",
}


def write_yaml(tmp_path: Path, data, name: str = "w.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def error_of(source: str, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(source, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- shipped workloads
def test_list_workloads_has_the_shipped_set():
    assert set(list_workloads()) == SHIPPED


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_workload_loads_and_round_trips(name, tmp_path):
    cfg = load_config(name)
    assert isinstance(cfg, Config)
    assert cfg == load_config(f"workload={name}")
    again = load_config(write_yaml(tmp_path, {"workload": cfg.to_dict()}))
    assert again == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_shipped_values_follow_dlio():
    unet = load_config("unet3d_h100")
    assert (unet.framework, unet.dataset.format, unet.dataset.num_files_train) == ("pytorch",
                                                                                   "npz", 168)
    assert unet.dataset.record_length_bytes == 146600628
    assert unet.dataset.record_length_bytes_stdev == 68341808
    assert unet.dataset.record_length_bytes_resize == 2097152
    assert unet.model.model_size_bytes == 499153191  # from the legacy key model.model_size
    assert unet.train.computation_time == TimeSpec.constant(0.323)
    assert (unet.reader.batch_size, unet.reader.read_threads) == (7, 4)
    assert (unet.reader.file_shuffle, unet.reader.sample_shuffle) == ("seed", "seed")
    assert unet.checkpoint.checkpoint_after_epoch == 5
    assert load_config("unet3d_v100").reader.batch_size == 4
    assert load_config("resnet50_a100").dataset.record_length_bytes == 114660.07
    assert load_config("cosmoflow_a100").metric.au == 0.70
    default = load_config("default")
    assert default.dataset.record_length_bytes == 4096  # legacy dataset.record_length
    assert default.evaluation.eval_time.mean == 0.5
    bert = load_config("bert_v100")  # carries DLIO's ignored workflow.debug
    assert bert.model.model_size_bytes == 4034713312
    assert bert.train.total_training_steps == 1000
    llama = load_config("llama_405b")
    assert (llama.workflow.train, llama.workflow.checkpoint) == (False, True)
    assert llama.model.parallelism.pipeline == 32
    assert llama.checkpoint.time_between_checkpoints == TimeSpec.constant(5)
    megatron = load_config("megatron_deepspeed_LLNL")
    assert megatron.model.optimization_groups == (1009254400, 865075200, 793600)
    assert megatron.checkpoint.type == "all_ranks"


def test_demo_workload():
    cfg = load_config("demo")
    ds, rd = cfg.dataset, cfg.reader
    assert (ds.format, ds.num_files_train, ds.num_samples_per_file) == ("npz", 32, 1)
    assert (ds.record_length_bytes, ds.record_length_bytes_stdev) == (1048576, 262144)
    assert (rd.batch_size, rd.read_threads, rd.prefetch_size) == (2, 2, 2)
    assert (cfg.train.epochs, cfg.train.computation_time.mean) == (2, 0.02)
    assert (ds.data_folder, cfg.output.folder) == ("data/demo", "output/demo")
    assert (cfg.workflow.generate_data, cfg.workflow.train, cfg.workflow.checkpoint) == (
        True, True, False)


def test_defaults_are_dlios_and_ours():
    cfg = load_config("demo")
    assert cfg.checkpoint.time_between_checkpoints is None
    assert cfg.checkpoint.ksm is None and cfg.storage.storage_options is None
    assert cfg.reader.read_mode == "auto" and cfg.reader.fd_cache_size == 256
    assert cfg.dataset.sample_layout == "first_axis" and cfg.output.access_log is False
    assert (cfg.output.metric.exclude_start_steps, cfg.output.metric.exclude_end_steps) == (1, 0)
    assert cfg.metric.au == 0.90 and cfg.model.transformer.ffn_hidden_size == 8192
    assert Config().framework == "tensorflow" and Config().dataset.num_files_train == 8


# --------------------------------------------------------------------------- sources
def test_workload_nested_and_top_level_yaml(tmp_path):
    body = {"dataset": {"format": "npy", "num_files_train": 3}}
    top = load_config(write_yaml(tmp_path, body, "top.yaml"))
    nested = load_config(write_yaml(tmp_path, {"workload": body}, "nested.yaml"))
    assert top == nested and top.dataset.format == "npy"
    both = write_yaml(tmp_path, {"workload": body, "train": {"epochs": 2}}, "both.yaml")
    assert "put every section under 'workload'" in error_of(both)


def test_unknown_sources():
    assert "did you mean 'unet3d_h100'" in error_of("unet3d_h10")
    assert "not found" in error_of("missing/file.yaml")


# --------------------------------------------------------------------------- aliases
def nest(dotted: str, value):
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value


def merged(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_alias_is_read_as_canonical_and_conflicts(alias, tmp_path):
    canonical = ALIASES[alias]
    leaf = ".batch_size" if alias == "data_reader" else ""  # a section alias
    cfg = load_config(write_yaml(tmp_path, nest(alias + leaf, 3)))
    assert functools.reduce(getattr, (canonical + leaf).split("."), cfg) == 3
    both = merged(nest(alias + leaf, 3), nest(canonical + leaf, 4))
    message = error_of(write_yaml(tmp_path, both, "both.yaml"))
    assert f"'{alias}'" in message and f"'{canonical}'" in message


def test_alias_in_override_replaces_the_canonical_value():
    assert load_config("unet3d_h100", ["++workload.model.model_size=5"]).model.model_size_bytes == 5
    cfg = load_config("default", ["dataset.record_length_bytes=8192", "data_reader.batch_size=8"])
    assert cfg.dataset.record_length_bytes == 8192 and cfg.reader.batch_size == 8


def test_dlio_key_it_never_reads_is_accepted_with_a_note():
    from dlio_mpi.config import support_notes

    assert load_config("bert_v100").workflow.debug is False
    notes = support_notes(load_config("demo", ["workflow.debug=true"]))
    assert notes == ["workflow.debug=true: accepted, has no effect in dlio-mpi because DLIO "
                     "never reads it either (its bert_v100.yaml sets it)"]
    assert "unknown key 'train.debug'" in error_of("demo", ["train.debug=true"])


# --------------------------------------------------------------------------- unknown keys
@pytest.mark.parametrize("override,unknown,suggestion", [
    ("dataset.num_file_train=16", "dataset.num_file_train", "dataset.num_files_train"),
    ("reader.epochs=2", "reader.epochs", "train.epochs"),
    ("train.batch_size=4", "train.batch_size", "reader.batch_size"),
    ("datset.format=npz", "datset", "dataset"),
    ("epochs=2", "epochs", "train.epochs"),
    ("model.parallelism.tensr=2", "model.parallelism.tensr", "model.parallelism.tensor"),
    ("output.metric.exclude_start_step=2", "output.metric.exclude_start_step",
     "output.metric.exclude_start_steps"),
])
def test_unknown_key_suggests_the_closest(override, unknown, suggestion):
    assert error_of("demo", [override]) == (f"unknown key '{unknown}'; did you mean "
                                            f"'{suggestion}'?")


def test_unknown_key_without_close_match_lists_the_section():
    message = error_of("demo", ["dataset.zzzzzz=1"])
    assert message.startswith("unknown key 'dataset.zzzzzz'") and "num_files_train" in message


# --------------------------------------------------------------------------- types
@pytest.mark.parametrize("override,expected", [
    ("dataset.num_files_train=abc", "dataset.num_files_train: expected an integer"),
    ("dataset.num_files_train=true", "expected an integer"),
    ("reader.batch_size=2.5", "reader.batch_size: expected an integer"),
    ("workflow.train=1", "workflow.train: expected true or false, got 1"),
    ("metric.au=high", "metric.au: expected a number"),
    ("dataset.record_dims=7", "dataset.record_dims: expected a list of integers"),
    ("dataset.record_dims=[3,x]", "dataset.record_dims[1]: expected an integer"),
    ("dataset.file_prefix=[img]", "dataset.file_prefix: expected a string"),
    ("dataset.format=[npz]", "dataset.format: ['npz'] is not accepted"),
    ("dataset.hdf5=3", "dataset.hdf5: expected a mapping"),
    ("train.computation_time=fast", "train.computation_time: expected seconds"),
    ("dataset.record_element_type=float33", "dataset.record_element_type: expected a NumPy"),
])
def test_wrong_types(override, expected):
    assert expected in error_of("demo", [override])


def test_type_conversions():
    cfg = load_config("demo", ["metric.au=1", "dataset.record_length_bytes=1000.5",
                               "reader.sample_shuffle=off", "profiling.iostat_devices=sda",
                               "dataset.num_files_train=1e3", "model.name=42"])
    assert cfg.metric.au == 1.0 and isinstance(cfg.metric.au, float)
    assert cfg.dataset.record_length_bytes == 1000.5
    assert cfg.reader.sample_shuffle == "off"  # YAML 1.1 reads `off` as false
    assert cfg.profiling.iostat_devices == ("sda",)
    assert cfg.dataset.num_files_train == 1000 and cfg.model.name == "42"


# --------------------------------------------------------------------------- impossible values
@pytest.mark.parametrize("overrides,expected", [
    (["dataset.record_length_bytes=-1"], "dataset.record_length_bytes: expected a number >= 1"),
    (["dataset.record_length_bytes_stdev=-5"], "dataset.record_length_bytes_stdev: expected"),
    (["dataset.num_files_train=0"], "dataset.num_files_train: expected an integer >= 1 when"),
    (["workflow.train=false", "dataset.num_files_train=0"], "dataset.num_files_train"),
    (["dataset.num_samples_per_file=0"], "dataset.num_samples_per_file: expected an integer >= 1"),
    (["reader.batch_size=0"], "reader.batch_size: expected an integer >= 1, got 0"),
    (["train.epochs=0"], "train.epochs: expected an integer >= 1, got 0"),
    (["reader.read_threads=-1"], "reader.read_threads: expected an integer >= 0 and <= 4096, "
                                 "got -1"),
    (["reader.prefetch_size=-1"], "reader.prefetch_size: expected an integer >= 0"),
    (["reader.fd_cache_size=0"], "reader.fd_cache_size: expected an integer >= 1"),
    (["metric.au=1.5"], "metric.au: expected a number >= 0 and <= 1, got 1.5"),
    (["metric.au=-0.1"], "metric.au: expected a number >= 0 and <= 1"),
    (["output.metric.exclude_start_steps=-1"], "output.metric.exclude_start_steps: expected"),
    (["output.metric.exclude_end_steps=-2"], "output.metric.exclude_end_steps: expected"),
    (["dataset.format=npzz"], "dataset.format: 'npzz' is not accepted; expected one of: "
                              "tfrecord, hdf5"),
    (["framework=jax"], "framework: 'jax' is not accepted; expected one of: tensorflow, pytorch"),
    (["reader.data_loader=torch"], "reader.data_loader: 'torch' is not accepted"),
    (["reader.sample_shuffle=always"], "expected one of: off, seed, random"),
    (["reader.file_shuffle=yes"], "reader.file_shuffle: True is not accepted"),
    (["reader.read_type=lazy"], "expected one of: on_demand, memory"),
    (["reader.read_mode=mmap"], "expected one of: auto, sample, file, file_once"),
    (["dataset.compression=lz4"], "expected one of: none, gzip, lzf, bz2, zip, xz"),
    (["storage.storage_type=nfs"], "expected one of: local_fs, parallel_fs, s3, aistore"),
    (["model.model_datatype=fp8"], "expected one of: int8, uint8, fp16, bf16, fp32, fp64"),
    (["model.parallelism.zero_stage=4"], "expected one of: 0, 1, 2, 3"),
    (["dataset.sample_layout=middle"], "expected one of: first_axis, last_axis"),
    (["dataset.record_dims=[3,224,224]"], "dataset.record_length_bytes_stdev: must be 0 when "
                                          "dataset.record_dims is set"),
    (["dataset.record_length_bytes_stdev=0", "dataset.record_dims=[3,4]",
      "dataset.hdf5.num_dset_per_record=2"], "dataset.hdf5.num_dset_per_record: must divide"),
    (["dataset.format=png", "dataset.record_element_type=float32"], "stores uint8 only"),
    (["reader.data_loader=tensorflow"], "reader.data_loader: 'tensorflow' does not fit"),
    (["reader.data_loader=custom"], "reader.data_loader: 'custom' is not implemented yet"),
    (["model.num_layers=2", "model.parallelism.pipeline=4"], "model.num_layers: expected at"),
    (["model.parallelism.pipeline=2", "model.parallelism.zero_stage=3"], "zero_stage: 3 does"),
    (["model.parallelism.data=4"], "model.parallelism.data: derived from the rank count"),
    (["checkpoint.mode=subset"], "checkpoint.mode subset needs an explicit"),
    (["checkpoint.num_checkpoints_write=2", "checkpoint.num_checkpoints_read=3"],
     "checkpoint.num_checkpoints_read: expected at most"),
    (["checkpoint.ksm={}"], "checkpoint.ksm: needs checkpoint.randomize_tensor false"),
    (["checkpoint.time_between_checkpoints=-2"], "checkpoint.time_between_checkpoints: expected"),
    (["train.computation_time={type: uniform, min: 2, max: 1}"],
     "train.computation_time: min (2.0) is larger than max (1.0)"),
    (["train.computation_time=-0.5"], "train.computation_time: expected a number >= 0"),
    (["train.computation_time={mean: 1, stdev: -1}"], "train.computation_time.stdev: expected"),
    (["train.computation_time={type: lognormal}"], "train.computation_time.type: 'lognormal' "
                                                   "is not accepted; expected one of: normal"),
    (["evaluation.eval_time={type: gamma, shape: 2}"], "evaluation.eval_time: a gamma time "
                                                       "needs shape, scale; missing scale"),
    (["reader.preprocess_time={mean: 1, meen: 2}"], "did you mean "
                                                    "'reader.preprocess_time.mean'"),
    (["train.computation_time_stdev=0.1", "train.computation_time={stdev: 0.2, mean: 1}"],
     "both train.computation_time_stdev and train.computation_time.stdev"),
    (["train.computation_time={type: uniform, min: 0, max: 1}",
      "train.computation_time_stdev=0.1"], "a stdev only applies to a normal time"),
])
def test_impossible_values(overrides, expected):
    assert expected in error_of("demo", overrides)


def test_dataset_files_are_required_only_when_the_workflow_uses_them():
    from dlio_mpi.plan import derive_plan

    cfg = load_config("llama_7b", ["dataset.num_files_train=0"])  # checkpoints only
    plan = derive_plan(cfg, 4)
    assert plan.train_files == 0 and plan.dataset_bytes == 0 and not plan.splits
    assert "dataset.num_files_train: expected an integer >= 1" in error_of(
        "llama_7b", ["dataset.num_files_train=0", "workflow.train=true"])


# --------------------------------------------------------------------------- overrides
def test_override_syntaxes_agree():
    plain = load_config("demo", ["dataset.num_files_train=16", "train.epochs=3"])
    hydra = load_config("demo", ["++workload.dataset.num_files_train=16",
                                 "workload.train.epochs=3"])
    added = load_config("demo", ["+workload.dataset.num_files_train=16", "+train.epochs=3"])
    assert plain == hydra == added
    assert plain.dataset.num_files_train == 16 and plain.train.epochs == 3


def test_override_lists_mappings_and_nested_keys():
    cfg = load_config("demo", [
        "++workload.dataset.record_length_bytes_stdev=0",
        "++workload.dataset.record_dims=[3,224,224]",
        "++workload.checkpoint.randomize_tensor=false",
        "++workload.checkpoint.ksm={}",
        "++workload.train.computation_time.type=normal",
        "++workload.train.computation_time.stdev=0.005",
        "++workload.evaluation.eval_time={type: uniform, min: 0.1, max: 0.3}",
        "model.parallelism={tensor: 2, pipeline: 2}",
        "checkpoint.ksm.await_time=10",
        "checkpoint.time_between_checkpoints=1e-3",
    ])
    assert cfg.dataset.record_dims == (3, 224, 224)
    assert cfg.checkpoint.ksm is not None and cfg.checkpoint.ksm.await_time == 10
    assert cfg.checkpoint.ksm.high_ram_trigger == 30.0
    assert cfg.train.computation_time == TimeSpec("normal", (0.02, 0.005))
    assert cfg.evaluation.eval_time == TimeSpec("uniform", (0.1, 0.3))
    assert (cfg.model.parallelism.tensor, cfg.model.parallelism.pipeline) == (2, 2)
    assert cfg.checkpoint.time_between_checkpoints == TimeSpec.constant(0.001)


def test_override_delete_and_errors():
    cfg = load_config("demo", ["~workload.train.computation_time"])
    assert cfg.train.computation_time == TimeSpec.constant(0.0)
    assert "expected section.key=value" in error_of("demo", ["train.epochs"])
    assert "not a mapping" in error_of("demo", ["train.epochs.x=1"])
    assert "not valid YAML" in error_of("demo", ["dataset.record_dims=[1,2"])


def test_to_dict_round_trip_with_every_kind_of_value(tmp_path):
    cfg = load_config("unet3d_h100", [
        "checkpoint.randomize_tensor=false", "checkpoint.ksm={low_ram_exit: 10}",
        "train.computation_time={type: gamma, shape: 2, scale: 0.1}",
        "evaluation.eval_time_stdev=0.01", "evaluation.eval_time=0.2",
        "checkpoint.time_between_checkpoints={type: poisson, lam: 3}",
        "storage.storage_options={endpoint_url: 'http://localhost:9020'}",
        "reader.transfer_size=262144", "profiling.iostat_devices=[sda, sdb]",
    ])
    plain = cfg.to_dict()
    assert "record_length" not in plain["dataset"] and "model_size" not in plain["model"]
    assert plain["evaluation"]["eval_time"] == {"type": "normal", "mean": 0.2, "stdev": 0.01}
    assert yaml.safe_load(yaml.safe_dump(plain)) == plain  # plain YAML types only
    assert load_config(write_yaml(tmp_path, plain)) == cfg
    assert load_config(write_yaml(tmp_path, {"workload": plain}, "n.yaml")) == cfg
    assert load_config("demo").to_dict()["checkpoint"]["time_between_checkpoints"] == -1


# --------------------------------------------------------------------------- TimeSpec
@pytest.mark.parametrize("value,stdev,expected", [
    (0.5, None, TimeSpec.constant(0.5)),
    (2, None, TimeSpec.constant(2.0)),
    ({}, None, TimeSpec.constant(0.0)),
    ({"mean": 0.3}, None, TimeSpec.constant(0.3)),
    ({"mean": 0.3, "stdev": 0.1}, None, TimeSpec("normal", (0.3, 0.1))),
    ({"mean": 0.3, "stdev": 0}, None, TimeSpec.constant(0.3)),
    (0.3, 0.1, TimeSpec("normal", (0.3, 0.1))),
    ({"type": "normal", "mean": 1, "stdev": 2}, None, TimeSpec("normal", (1.0, 2.0))),
    ({"type": "uniform", "min": 1, "max": 2}, None, TimeSpec("uniform", (1.0, 2.0))),
    ({"type": "gamma", "shape": 2, "scale": 3}, None, TimeSpec("gamma", (2.0, 3.0))),
    ({"type": "exponential", "scale": 3}, None, TimeSpec("exponential", (3.0,))),
    ({"type": "poisson", "lam": 4}, None, TimeSpec("poisson", (4.0,))),
])
def test_timespec_forms(value, stdev, expected):
    spec = parse_timespec(value, "train.computation_time", stdev, "train.computation_time_stdev")
    assert spec == expected
    assert parse_timespec(spec.to_yaml(), "x") == spec


@pytest.mark.parametrize("value", [-1, {"mean": -1}, {"type": "exponential", "scale": -1},
                                   {"type": "poisson"}, {"type": "normal", "mean": 1},
                                   {"stdev": 1}, True, "1s"])
def test_timespec_rejects(value):
    with pytest.raises(ValueError, match=r"^train\.computation_time"):
        parse_timespec(value, "train.computation_time")


@pytest.mark.parametrize("spec", [
    TimeSpec.constant(0.25),
    TimeSpec("normal", (0.3, 0.05)),
    TimeSpec("normal", (0.01, 0.02)),  # about 31 % of draws clipped to 0
    TimeSpec("uniform", (0.1, 0.5)),
    TimeSpec("gamma", (2.0, 0.1)),
    TimeSpec("exponential", (0.2,)),
    TimeSpec("poisson", (3.0,)),
])
def test_timespec_draw_statistics(spec):
    draws = spec.draw(np.random.default_rng(7), 20_000)
    assert draws.shape == (20_000,) and draws.dtype == np.float64
    assert draws.min() >= 0.0
    tolerance = 5 * draws.std() / np.sqrt(draws.size) + 1e-12
    assert abs(draws.mean() - spec.mean) <= tolerance
    assert spec.is_constant == (draws.std() == 0.0)


def test_timespec_clips_instead_of_reflecting():
    spec = TimeSpec("normal", (0.0, 1.0))
    draws = spec.draw(np.random.default_rng(1), 20_000)
    assert 0.45 < np.mean(draws == 0.0) < 0.55  # abs() would leave no zeros
    assert spec.mean == pytest.approx(1 / np.sqrt(2 * np.pi))


def test_time_between_checkpoints_unset_sentinel():
    assert load_config("demo", ["checkpoint.time_between_checkpoints=-1"]) == load_config("demo")
    cfg = load_config("demo", ["checkpoint.time_between_checkpoints=2"])
    assert cfg.checkpoint.time_between_checkpoints == TimeSpec.constant(2)
