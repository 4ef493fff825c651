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
    TimeSpec,
    list_workloads,
    load_config,
)
from dlio_mpi.config.timespec import parse_timespec
from helpers import error_of, merged, nest, write_yaml

SHIPPED = {
    "bert_v100", "cosmoflow_a100", "cosmoflow_h100", "cosmoflow_v100", "default", "demo", "dlrm",
    "llama_405b", "llama_70b", "llama_70b_zero3", "llama_7b", "llama_7b_zero3", "llama_8b_zero3",
    "megatron_deepspeed_LLNL", "resnet50_a100", "resnet50_h100", "resnet50_tf", "resnet50_v100",
    "unet3d_a100", "unet3d_h100", "unet3d_v100",
}


# --------------------------------------------------------------------------- shipped workloads
def test_list_workloads_has_the_shipped_set():
    # and MLPerf Storage's files, as mlperf/NAME (tests/test_mlperf_shipped.py)
    assert {n for n in list_workloads() if not n.startswith("mlperf/")} == SHIPPED


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
@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_alias_is_read_as_canonical_and_conflicts(alias, tmp_path):
    canonical = ALIASES[alias]
    leaf = ".batch_size" if alias == "data_reader" else ""  # a section alias
    # list-valued keys (DLIO 2.0.0's checkpoint.optimization_groups, ...) take a list
    three, four = ([3], [4]) if alias.endswith(("_groups", "_parameters")) else (3, 4)
    cfg = load_config(write_yaml(tmp_path, nest(alias + leaf, three)))
    assert functools.reduce(getattr, (canonical + leaf).split("."), cfg) in (3, (3,))
    both = merged(nest(alias + leaf, three), nest(canonical + leaf, four))
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
    assert notes == ["workflow.debug=true: accepted, has no effect in dlio-mpi because it only "
                     "sets DLIO 2.0.0's log level to DEBUG (later DLIO never reads it), and "
                     "dlio-mpi's log has no levels"]
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


def test_an_unknown_section_is_not_matched_to_a_deep_key_named_loosely_alike():
    """'nope' is no misspelling of storage.stage_in.scope: the sections are listed."""
    message = error_of("demo", ["nope.key=1"])
    assert message.startswith("unknown key 'nope'; accepted in the top level: model, "), \
        message
    assert "did you mean" not in message


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
    (["reader.batch_size=0"], "reader.batch_size: expected an integer >= 1 and <= 2^31 - 1, got 0"),
    (["train.epochs=0"], "train.epochs: expected an integer >= 1 and <= 2^31 - 1, got 0"),
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
    (["storage.storage_type=nfs"], "expected one of: local_fs, parallel_fs, direct_fs, s3, "
                                   "aistore"),
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
    (["checkpoint.randomize_tensor=false"], "checkpoint.randomize_tensor: false is not "
                                            "implemented yet in dlio-mpi; accepted: true"),
    (["checkpoint.checkpoint_mechanism=pt_save", "checkpoint.layout=shared"],
     "checkpoint.layout: shared writes one file through MPI-IO, which torch.save cannot"),
    (["checkpoint.odirect=true", "checkpoint.checkpoint_mechanism=pt_save"],
     "checkpoint.odirect: true does not combine with checkpoint_mechanism pt_save"),
    (["checkpoint.async_write=true", "checkpoint.checkpoint_mechanism=pt_save"],
     "checkpoint.async_write: true with checkpoint_mechanism pt_save is not implemented yet"),
    (["checkpoint.snapshot_bytes_per_second=1e9"], "checkpoint.snapshot_bytes_per_second: "
     "1000000000 paces the snapshot of checkpoint.async_write: true, which is false"),
    (["checkpoint.async_write=true", "checkpoint.snapshot_bytes_per_second=-1"],
     "checkpoint.snapshot_bytes_per_second: expected a number >= 0"),
    (["checkpoint.checkpoint_mechanism=tf_save"], "checkpoint.checkpoint_mechanism: 'tf_save' "
                                                  "is not implemented yet"),
    (["checkpoint.checkpoint_mechanism_classname=my.Ckpt"],
     "checkpoint.checkpoint_mechanism_classname: 'my.Ckpt' is not implemented yet"),
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
    from dlio_mpi.plan.derive import derive_plan

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
    # a whole section deleted would leave its keys at their defaults (a dataset under ./data)
    for given in ("~dataset", "~workload.dataset", "~~dataset"):
        msg = error_of("demo", [given])
        assert f"override '{given}': deletes the whole dataset section" in msg
        assert "expected ~dataset.KEY (one key) or dataset.KEY=VALUE" in msg


