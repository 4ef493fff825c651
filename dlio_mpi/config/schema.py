"""The typed configuration: one frozen dataclass per DLIO section, attribute names = DLIO's
canonical YAML keys, defaults = DLIO's `ConfigArguments` defaults (see the census, section 1.2).

Every field carries a `Rule` (its kind, accepted values, bounds) in its metadata; `build_section`
walks a section class and turns a raw YAML mapping into an instance, and `to_plain` walks an
instance back into plain YAML types. Nothing here is specific to one key: adding a key is
adding one field.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np

from ..errors import UserError
from .timespec import TimeSpec, parse_timespec


class ConfigError(UserError, ValueError):
    """An invalid configuration: one line naming the key, the value and what is accepted."""


DATATYPES = ("int8", "uint8", "fp16", "bf16", "fp32", "fp64")
FORMATS = ("tfrecord", "hdf5", "csv", "npz", "npy", "hdf5_opt", "jpeg", "png",
           "indexed_binary", "mmap_indexed_binary", "synthetic")
DATA_LOADERS = ("tensorflow", "pytorch", "dali", "native_dali", "custom", "none", "synthetic")
SHUFFLES = ("off", "seed", "random")


@dataclass(frozen=True)
class Rule:
    """How one key is read and checked.

    kind: int | number (int or float kept as given) | float | bool | str | dtype (NumPy numeric
    dtype name) | ints / strs (sequences, stored as tuples; strs also takes one string) |
    timespec | section. `unset` is a YAML value that means None (DLIO's -1 sentinels)."""

    kind: str
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    optional: bool = False
    stdev_key: str = ""
    unset: Any = None
    section: type | None = None

    def convert(self, value: Any, path: str, stdev: Any = None, stdev_path: str = "") -> Any:
        """The typed value of `value` at `path`, or ConfigError. `stdev` is the value of a
        timespec's sibling stdev key (at `stdev_path`), when given."""
        if self.kind == "section" and value is None and not self.optional:
            value = {}  # a YAML section header without keys
        if value is None or (self.unset is not None and value == self.unset
                             and not isinstance(value, bool)):
            if self.optional:
                return None
            raise ConfigError(f"{path}: expected {self._expected()}, got {value!r}")
        if self.kind == "section":
            return build_section(self.section, value, path)
        if self.kind == "timespec":
            try:
                return parse_timespec(value, path, stdev, stdev_path)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.kind in ("ints", "strs"):
            if self.kind == "strs" and isinstance(value, str):
                value = [value]
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{path}: expected {self._expected()}, got {value!r}")
            scalar = Rule("int" if self.kind == "ints" else "str", minimum=self.minimum)
            return tuple(scalar.convert(v, f"{path}[{i}]") for i, v in enumerate(value))
        converted = self._scalar(value, path)
        if self.choices and converted not in self.choices:
            raise ConfigError(self._not_a_choice(value, path))
        if self.minimum is not None and converted < self.minimum or (
                self.maximum is not None and converted > self.maximum):
            raise ConfigError(f"{path}: expected {self._expected()}, got {value!r}")
        return converted

    def _scalar(self, value: Any, path: str) -> Any:
        ok: Any = MISSING
        if self.kind == "bool":
            ok = value if isinstance(value, bool) else MISSING
        elif isinstance(value, bool):
            if self.choices and value is False and "off" in self.choices:
                ok = "off"  # YAML 1.1 reads an unquoted `off` as false
        elif self.kind == "int" and isinstance(value, (int, float)):
            ok = int(value) if float(value).is_integer() else MISSING
        elif self.kind in ("number", "float") and isinstance(value, (int, float)):
            if math.isfinite(value):
                ok = float(value) if self.kind == "float" else value
        elif self.kind == "str" and isinstance(value, str):
            ok = value
        elif self.kind == "str" and isinstance(value, (int, float)) and not self.choices:
            ok = str(value)  # e.g. an unquoted numeric model name
        elif self.kind == "dtype" and isinstance(value, str):
            ok = value if _is_numeric_dtype(value) else MISSING
        if ok is MISSING and self.choices:
            raise ConfigError(self._not_a_choice(value, path))
        if ok is MISSING:
            raise ConfigError(f"{path}: expected {self._expected()}, got {value!r}")
        return ok

    def _not_a_choice(self, value: Any, path: str) -> str:
        accepted = ", ".join(str(c) for c in self.choices)
        return f"{path}: {value!r} is not accepted; expected one of: {accepted}"

    def _expected(self) -> str:
        what = {"int": "an integer", "number": "a number", "float": "a number",
                "bool": "true or false", "str": "a string",
                "dtype": "a NumPy numeric type name (e.g. uint8, float32)",
                "ints": "a list of integers", "strs": "a string or a list of strings",
                "section": "a mapping of keys", "timespec": "seconds"}[self.kind]
        bounds = [f">= {self.minimum:g}" if self.minimum is not None else "",
                  f"<= {self.maximum:g}" if self.maximum is not None else ""]
        if any(bounds):
            what += (" (each " if self.kind == "ints" else " ") + " and ".join(
                b for b in bounds if b) + (")" if self.kind == "ints" else "")
        if self.optional:
            what += " or null" if self.unset is None else f" or {self.unset}"
        return what


def _is_numeric_dtype(name: str) -> bool:
    try:
        return np.dtype(name).kind in "iuf"
    except (TypeError, ValueError):
        return False


def key(default: Any, kind: str, **rule: Any) -> Any:
    """A field holding one key."""
    return field(default=default, metadata={"rule": Rule(kind, **rule)})


def section(cls: type, optional: bool = False) -> Any:
    """A field holding a nested section (absent and optional -> None)."""
    rule = Rule("section", optional=optional, section=cls)
    if optional:
        return field(default=None, metadata={"rule": rule})
    return field(default_factory=cls, metadata={"rule": rule})


# --------------------------------------------------------------------------- model
@dataclass(frozen=True)
class Parallelism:
    tensor: int = key(1, "int", minimum=1)
    pipeline: int = key(1, "int", minimum=1)
    data: int = key(-1, "int")  # < 0: comm_size // (tensor * pipeline); > 0 only in subset mode
    zero_stage: int = key(0, "int", choices=(0, 1, 2, 3))


@dataclass(frozen=True)
class Transformer:
    vocab_size: int = key(32000, "int", minimum=1)
    hidden_size: int = key(2048, "int", minimum=1)
    ffn_hidden_size: int = key(8192, "int", minimum=1)
    num_attention_heads: int = key(32, "int", minimum=1)
    num_kv_heads: int = key(8, "int", minimum=1)


@dataclass(frozen=True)
class Model:
    name: str = key("default", "str")
    type: str | None = key(None, "str", optional=True)  # 'transformer': LLM checkpoint sizing
    model_size_bytes: int = key(10240, "int", minimum=0)  # alias: model_size
    optimization_groups: tuple[int, ...] = key((), "ints", minimum=0)  # legacy explicit sizes
    num_layers: int = key(-1, "int")
    layer_parameters: tuple[int, ...] = key((), "ints", minimum=0)  # legacy explicit sizes
    model_datatype: str = key("fp16", "str", choices=DATATYPES)
    optimizer_datatype: str = key("fp32", "str", choices=DATATYPES)
    parallelism: Parallelism = section(Parallelism)
    transformer: Transformer = section(Transformer)


# --------------------------------------------------------------------------- workflow, storage
@dataclass(frozen=True)
class Workflow:
    generate_data: bool = key(False, "bool")
    train: bool = key(True, "bool")
    evaluation: bool = key(False, "bool")
    checkpoint: bool = key(False, "bool")
    profiling: bool = key(False, "bool")
    query: str | None = key(None, "str", optional=True)  # DLIO's query tool only; unused


@dataclass(frozen=True)
class StorageOptions:
    """S3 / AIStore connection settings (DLIO's storage.storage_options)."""

    access_key_id: str | None = key(None, "str", optional=True)
    secret_access_key: str | None = key(None, "str", optional=True)
    endpoint_url: str | None = key(None, "str", optional=True)
    region: str = key("us-east-1", "str")
    s3_force_path_style: bool = key(False, "bool")
    s3_max_attempts: int = key(5, "int", minimum=1)


@dataclass(frozen=True)
class Storage:
    storage_type: str = key("local_fs", "str", choices=("local_fs", "parallel_fs", "s3", "aistore"))
    storage_root: str = key("./", "str")  # prefixed to dataset.data_folder on file systems
    storage_options: StorageOptions | None = section(StorageOptions, optional=True)


# --------------------------------------------------------------------------- dataset
@dataclass(frozen=True)
class Hdf5:
    chunk_dims: tuple[int, ...] = key((), "ints", minimum=1)
    num_dset_per_record: int = key(1, "int", minimum=1)
    max_shape: tuple[int, ...] = key((), "ints", minimum=1)


@dataclass(frozen=True)
class Dataset:
    record_length_bytes: float = key(65536, "number", minimum=0)  # alias: record_length
    record_length_bytes_stdev: float = key(0, "number", minimum=0)  # alias: record_length_stdev
    record_length_bytes_resize: float = key(0, "number", minimum=0)  # alias: record_length_resize
    num_files_train: int = key(8, "int", minimum=0)
    num_files_eval: int = key(0, "int", minimum=0)
    num_samples_per_file: int = key(1, "int", minimum=1)
    generation_buffer_size: int = key(2147483648, "int", minimum=1)
    data_folder: str = key("./data", "str")
    num_subfolders_train: int = key(0, "int", minimum=0)
    num_subfolders_eval: int = key(0, "int", minimum=0)
    file_prefix: str = key("img", "str")
    format: str = key("tfrecord", "str", choices=FORMATS)
    compression: str = key("none", "str", choices=("none", "gzip", "lzf", "bz2", "zip", "xz"))
    compression_level: int = key(4, "int", minimum=0, maximum=9)
    enable_chunking: bool = key(False, "bool")  # DLIO dead key
    chunk_size: int = key(0, "int", minimum=0)  # DLIO dead key
    keep_files: bool = key(True, "bool")
    record_element_type: str = key("uint8", "dtype")
    record_element_bytes: int | None = key(None, "int", optional=True, minimum=1)  # derived
    record_dims: tuple[int, ...] = key((), "ints", minimum=1)
    hdf5: Hdf5 = section(Hdf5)
    # ours: where the samples sit in npy/npz arrays ('first_axis': one sample is one contiguous
    # extent; 'last_axis': DLIO's generator layout)
    sample_layout: str = key("first_axis", "str", choices=("first_axis", "last_axis"))


# --------------------------------------------------------------------------- reader
@dataclass(frozen=True)
class Reader:
    data_loader: str = key("tensorflow", "str", choices=DATA_LOADERS)
    data_loader_classname: str | None = key(None, "str", optional=True)
    data_loader_sampler: str | None = key(None, "str", optional=True,
                                             choices=("iterative", "index", "none"))
    reader_classname: str | None = key(None, "str", optional=True)
    batch_size: int = key(1, "int", minimum=1)
    batch_size_eval: int = key(1, "int", minimum=1)
    read_threads: int = key(1, "int", minimum=0)
    computation_threads: int = key(1, "int", minimum=1)
    prefetch_size: int = key(2, "int", minimum=0)
    pin_memory: bool = key(True, "bool")
    multiprocessing_context: str = key("fork", "str", choices=("fork", "spawn", "forkserver"))
    file_shuffle: str = key("off", "str", choices=SHUFFLES)
    sample_shuffle: str = key("off", "str", choices=SHUFFLES)
    shuffle_size: int = key(1024, "int", minimum=1)
    read_type: str = key("on_demand", "str", choices=("on_demand", "memory"))
    file_access: str = key("multi", "str",  # DLIO dead key
                           choices=("multi", "shared", "collective", "mpio", "posix"))
    transfer_size: int | None = key(None, "int", optional=True, minimum=1)
    dont_use_mmap: bool = key(False, "bool")
    odirect: bool = key(False, "bool")
    preprocess_time: TimeSpec = key(TimeSpec(), "timespec", stdev_key="preprocess_time_stdev")
    transformed_record_dims: tuple[int, ...] = key((), "ints", minimum=1)
    transformed_record_element_type: str = key("uint8", "dtype")
    # ours: how samples are read. 'sample': exact extents; 'file': the whole file per sample
    # (DLIO on_demand); 'file_once': each file once per epoch, samples served from memory (DLIO
    # memory); 'auto': read_type decides, except indexed_binary/mmap_indexed_binary/hdf5 -> sample
    read_mode: str = key("auto", "str", choices=("auto", "sample", "file", "file_once"))
    # ours: how files are opened. 'loader': as the real loader (a whole-file load or a read of
    # a one-sample file opens, probes and closes the file with the loader's system calls;
    # many-sample files read by extent stay open per reader thread until the epoch ends);
    # 'lean': descriptors cached across epochs and one read per request
    access: str = key("loader", "str", choices=("loader", "lean"))
    # ours: descriptors kept open per rank for reads outside whole-file loads, split evenly
    # over the reader threads, each a least-recently-used cache
    fd_cache_size: int = key(256, "int", minimum=1, maximum=2**24)
    # ours: before each epoch, posix_fadvise(DONTNEED) the files it will read, so that the
    # page cache cannot serve them
    drop_page_cache: bool = key(False, "bool")
    # ours: batches land in a ring of (prefetch_size + 1) batch buffers, the host memory a
    # loader's batches take; false: every read lands in one small buffer per reader thread
    # (the same system calls and bytes from storage, without the batches' memory traffic)
    keep_data: bool = key(True, "bool")
    # ours: a read or open that has waited this many seconds (a dead NFS or Lustre server) is
    # reported, naming the rank, the file and the wait; 0: never
    io_watchdog_seconds: float = key(60.0, "float", minimum=0)
    # ours: end the job (every rank, non-zero exit) once the watchdog has reported
    io_watchdog_abort: bool = key(False, "bool")


# --------------------------------------------------------------------------- train, evaluation
@dataclass(frozen=True)
class Train:
    epochs: int = key(1, "int", minimum=1)
    total_training_steps: int = key(-1, "int")  # > 0 caps the steps of each epoch
    computation_time: TimeSpec = key(TimeSpec(), "timespec", stdev_key="computation_time_stdev")
    seed: int = key(123, "int")
    seed_change_epoch: bool = key(True, "bool")
    # ours: the last microseconds of each compute wait are polled rather than slept, hiding the
    # timer's wake-up latency; and the per-step barrier polls (yielding the core) this long
    # before napping. "auto": 1.5 x the wake-up latency measured on each rank at start.
    compute_spin_us: float | None = key(None, "number", optional=True, minimum=0,
                                        unset="auto")
    sync_spin_us: float | None = key(None, "number", optional=True, minimum=0, unset="auto")


@dataclass(frozen=True)
class Evaluation:
    eval_time: TimeSpec = key(TimeSpec(), "timespec", stdev_key="eval_time_stdev")
    eval_after_epoch: int = key(1, "int", minimum=0)
    epochs_between_evals: int = key(1, "int", minimum=1)


# --------------------------------------------------------------------------- checkpoint
@dataclass(frozen=True)
class Ksm:
    """Kernel same-page merging of checkpoint tensors; present (even {}) = enabled."""

    madv_mergeable_id: int = key(12, "int", minimum=0)
    high_ram_trigger: float = key(30.0, "float", minimum=0, maximum=100)
    low_ram_exit: float = key(15.0, "float", minimum=0, maximum=100)
    await_time: float = key(200, "number", minimum=0)


@dataclass(frozen=True)
class Checkpoint:
    checkpoint_folder: str = key("./checkpoints", "str")
    checkpoint_after_epoch: int = key(1, "int", minimum=0)
    epochs_between_checkpoints: int = key(1, "int", minimum=1)
    steps_between_checkpoints: int = key(-1, "int")  # >= 0: step mode; < 0: epoch mode
    type: str = key("rank_zero", "str", choices=("rank_zero", "all_ranks"))  # DLIO dead key
    mode: str = key("default", "str", choices=("default", "subset"))
    fsync: bool = key(False, "bool")
    # checkpoint-only mode: emulated compute between checkpoints; None = unset (DLIO's -1)
    time_between_checkpoints: TimeSpec | None = key(None, "timespec", optional=True, unset=-1)
    num_checkpoints_write: int = key(-1, "int", minimum=-1)
    num_checkpoints_read: int = key(-1, "int", minimum=-1)
    recovery_rank_shift: bool = key(False, "bool")
    rank_sync: bool = key(False, "bool")
    randomize_tensor: bool = key(True, "bool")
    checkpoint_mechanism_classname: str | None = key(None, "str", optional=True)
    ksm: Ksm | None = section(Ksm, optional=True)


# --------------------------------------------------------------------------- output, metric, ...
@dataclass(frozen=True)
class OutputMetric:
    exclude_start_steps: int = key(1, "int", minimum=0)
    exclude_end_steps: int = key(0, "int", minimum=0)


@dataclass(frozen=True)
class Output:
    folder: str = key("output", "str")  # DLIO: the Hydra run dir, else output/
    log_file: str = key("dlio.log", "str")
    metric: OutputMetric = section(OutputMetric)
    access_log: bool = key(False, "bool")  # ours: write which samples each rank read


@dataclass(frozen=True)
class Metric:
    au: float = key(0.90, "float", minimum=0, maximum=1)  # pass threshold of the mean AU


@dataclass(frozen=True)
class Profiling:
    profiler: str = key("iostat", "str", choices=("none", "iostat", "darshan", "tensorboard"))
    iostat_devices: tuple[str, ...] = key((), "strs")


@dataclass(frozen=True)
class Config:
    """A whole workload (DLIO's `workload` mapping), validated and frozen."""

    model: Model = section(Model)
    framework: str = key("tensorflow", "str", choices=("tensorflow", "pytorch"))
    workflow: Workflow = section(Workflow)
    storage: Storage = section(Storage)
    dataset: Dataset = section(Dataset)
    reader: Reader = section(Reader)
    train: Train = section(Train)
    evaluation: Evaluation = section(Evaluation)
    checkpoint: Checkpoint = section(Checkpoint)
    output: Output = section(Output)
    metric: Metric = section(Metric)
    profiling: Profiling = section(Profiling)

    def to_dict(self) -> dict[str, Any]:
        """Every key with its resolved value, canonical names, plain YAML types."""
        return to_plain(self)


# --------------------------------------------------------------------------- generic walkers
def build_section(cls: type, raw: Any, path: str) -> Any:
    """An instance of section class `cls` from the mapping `raw` found at `path` ('' = top)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path or 'the configuration'}: expected a mapping of keys, "
                          f"got {raw!r}")
    rules = {f.name: f.metadata["rule"] for f in fields(cls)}
    siblings = {r.stdev_key: name for name, r in rules.items() if r.stdev_key}
    for name in raw:
        if name not in rules and name not in siblings:
            raise ConfigError(unknown_key_message(_join(path, str(name))))
    values = {}
    for name, rule in rules.items():
        stdev = raw.get(rule.stdev_key) if rule.stdev_key else None
        if name in raw or stdev is not None:
            values[name] = rule.convert(raw.get(name, {}), _join(path, name), stdev,
                                        _join(path, rule.stdev_key))
    return cls(**values)


def to_plain(obj: Any) -> dict[str, Any]:
    """A section instance as a dict of plain YAML types (absent optional sections omitted)."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value, rule = getattr(obj, f.name), f.metadata["rule"]
        if rule.kind == "section":
            if value is not None:
                out[f.name] = to_plain(value)
        elif isinstance(value, TimeSpec):
            out[f.name] = value.to_yaml()
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        else:
            out[f.name] = rule.unset if value is None and rule.unset is not None else value
    return out


def schema_keys(cls: type = Config, path: str = "") -> list[str]:
    """Every dotted key of the schema (sections included), e.g. 'model.parallelism.tensor'."""
    keys = []
    for f in fields(cls):
        rule, where = f.metadata["rule"], _join(path, f.name)
        keys.append(where)
        if rule.stdev_key:
            keys.append(_join(path, rule.stdev_key))
        if rule.kind == "section":
            keys.extend(schema_keys(rule.section, where))
    return keys


def suggest_key(dotted: str) -> str | None:
    """The schema key closest to an unknown `dotted` key: a close name in the same section
    first, then the same or a close name in any section."""
    parent, _, leaf = dotted.rpartition(".")
    best, best_score = None, 0.0
    for candidate in schema_keys():
        c_parent, _, c_leaf = candidate.rpartition(".")
        ratio = difflib.SequenceMatcher(None, leaf, c_leaf).ratio()
        score = ratio + (0.1 if c_parent == parent else 0.0)
        if ratio >= 0.6 and score > best_score:
            best, best_score = candidate, score
    return best


def unknown_key_message(dotted: str) -> str:
    close = suggest_key(dotted)
    if close:
        return f"unknown key '{dotted}'; did you mean '{close}'?"
    parent = dotted.rpartition(".")[0]
    siblings = [k.rpartition(".")[2] for k in schema_keys() if k.rpartition(".")[0] == parent]
    return f"unknown key '{dotted}'; accepted in {parent or 'the top level'}: {', '.join(siblings)}"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