def test_to_dict_round_trip_with_every_kind_of_value(tmp_path):
    cfg = load_config("unet3d_h100", [
        "checkpoint.ksm={low_ram_exit: 10}",
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


# --------------------------------------------------------------------------- what each key does
# Keys that act in dlio-mpi. Every other key must be refused where not implemented
# (Rule.unimplemented) or say why it has no effect (Rule.inert): a new key has to choose.
ACTING = {
    "model.name", "framework", "workflow.generate_data", "workflow.train", "workflow.evaluation",
    "storage.storage_root", "dataset.record_length_bytes", "dataset.record_length_bytes_stdev",
    "dataset.num_files_train", "dataset.num_files_eval", "dataset.num_samples_per_file",
    "dataset.data_folder", "dataset.num_subfolders_train", "dataset.num_subfolders_eval",
    "dataset.file_prefix", "dataset.format", "dataset.record_element_type",
    "dataset.record_dims", "dataset.sample_layout", "dataset.skip_listing", "reader.batch_size",
    "reader.batch_size_eval", "reader.read_threads", "reader.prefetch_size",
    "reader.file_shuffle", "reader.sample_shuffle", "reader.read_type", "reader.odirect",
    "reader.read_mode", "reader.access", "reader.fd_cache_size", "reader.drop_page_cache",
    "reader.keep_data", "reader.access_order", "train.epochs", "train.total_training_steps",
    "train.computation_time",
    "train.seed", "train.seed_change_epoch", "train.compute_spin_us", "train.sync_spin_us",
    "train.batch_spin_us",
    "evaluation.eval_time", "evaluation.eval_after_epoch", "evaluation.epochs_between_evals",
    "output.folder", "output.metric.exclude_start_steps", "output.metric.exclude_end_steps",
    "output.access_log", "metric.au", "reader.file_access", "reader.mpiio_hints",
    # made to act by their own changes (issue 6)
    "dataset.keep_files", "output.log_file", "reader.io_watchdog_seconds",
    "reader.io_watchdog_abort",
    # ours (issue 7): applied by filesystems.apply_striping
    "storage.lustre",
    # checkpoints (issue 8): sizing (checkpoint/sizing.py), when (schedule.py), how
    # (checkpointer.py, its writers), the checkpoint-only workflow (phase.py)
    "model.type", "model.model_size_bytes", "model.optimization_groups", "model.num_layers",
    "model.layer_parameters", "model.model_datatype", "model.optimizer_datatype",
    "model.parallelism.tensor", "model.parallelism.pipeline", "model.parallelism.data",
    "model.parallelism.zero_stage", "model.transformer.vocab_size",
    "model.transformer.hidden_size", "model.transformer.ffn_hidden_size",
    "model.transformer.num_attention_heads", "model.transformer.num_kv_heads",
    "workflow.checkpoint", "checkpoint.checkpoint_folder", "checkpoint.checkpoint_after_epoch",
    "checkpoint.epochs_between_checkpoints", "checkpoint.steps_between_checkpoints",
    "checkpoint.mode", "checkpoint.fsync", "checkpoint.time_between_checkpoints",
    "checkpoint.num_checkpoints_write", "checkpoint.num_checkpoints_read",
    "checkpoint.recovery_rank_shift", "checkpoint.rank_sync", "checkpoint.checkpoint_mechanism",
    "checkpoint.layout", "checkpoint.odirect", "checkpoint.mpiio_hints",
    "checkpoint.async_write", "checkpoint.snapshot_bytes_per_second", "checkpoint.drain",
    "checkpoint.dcp", "checkpoint.dcp.thread_count",
    # the framework engine (issue 9, readers/torch_loader.py); the plan notes the last two
    # with reader.engine native
    "reader.engine", "reader.pin_memory", "reader.multiprocessing_context",
    # issue 9: slept per sample by the native engine's reader threads
    "reader.preprocess_time",
    # issue 10: per-rank trace files (metrics/trace.py)
    "output.trace",
    # issue 10: rank 0's progress lines (progress.py)
    "output.progress_interval",
    # issue 10: interval statistics (metrics/intervals.py)
    "output.stats_interval",
    # issue 11: the caching tier (tiers/cache.py), read-once staging (readers/read_once.py),
    # sampling with replacement (sharding.rank_draws)
    "reader.cache", "reader.staging", "reader.sampling",
    # issue 19: the loader's modelled costs (the native engine spends the first and last,
    # every step loop the second; calibrate/ measures them)
    "reader.preprocess_cpu_time", "reader.step_cpu_time", "reader.step_wait_time",
    "reader.startup_time",
    # issue 32: what checkpoints' bytes are made of (checkpoint/content.py)
    "checkpoint.content.compression_ratio", "checkpoint.content.dedup_ratio",
}


def _rules(cls=Config, path="", inherited=""):
    from dataclasses import fields as dc_fields

    for f in dc_fields(cls):
        rule, where = f.metadata["rule"], f"{path}.{f.name}" if path else f.name
        if rule.kind == "section" and not rule.optional:
            yield from _rules(rule.section, where, rule.inert or inherited)
        else:
            yield where, rule, rule.inert or inherited


def test_every_key_acts_is_refused_or_says_why_it_has_no_effect():
    unclassified = [where for where, rule, inert in _rules()
                    if where not in ACTING and not rule.unimplemented and not inert]
    assert unclassified == []
    inert_but_acting = [where for where, rule, inert in _rules() if where in ACTING and inert]
    assert inert_but_acting == []


def test_default_settings_have_no_notes():
    from dlio_mpi.config import support_notes

    assert support_notes(Config()) == []
    assert support_notes(load_config("demo")) == []


@pytest.mark.parametrize("override,accepted", [
    ("storage.storage_type=s3", "local_fs, parallel_fs, direct_fs"),
    ("storage.storage_type=aistore", "local_fs, parallel_fs, direct_fs"),
    ("reader.data_loader=dali", "tensorflow, pytorch"),
    ("reader.data_loader=native_dali", "tensorflow, pytorch"),
    ("reader.data_loader=custom", "tensorflow, pytorch"),
    ("reader.data_loader=synthetic", "tensorflow, pytorch"),
    ("reader.data_loader_classname=plugins.MyLoader", "null"),
    ("reader.reader_classname=plugins.MyReader", "null"),
    ("dataset.compression=bz2", "none, gzip, lzf, snappy, lz4, zstd"),
    ("dataset.compression=xz", "none, gzip, lzf, snappy, lz4, zstd"),
])
def test_values_not_implemented_yet_are_refused(override, accepted):
    key, _, value = override.partition("=")
    message = error_of("demo", [override])
    assert message.startswith(f"{key}: ") and "is not implemented yet in dlio-mpi" in message
    assert message.endswith(f"; accepted: {accepted}")
    if "{" not in value:
        assert value in message


PATH_KEYS = ("storage.storage_root", "dataset.data_folder", "checkpoint.checkpoint_folder",
             "output.folder", "output.log_file", "storage.stage_in.to", "reader.cache.folder",
             "checkpoint.drain.to")


@pytest.mark.parametrize("storage_type", ["local_fs", "parallel_fs"])
@pytest.mark.parametrize("key", PATH_KEYS)
@pytest.mark.parametrize("url", ["s3://bucket/ckpt", "gs+grpc.v1-x://b", " file:///tmp/x"])
def test_a_url_for_a_path_on_a_file_system_is_refused(key, url, storage_type):
    message = error_of("demo", [f"storage.storage_type={storage_type}", f"{key}={url!r}"])
    assert message == (f"{key}: {url!r} is a URL, and storage.storage_type {storage_type} "
                       "takes a file-system path; expected a path (object storage, "
                       "storage.storage_type s3, is not implemented yet)")


def test_every_path_key_of_the_schema_refuses_a_url():
    from dlio_mpi.config.loader import path_keys
    from dlio_mpi.config.schema import schema_keys

    named = {k for k in schema_keys() if k.rpartition(".")[2] in (
        "to", "folder", "data_folder", "checkpoint_folder", "log_file", "storage_root")}
    assert named == set(PATH_KEYS)
    cfg = load_config("demo", ["storage.stage_in.to=/x", "reader.cache.folder=/y",
                              "checkpoint.drain={to: /z}"])
    assert {k for k, _ in path_keys(cfg)} == set(PATH_KEYS)


OBJECT_STORAGE_WORKLOAD = {  # as MLPerf Storage's object-storage workloads write it
    "storage": {"storage_type": "s3", "storage_root": "bucket", "storage_library": "s3dlio",
                "storage_options": {"endpoint_url": "http://minio:9000", "region": "us-east-1",
                                    "s3_force_path_style": True}},
    "checkpoint": {"checkpoint_folder": "s3://bucket/s3dlio/llama3-8b"},
}


@pytest.mark.parametrize("kind", ["s3", "aistore"])
def test_an_object_storage_workload_is_refused_with_one_message(kind, tmp_path):
    tree = {**OBJECT_STORAGE_WORKLOAD,
            "storage": {**OBJECT_STORAGE_WORKLOAD["storage"], "storage_type": kind,
                        "storage_library": "LIBRARY_PLACEHOLDER"}}
    expected = (f"storage.storage_type: '{kind}' is object storage, which is not implemented "
                f"yet in dlio-mpi; accepted: local_fs, parallel_fs, direct_fs")
    assert error_of(write_yaml(tmp_path, tree)) == expected
    # the same given as overrides, and whatever other keys an object-storage workload adds
    assert error_of("demo", [f"storage.storage_type={kind}", "storage.storage_library=minio",
                             "storage.storage_options.endpoint_url=http://x",
                             "checkpoint.checkpoint_folder=s3://b/c"]) == expected
    # an override back to a file system is what the refusal asks for
    cfg = load_config(write_yaml(tmp_path, OBJECT_STORAGE_WORKLOAD, "s.yaml"),
                      ["storage.storage_type=local_fs", "checkpoint.checkpoint_folder=ck",
                       "storage.storage_root=./"])
    assert cfg.storage.storage_library == "s3dlio"


def test_storage_library_and_storage_options_are_known_keys_without_effect():
    from dlio_mpi.config import support_notes

    cfg = load_config("demo", ["storage.storage_library=s3torchconnector",
                               "storage.storage_options={endpoint_url: 'http://h:9000', "
                               "secret_access_key: KEY, s3_max_attempts: 3, anything: true}"])
    assert cfg.storage.storage_library == "s3torchconnector"
    assert dict(cfg.storage.storage_options) == {
        "endpoint_url": "http://h:9000", "secret_access_key": "KEY", "s3_max_attempts": 3,
        "anything": True}  # DLIO hands the whole mapping to the library: any names
    assert support_notes(cfg) == [
        "storage.storage_library=s3torchconnector, storage.storage_options: accepted, have no "
        "effect in dlio-mpi because it configures object storage, which is not implemented yet"]
    assert error_of("demo", ["storage.storage_library=boto"]) == (
        "storage.storage_library: 'boto' is not accepted; expected one of: s3torchconnector, "
        "s3dlio, minio")
    assert error_of("demo", ["storage.storage_options={endpoint_url: [a, b]}"]) == (
        "storage.storage_options.endpoint_url: expected a string, number or boolean, "
        "got ['a', 'b']")


@pytest.mark.parametrize("path", ["./s3:/x", "data:/x", "a/s3://x", "s3:bucket", "3s://x"])
def test_paths_that_are_not_urls_are_accepted(path):
    assert load_config("demo", [f"dataset.data_folder={path!r}"]).dataset.data_folder == path


def test_storage_types_meaning_a_posix_path_both_act():
    from dlio_mpi.plan.derive import derive_plan

    plans = [derive_plan(load_config("demo", [f"storage.storage_type={kind}"]), 2)
             for kind in ("local_fs", "parallel_fs")]
    assert plans[0].dataset_bytes == plans[1].dataset_bytes > 0
    assert not any("storage" in note for plan in plans for note in plan.notes)


@pytest.mark.parametrize("overrides,expected", [
    ([], None),
    (["storage.lustre={}"], (None, None, None, False)),
    (["storage.lustre.stripe_count=-1"], (-1, None, None, False)),
    (["storage.lustre.stripe_count=8", "storage.lustre.stripe_size=4M"], (8, 4 << 20, None,
                                                                           False)),
    (["storage.lustre.stripe_size=1048576", "storage.lustre.pool=testfs.flash",
      "storage.lustre.required=true"], (None, 1 << 20, "testfs.flash", True)),
    (["storage.lustre.stripe_size=512k"], (None, 512 << 10, None, False)),
    (["storage.lustre.stripe_size=' 3G '"], (None, 3 << 30, None, False)),
])
def test_lustre_section_is_read_with_sizes_in_bytes(overrides, expected, tmp_path):
    from dlio_mpi.plan.derive import derive_plan

    cfg = load_config("demo", overrides)
    lustre = cfg.storage.lustre
    got = lustre and (lustre.stripe_count, lustre.stripe_size, lustre.pool, lustre.required)
    assert got == expected
    assert load_config(write_yaml(tmp_path, {"workload": cfg.to_dict()})) == cfg
    assert not any("lustre" in note for note in derive_plan(cfg, 2).notes)  # not inert


@pytest.mark.parametrize("override,expected", [
    ("storage.lustre.stripe_count=-2", "storage.lustre.stripe_count: expected an integer >= -1 "
                                       "and <= 2000 or null, got -2"),
    ("storage.lustre.stripe_count=2001", "<= 2000"),
    ("storage.lustre.stripe_size=100", "storage.lustre.stripe_size: expected a size in bytes, "
                                       "or with a suffix K, M or G (binary), that is a "
                                       "multiple of 64K below 4G, got '100'"),
    ("storage.lustre.stripe_size=4G", "got '4G'"),
    ("storage.lustre.stripe_size=0", "got '0'"),
    ("storage.lustre.stripe_size=1.5M", "got '1.5M'"),
    ("storage.lustre.stripe_size=[4M]", "storage.lustre.stripe_size: expected a string"),
    ("storage.lustre.pool='a b'", "storage.lustre.pool: expected an OST pool name"),
    ("storage.lustre.required=yes please", "storage.lustre.required: expected true or false"),
    ("storage.lustre.stripe_cont=4", "did you mean 'storage.lustre.stripe_count'?"),
])
def test_lustre_section_refuses_what_lfs_would(override, expected):
    assert expected in error_of("demo", [override])


def test_data_loader_none_is_refused_as_dlio_refuses_it():
    assert "reader.data_loader: 'none' is not accepted" in error_of("demo",
                                                                   ["reader.data_loader=none"])


@pytest.mark.parametrize("override,shown", [
    ("reader.computation_threads=8", "reader.computation_threads=8"),
    ("reader.transfer_size=262144", "reader.transfer_size=262144"),
    ("reader.shuffle_size=16", "reader.shuffle_size=16"),
    ("dataset.record_length_bytes_resize=1024", "dataset.record_length_bytes_resize=1024"),
    ("reader.transformed_record_dims=[3,4]", "reader.transformed_record_dims=[3, 4]"),
    ("reader.transformed_record_element_type=float32",
     "reader.transformed_record_element_type=float32"),
    ("reader.dont_use_mmap=true", "reader.dont_use_mmap=true"),
    ("reader.data_loader_sampler=index", "reader.data_loader_sampler=index"),
    ("workflow.query=dataset.format", "workflow.query=dataset.format"),
    ("workflow.debug=true", "workflow.debug=true"),
    ("dataset.enable_chunking=true", "dataset.enable_chunking=true"),
    ("dataset.chunk_size=4", "dataset.chunk_size=4"),
    ("dataset.generation_buffer_size=1024", "dataset.generation_buffer_size=1024"),
    ("dataset.compression_level=9", "dataset.compression_level=9"),
    ("dataset.record_element_bytes=4", "dataset.record_element_bytes=4"),
    ("dataset.hdf5.chunk_dims=[2]", "dataset.hdf5.chunk_dims=[2]"),
    ("storage.storage_options={region: eu-west-1}", "storage.storage_options:"),
    ("checkpoint.ksm={}", "checkpoint.ksm:"),
    ("checkpoint.type=all_ranks", "checkpoint.type=all_ranks"),
    ("workflow.profiling=true", "workflow.profiling=true"),
    ("profiling.profiler=darshan", "profiling.profiler=darshan"),
])
def test_settings_without_effect_are_noted_in_the_plan(override, shown):
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.plan.render import describe_plan

    cfg = load_config("demo", [override])
    notes = [n for n in derive_plan(cfg, 2).notes if "no effect" in n]
    assert len(notes) == 1 and shown in notes[0], notes
    assert ": accepted, ha" in notes[0] and " no effect in dlio-mpi because " in notes[0]
    assert f"note            {notes[0]}" in describe_plan(derive_plan(cfg, 2), cfg)
    assert "eu-west-1" not in notes[0]  # sections are named, not shown (they hold secrets)


@pytest.mark.parametrize("overrides, says", [
    ([], "every read lands in one small buffer per reader thread (no ring of batches) and no "
         "batch is kept: the same system calls and bytes from storage as with true"),
    (["reader.file_access=shared"], "every MPI-IO read lands in one reused batch buffer"),
    (["reader.staging=read_once"], "no effect with reader.staging read_once"),
    (["reader.engine=framework"], "no effect with reader.engine framework"),
])
def test_keep_data_false_is_noted_in_the_plan(overrides, says):
    """reader.keep_data (ours, not DLIO's): the plan says what false does, or that it has no
    effect; reader.staging replicated says it in its reader line."""
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.plan.render import describe_plan

    cfg = load_config("demo", ["reader.keep_data=false", *overrides])
    notes = [n for n in derive_plan(cfg, 2).notes if "reader.keep_data" in n]
    assert len(notes) == 1 and says in notes[0], notes
    assert f"note            {notes[0]}" in describe_plan(derive_plan(cfg, 2), cfg)
    kept = load_config("demo", overrides)  # true, the default: nothing to say
    assert not [n for n in derive_plan(kept, 2).notes if "reader.keep_data" in n]


def test_notes_of_one_reason_are_one_line():
    from dlio_mpi.config import support_notes

    notes = support_notes(load_config("demo", ["workflow.profiling=true",
                                               "profiling.profiler=darshan"]))
    assert notes == ["workflow.profiling=true, profiling.profiler=darshan: accepted, have no "
                     "effect in dlio-mpi because profilers are not implemented yet"]
    assert support_notes(load_config("llama_7b")) == []  # every checkpoint key acts


@pytest.mark.parametrize("overrides, shown", [
    (["model.num_layers=4", "checkpoint.fsync=false"],
     "model.num_layers=4, checkpoint.fsync=false: no effect here: workflow.checkpoint is false"),
    (["workflow.checkpoint=true", "checkpoint.num_checkpoints_write=3",
      "checkpoint.recovery_rank_shift=true"],
     "checkpoint.num_checkpoints_write=3, checkpoint.recovery_rank_shift=true: no effect here: "
     "they drive the checkpoint-only workflow"),
    (["workflow.checkpoint=true", "workflow.train=false", "checkpoint.num_checkpoints_write=1",
      "checkpoint.steps_between_checkpoints=5"],
     "checkpoint.steps_between_checkpoints=5: no effect here: they place checkpoints in "
     "training, and workflow.train is false"),
    (["workflow.checkpoint=true", "checkpoint.mpiio_hints={romio_cb_write: enable}"],
     "checkpoint.mpiio_hints={romio_cb_write: enable}: no effect here: checkpoint.layout "
     "file_per_rank writes without MPI-IO"),
])
def test_checkpoint_keys_where_they_cannot_act_are_noted(overrides, shown):
    from dlio_mpi.plan.derive import derive_plan

    notes = [n for n in derive_plan(load_config("demo", overrides), 2).notes
             if "no effect here" in n]
    assert len(notes) == 1 and notes[0].startswith(shown), notes


def test_data_loader_acts_on_multi_sample_files_and_says_what_it_emulates():
    from dlio_mpi.plan.derive import derive_plan

    def plan(*overrides):
        return derive_plan(load_config("demo", ["dataset.num_files_train=8", *overrides]), 2)

    torch = plan()
    assert torch.read_mode == "file"
    assert torch.notes[0] == (
        "reader.data_loader=pytorch: the native C engine reads npz with the access pattern of "
        "DLIO's pytorch reader (the whole file loaded for every sample; as its tensorflow "
        "reader does); the real torch DataLoader is not run (reader.engine: framework runs "
        "it)")
    tf = ["framework=tensorflow", "reader.data_loader=tensorflow"]
    assert plan(*tf).read_mode == "file"
    assert "as its pytorch reader does" in plan(*tf).notes[0]
    multi = plan(*tf, "dataset.num_samples_per_file=4")
    assert multi.read_mode == "file_once"
    assert multi.notes[0].startswith("reader.data_loader=tensorflow: the native C engine reads "
                                     "npz with the access pattern of DLIO's tensorflow reader "
                                     "(each file loaded once, whole, for all its samples; its "
                                     "pytorch reader: the whole file loaded for every")
    assert "real tf.data pipeline is not run" in multi.notes[0]
    shared = plan("reader.file_access=mpio")
    assert shared.notes[0].startswith("reader.data_loader=pytorch: MPI-IO "
                                      "(reader.file_access=mpio) reads npz with the access")
    assert any(n.startswith("reader.read_threads=") for n in shared.notes)
    assert plan("dataset.num_samples_per_file=4").read_mode == "file"
    chosen = plan(*tf, "dataset.num_samples_per_file=4", "reader.read_mode=sample")
    assert chosen.read_mode == "sample"
    assert "reader.read_mode=sample decides the reads, not DLIO's tensorflow" in chosen.notes[0]
    indexed = plan("dataset.format=indexed_binary")
    assert "(a read of each sample's extent; as its tensorflow reader does)" in indexed.notes[0]


def test_the_plan_says_how_long_the_compute_takes():
    from dlio_mpi.errors import UserError
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.plan.render import describe_plan

    cfg = load_config("demo", ["train.computation_time=86400", "train.epochs=1000"])
    text = describe_plan(derive_plan(cfg, 2), cfg)
    assert ("run time        the run's compute alone takes 21.9 years (epochs x steps x "
            "computation_time: 1000 x 8 x 86400 s)") in text
    cfg = load_config("demo", ["train.epochs=1e5"])
    assert "takes 4.4 hours" in describe_plan(derive_plan(cfg, 2), cfg)
    with pytest.raises(UserError, match="^train.epochs: .* rank 0's records of 1000000000 epoch"):
        derive_plan(load_config("demo", ["train.epochs=1e9"]), 2)  # past any node's memory
    cfg = load_config("demo")
    assert "takes 0.32 s (" in describe_plan(derive_plan(cfg, 2), cfg)


# --------------------------------------------------------------------------- bad sources
def test_workload_files_that_are_not_workloads(tmp_path):
    (tmp_path / "bin").write_bytes(b"\x7fELF\x02\x01\xd0\xff")
    assert error_of(str(tmp_path / "bin")).endswith(
        "not a YAML text file (byte 0xd0 at offset 6 is not UTF-8)")
    (tmp_path / "ctl").write_bytes(b"\x7fELF\x02\x01")  # valid UTF-8, not text
    assert error_of(str(tmp_path / "ctl")).endswith(
        "not a YAML text file (character U+007F at offset 0 is not allowed in YAML)")
    assert error_of(str(tmp_path)) == f"{tmp_path}: is a directory; expected a workload YAML file"
    for text in ("", "# a comment\n", "workload:\n", "{}\n"):
        (tmp_path / "w.yaml").write_text(text)
        assert "the workload is empty" in error_of(str(tmp_path / "w.yaml"))
    assert error_of("/dev/null").startswith("/dev/null: is not a regular file")


@pytest.mark.parametrize("text,message", [
    ("dataset:\n  format: npz\n  format: npy\n", "key 'dataset.format' is given twice (lines 2 "
                                                "and 3)"),
    ("train: {epochs: 1}\nreader: {}\ntrain: {epochs: 2}\n", "key 'train' is given twice "
                                                            "(lines 1 and 3)"),
    ("train:\n  computation_time: {mean: 1, mean: 2}\n", "key 'train.computation_time.mean'"),
    ("a: &x {k: 1}\nb:\n  <<: *x\n  k: 2\n", "unknown key 'a'"),  # a merge is no duplicate
])
def test_duplicate_yaml_keys_are_refused_with_their_lines(tmp_path, text, message):
    assert message in error_of(write_yaml_text(tmp_path, text))


def write_yaml_text(tmp_path: Path, text: str) -> str:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return str(path)


def test_yaml_errors_name_the_file_and_line(tmp_path):
    message = error_of(write_yaml_text(tmp_path, "dataset:\n\tformat: npz\n"))
    assert message.startswith(f"{tmp_path / 'w.yaml'}, line 2 column 1: not valid YAML (")


@pytest.mark.parametrize("overrides", [
    ["train.epochs=2", "train.epochs=3"],
    ["train.epochs=2", "++workload.train.epochs=3"],
    ["dataset.record_length=1", "dataset.record_length_bytes=2"],
    ["~train.epochs", "train.epochs=3"],
])
def test_a_key_set_twice_on_the_command_line_is_refused(overrides):
    assert error_of("demo", overrides).startswith(f"overrides '{overrides[0]}' and "
                                                  f"'{overrides[1]}' both set ")


def test_nested_overrides_of_one_mapping_are_not_repeats():
    cfg = load_config("demo", ["train.computation_time.type=normal",
                               "train.computation_time.stdev=0.1"])
    assert cfg.train.computation_time == TimeSpec("normal", (0.02, 0.1))


# --------------------------------------------------------------------------- bounds
@pytest.mark.parametrize("override,expected", [
    ("dataset.record_length_bytes=0", "dataset.record_length_bytes: expected a number >= 1 and "
                                      "<= 2^62, got 0"),
    ("dataset.record_length_bytes=1e30", "dataset.record_length_bytes: expected a number"),
    ("dataset.num_files_train=1e18", "dataset.num_files_train: expected an integer >= 0 and "
                                     "<= 1000000000, got 1e+18"),
    ("reader.prefetch_size=1e10", "reader.prefetch_size: expected an integer >= 0 and <= 2^20"),
    ("reader.fd_cache_size=1e10", "reader.fd_cache_size: expected an integer >= 1 and <= 2^24"),
    ("reader.read_threads=4097", "reader.read_threads: expected an integer >= 0 and <= 4096"),
    ("train.total_training_steps=1e19", "train.total_training_steps: expected an integer "
                                        ">= -1 and <= 2^31 - 1, got 1e+19"),
    ("model.num_layers=" + "9" * 30, "model.num_layers: expected an integer >= -1 and <= 2^20"),
    ("train.seed=-1", "train.seed: expected an integer >= 0 and <= 2^32 - 1, got -1"),
    ("dataset.record_dims=[" + ",".join(["2"] * 13) + "]", "dataset.record_dims: expected at "
                                                           "most 12 dimensions, got 13"),
    ("train.computation_time=1e10", "train.computation_time: expected at most 1e+09 seconds "
                                    "(31.7 years), got 1e+10"),
    ("evaluation.eval_time={type: uniform, min: 0, max: 1e12}", "evaluation.eval_time.max: "
                                                                "expected at most 1e+09"),
    ("train.computation_time=" + "9" * 400, "train.computation_time: expected at most"),
    ("dataset.record_length_bytes=" + "9" * 400, "dataset.record_length_bytes: expected a "
                                                 "number"),
    ("train.compute_spin_us=1e7", "train.compute_spin_us: expected a number >= 0 and "
                                  "<= 1000000 or auto, got 10000000.0"),
    ("dataset.file_prefix=a/b", "dataset.file_prefix: 'a/b' is not a file name prefix"),
    ("dataset.file_prefix=..", "dataset.file_prefix: '..' is not a file name prefix"),
    ("dataset.file_prefix=''", "dataset.file_prefix: '' is not a file name prefix"),
    ("dataset.data_folder=\"a\\0b\"", "dataset.data_folder: contains a NUL byte"),
])
def test_values_past_what_dlio_mpi_can_hold_are_refused(override, expected):
    assert expected in error_of("demo", ["dataset.record_length_bytes_stdev=0", override]
                                if "record_dims" in override else [override])


@pytest.mark.parametrize("override,got", [
    ("train.computation_time=1e9", "1e+09"),
    ("train.computation_time=86400.5", "86400.5"),
    ("train.computation_time={mean: 1, stdev: 1e5}", "train.computation_time.stdev 100000"),
    ("evaluation.eval_time=1e6", "1e+06"),
    ("evaluation.eval_time={type: uniform, min: 0, max: 1e6}", "evaluation.eval_time.max 1e+06"),
    ("reader.preprocess_time=1e9", "1e+09"),
    ("reader.preprocess_cpu_time=1e9", "1e+09"),
    ("reader.step_cpu_time=1e9", "1e+09"),
    ("reader.step_wait_time={type: exponential, scale: 1e9}", "reader.step_wait_time.scale 1e+09"),
    ("reader.step_wait_time={type: gamma, shape: 1e6, scale: 1}", "a gamma time of mean 1e+06"),
])
def test_a_step_time_over_one_day_is_refused(override, got):
    key = override.partition("=")[0]
    assert error_of("demo", [override]) == (f"{key}: expected at most 86400 seconds (one day), "
                                            f"got {got}")


def test_a_step_time_of_one_day_is_accepted():
    cfg = load_config("demo", ["train.computation_time=86400", "evaluation.eval_time=86400",
                               "reader.preprocess_time={type: uniform, min: 0, max: 86400}"])
    assert cfg.train.computation_time.mean == cfg.evaluation.eval_time.mean == 86400


def test_long_draws_are_clipped_to_what_int64_nanoseconds_hold():
    from dlio_mpi.config.timespec import MAX_DRAW_SECONDS

    draws = TimeSpec("exponential", (1e9,)).draw(np.random.default_rng(0), 100_000)
    assert draws.max() == MAX_DRAW_SECONDS and MAX_DRAW_SECONDS * 1e9 < 2**63


@pytest.mark.parametrize("overrides,expected", [
    (["dataset.num_samples_per_file=1e18"], "32 train files hold 32000000000000000000 samples, "
                                            "more than the 2^62 sample ids"),
    (["dataset.record_length_bytes_stdev=0", "dataset.record_dims=[1e7,1e7,1e7]"],
     "dataset.record_dims=[10000000, 10000000, 10000000] of uint8 with "
     "dataset.num_samples_per_file=1: a train file would hold 1000000000000000000000 bytes"),
    (["dataset.record_length_bytes=4e18", "dataset.record_length_bytes_stdev=0",
      "dataset.record_element_type=float64"], "dataset.record_length_bytes=4e+18 of float64"),
    (["dataset.data_folder=/" + "d" * 4100], "dataset.data_folder: train file paths would be"),
])
def test_plans_past_int64_or_the_engine_are_refused(overrides, expected):
    from dlio_mpi.errors import UserError
    from dlio_mpi.plan.derive import derive_plan

    with pytest.raises(UserError, match=None) as info:
        derive_plan(load_config("demo", overrides), 2)
    assert expected in str(info.value)


def test_plans_past_memory_are_refused_with_the_figures():
    """One budget, one message: every item a node's ranks would hold, the largest first and
    its key leading, against what the node can give (here the memory_bytes given)."""
    from dlio_mpi.errors import UserError
    from dlio_mpi.plan.derive import derive_plan

    cfg = load_config("demo", ["dataset.num_files_train=1000000"])  # with a size stdev
    with pytest.raises(UserError) as info:  # refused before the shapes are drawn
        derive_plan(cfg, 8, ranks_per_node=4, nodes=2, memory_bytes=2 * 30 * 2**20)
    assert str(info.value) == (
        "dataset.num_files_train: a node's 4 rank(s) would hold 30.5 MiB of memory: the drawn "
        "sample shapes of dataset.num_files_train=1000000 and num_files_eval=0 files "
        "(dataset.record_length_bytes_stdev) 30.5 MiB (7.6 MiB per rank); more than 80 % of "
        "the 30.0 MiB the node can give this job (the node's memory); expected fewer files, "
        "or dataset.record_length_bytes_stdev: 0")
    cfg = load_config("demo", ["reader.prefetch_size=1000", "dataset.record_length_bytes_stdev=0"])
    with pytest.raises(UserError) as info:
        derive_plan(cfg, 2, ranks_per_node=2, nodes=1, memory_bytes=2**30)
    assert str(info.value) == (
        "reader.prefetch_size: a node's 2 rank(s) would hold 3.9 GiB of memory: 1001 batch "
        "buffers of about 2.0 MiB (reader.prefetch_size=1000, reader.batch_size=2, "
        "dataset.record_length_bytes=1048576) 3.9 GiB (2.0 GiB per rank); rank 0's records of "
        "2 epoch(s) of 2 rank(s) 48.0 KiB; more than 80 % of the 1.0 GiB the node can give "
        "this job (the node's memory); expected a smaller reader.prefetch_size or batch, or "
        "reading without keeping the data (reader.keep_data: false)")
    assert derive_plan(load_config("demo", ["reader.prefetch_size=1000", "reader.keep_data=false",
                                            "dataset.record_length_bytes_stdev=0"]),
                       2, ranks_per_node=2, nodes=1, memory_bytes=2**30).steps_per_epoch == 8


def test_an_async_snapshot_past_memory_is_refused_with_the_figures():
    """checkpoint.async_write holds each rank's share in memory beside the batch buffers:
    shares of 600 MiB (a flat model under ZeRO 3: each rank writes model_size_bytes) with a
    64 MiB pattern and 3 buffers of 2 MiB are refused on nodes of 2 ranks and 1 GiB (80 %:
    819 MiB); shares of 200 MiB fit."""
    from dlio_mpi.errors import UserError
    from dlio_mpi.plan.derive import derive_plan

    over = ["workflow.checkpoint=true", "model.parallelism.zero_stage=3",
            "checkpoint.async_write=true", "dataset.record_length_bytes_stdev=0"]
    cfg = load_config("demo", [*over, f"model.model_size_bytes={600 * 2**20}"])
    with pytest.raises(UserError) as info:
        derive_plan(cfg, 4, ranks_per_node=2, nodes=2, memory_bytes=2 * 2**30)
    assert str(info.value).startswith(
        "checkpoint.async_write: a node's 2 rank(s) would hold 1.2 GiB of memory: "
        "checkpoint.async_write's snapshot of the largest rank's share (model.model_size_bytes="
        "629145600, model.parallelism.zero_stage=3) 1.2 GiB (600.0 MiB per rank); 3 batch "
        "buffers of about 2.0 MiB"), str(info.value)
    assert str(info.value).endswith(
        "more than 80 % of the 1.0 GiB the node can give this job (the node's memory); "
        "expected checkpoint.async_write: false, or more ranks (smaller shares)")
    fits = load_config("demo", [*over, f"model.model_size_bytes={200 * 2**20}"])
    plan = derive_plan(fits, 4, ranks_per_node=2, nodes=2, memory_bytes=2 * 2**30)
    assert plan.checkpoint["snapshot_bytes_per_rank"] == 200 * 2**20
    sync = load_config("demo", over[:2] + [f"model.model_size_bytes={600 * 2**20}"])
    assert derive_plan(sync, 4, ranks_per_node=2, nodes=2,
                       memory_bytes=2 * 2**30).checkpoint["snapshot_bytes_per_rank"] == 0


def test_an_async_snapshot_counts_what_reader_staging_holds():
    """Snapshots of 300 MiB shares and 3 batch buffers of 2 MiB on nodes of 2 ranks and 1 GiB
    take 612 MiB, and replicated staging of 128 files of 1 MiB on each of the 2 ranks 256 MiB:
    each fits under 80 % (819 MiB) alone, not together. read_once holds a node's half of the
    files (64 MiB) and fits."""
    from dlio_mpi.errors import UserError
    from dlio_mpi.plan.derive import derive_plan

    over = ["workflow.checkpoint=true", "model.parallelism.zero_stage=3",
            "checkpoint.async_write=true", "dataset.record_length_bytes_stdev=0",
            "dataset.num_files_train=128", f"model.model_size_bytes={300 * 2**20}"]
    with pytest.raises(UserError) as info:
        derive_plan(load_config("demo", [*over, "reader.staging=replicated"]), 4,
                    ranks_per_node=2, nodes=2, memory_bytes=2 * 2**30)
    assert str(info.value).startswith(
        "checkpoint.async_write: a node's 2 rank(s) would hold 868.1 MiB of memory: "
        "checkpoint.async_write's snapshot of the largest rank's share (model.model_size_bytes="
        "314572800, model.parallelism.zero_stage=3) 600.0 MiB (300.0 MiB per rank); "
        "reader.staging: replicated keeps a copy of the dataset in every rank's memory, "
        "about 256.0 MiB per node"), str(info.value)
    sync = [o for o in over if not o.startswith("checkpoint.async_write")]
    for fits in ([*over], [*over, "reader.staging=read_once"],
                 [*sync, "reader.staging=replicated"]):
        plan = derive_plan(load_config("demo", fits), 4, ranks_per_node=2, nodes=2,
                           memory_bytes=2 * 2**30)
        assert plan.steps_per_epoch == 16, fits


ODD_VALUES = ["-1", "0", "1e30", "99999999999999999999999", "x", "[1e30]", "{a: 1}", "null",
              "''", ".inf", "[1,2,3,4,5,6,7,8,9,10,11,12,13]"]


def test_any_value_of_any_key_is_taken_or_refused_cleanly():
    """Whatever a user sets, loading and planning end in a config and a plan or in the one
    agreed error (ConfigError, UserError), never in an overflow or a crash."""
    from dlio_mpi.config.schema import schema_keys
    from dlio_mpi.errors import UserError
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.plan.render import describe_plan

    small = {"dataset.num_files_train": "8", "dataset.record_length_bytes": "4096",
             "dataset.record_length_bytes_stdev": "0"}
    for key in schema_keys():
        for value in ODD_VALUES:
            over = [f"{k}={v}" for k, v in {**small, key: value}.items()]
            try:
                cfg = load_config("demo", over)
                describe_plan(derive_plan(cfg, 2), cfg)
            except UserError:
                pass


def test_mpiio_backends_take_drop_page_cache_and_the_watchdog():
    from dlio_mpi.config import load_config
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.plan.render import describe_plan

    for access in ("shared", "collective"):
        cfg = load_config("demo", [f"reader.file_access={access}",
                                   "reader.drop_page_cache=true"])
        assert "watchdog" not in describe_plan(derive_plan(cfg, 2), cfg)


def test_mpiio_hints_where_nothing_uses_them_are_noted():
    from dlio_mpi.config import load_config
    from dlio_mpi.plan.derive import derive_plan

    hints = "reader.mpiio_hints={cb_nodes: 2}"
    unused = "reader.mpiio_hints: no effect here"
    assert any(n.startswith(unused) for n in derive_plan(load_config("demo", [hints]), 2).notes)
    for used in (["reader.file_access=shared"],
                 ["dataset.format=npy", "dataset.num_files_train=1",
                  "dataset.num_samples_per_file=8", "workflow.generate_data=true",
                  "reader.read_mode=sample"]):
        plan = derive_plan(load_config("demo", [hints, *used]), 2)
        assert not any(n.startswith(unused) for n in plan.notes), used
