"""The typed configuration: one frozen dataclass per DLIO section, attribute names = DLIO's
canonical YAML keys, defaults = DLIO's `ConfigArguments` defaults (see the census, section 1.2).

Every field carries a `Rule` (its kind, accepted values, bounds) in its metadata; `build_section`
walks a section class and turns a raw YAML mapping into an instance, and `to_plain` walks an
instance back into plain YAML types. Nothing here is specific to one key: adding a key is
adding one field.

The schema is also the one table of what dlio-mpi does with each DLIO key it does not fully
honour: a rule's `unimplemented` values are refused ("not implemented yet"), and its `inert`
reason (or its section's) says why a value away from the default has no effect; the plan prints
that as a note (`support_notes`). Every other key acts.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import reprlib
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np

from .. import _core
from ..errors import ConfigError
from .timespec import DISTRIBUTIONS, TimeSpec, parse_timespec

DATATYPES = ("int8", "uint8", "fp16", "bf16", "fp32", "fp64")
FORMATS = ("tfrecord", "hdf5", "csv", "npz", "npy", "hdf5_opt", "jpeg", "png",
           "indexed_binary", "mmap_indexed_binary", "synthetic", "parquet")
# DLIO's enum also has 'none', which its loader factory refuses ("not supported")
DATA_LOADERS = ("tensorflow", "pytorch", "dali", "native_dali", "custom", "synthetic")
SHUFFLES = ("off", "seed", "random")
# The most seconds a step's or a sample's emulated time may take (its mean, and each parameter
# in seconds): one day. More is a typo (ms for s, a missing decimal point), not a workload.
MAX_STEP_SECONDS = 86400.0
INT64_MAX = 2**63 - 1
MAX_BYTES = 2**62  # the C engine refuses file offsets past INT64_MAX / 2 (csrc/dio_engine.c)
MAX_FILES = 10**9  # per split
# Bounds of counts no workload comes near, which keep the arithmetic on them exact in int64
# and a typo (an extra digit group) from being taken for a workload
MAX_COUNT = 2**31 - 1   # steps, epochs, samples in a batch or a row group, dimensions
MAX_RANKS = 2**24       # parallelism degrees, ranks sharded over
MAX_CALL_BYTES = 64 << 20  # bytes one read or write call moves: a stop never waits for more
MAX_RATE = 2.0**50       # bytes per second (a PiB/s)
NON_DEFAULT = "non-default"  # Rule.unimplemented: every value but the default is refused
# Rule kind "flag": the strings (and 0, 1) read as a bool, as MLPerf's DLIO fork reads them
_FLAG_TEXT = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

# Where the tf.data pipeline runs (Rule.acts_if of the keys that set it)
TF_DATA = (("reader.engine", ("framework",)), ("reader.data_loader", ("tensorflow",)))
# Reasons shared by whole sections (see Rule.inert)
UNUSED_MEMORY = ("dlio-mpi holds no checkpoint tensors in memory (the C core streams each "
                 "shard from one reused buffer), so there is nothing to merge")
PROFILING = "profilers are not implemented yet"
DEAD = "DLIO never reads it either"
# A whole phrase (support_notes): keys the released DLIO package sets in a workload file and
# never reads (dlio-benchmark 2.0.0's dlrm.yaml; its utils/config.py LoadConfig)
RELEASED_UNREAD = ("as in DLIO 2.0.0 (set in its dlrm.yaml, never read by its configuration "
                   "loader)")
HDF5_ONLY = "dataset.format is not hdf5 (DLIO uses them for hdf5 files only)"
PARQUET_ONLY = "dataset.format is not parquet (they shape parquet files only)"
PARQUET_CODECS = ("snappy", "lz4", "zstd")  # dataset.compression values of parquet alone
# Where the framework loaders hand over decoded items (Rule.acts_if of the keys shaping them)
FRAMEWORK = (("reader.engine", ("framework",)),)
BATCH_COPY = ("it shapes the decoded sample DLIO's readers hand to the framework loader "
              "(reader.engine framework stacks items of that shape); the native engine hands "
              "over the bytes read and makes no decoded copy")

_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlist, _short.maxdict = 60, 60, 8, 8


def short_repr(value: Any) -> str:
    """repr() cut to a readable length for error messages."""
    return _short.repr(value)


@dataclass(frozen=True)
class Rule:
    """How one key is read and checked.

    kind: int | number (int or float kept as given) | float | bool | str | dtype (NumPy numeric
    dtype name) | ints / strs (sequences, stored as tuples; strs also takes one string) |
    timespec | section. `unset` is a YAML value that means None (DLIO's -1 sentinels).
    Integers always fit in int64. `unimplemented`: values refused as not implemented yet
    (NON_DEFAULT: all but the default); `inert`: why a value away from the default has no
    effect in dlio-mpi (completes "because ..."; a reason starting "as in " completes "no
    effect, ...": the key has none in the reference either; a section's reason covers its
    keys); `acts_if`: (dotted key, values) pairs that all hold where the key acts, `inert`
    being the reason it does not elsewhere (a key of one dataset.format); `agrees_with`: a
    top-level key whose value this key's must be wherever this key's value is one of that
    key's choices and the workflow reads data (DLIO's reader.data_loader and framework;
    loader.check_consistency)."""

    kind: str
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    optional: bool = False
    stdev_key: str = ""
    unset: Any = None
    section: type | None = None
    unimplemented: tuple | str = ()
    inert: str = ""
    acts_if: tuple = ()
    agrees_with: str = ""

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
                spec = parse_timespec(value, path, stdev, stdev_path)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if self.maximum is not None:
                _check_time_maximum(spec, path, self.maximum)
            return spec
        if self.kind == "hints":
            return _hints(value, path, self._expected())
        if self.kind == "options":
            return _options(value, path, self._expected())
        if self.kind == "parquet_columns":
            return _parquet_columns(value, path)
        if self.kind in ("ints", "strs"):
            if self.kind == "strs" and isinstance(value, str):
                value = [value]
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{path}: expected {self._expected()}, got {value!r}")
            scalar = Rule("int" if self.kind == "ints" else "str", minimum=self.minimum,
                          maximum=self.maximum)
            return tuple(scalar.convert(v, f"{path}[{i}]") for i, v in enumerate(value))
        converted = self._scalar(value, path)
        if self.choices and converted not in self.choices:
            raise ConfigError(self._not_a_choice(value, path))
        if self.minimum is not None and converted < self.minimum or (
                self.maximum is not None and converted > self.maximum):
            raise ConfigError(f"{path}: expected {self._expected()}, got {short_repr(value)}")
        if self.kind == "int" and not -INT64_MAX - 1 <= converted <= INT64_MAX:
            raise ConfigError(f"{path}: expected {self._expected()} that fits in 64 bits, "
                              f"got {short_repr(value)}")
        if self.kind == "str" and "\0" in converted:
            raise ConfigError(f"{path}: contains a NUL byte, got {short_repr(value)}")
        return converted

    def _scalar(self, value: Any, path: str) -> Any:
        ok: Any = MISSING
        if self.kind == "bool":
            ok = value if isinstance(value, bool) else MISSING
        elif self.kind == "flag":  # a bool, or its spelling as a string or 0/1
            ok = value if isinstance(value, bool) else _FLAG_TEXT.get(
                str(value).strip().lower(), MISSING) if isinstance(value, (str, int)) else \
                MISSING
        elif isinstance(value, bool):
            if self.choices and value is False and "off" in self.choices:
                ok = "off"  # YAML 1.1 reads an unquoted `off` as false
        elif self.kind == "int" and isinstance(value, int):
            ok = value
        elif self.kind == "int" and isinstance(value, float):
            ok = int(value) if value.is_integer() else MISSING
        elif self.kind in ("number", "float") and isinstance(value, (int, float)):
            if _is_finite(value):
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
            raise ConfigError(f"{path}: expected {self._expected()}, got {short_repr(value)}")
        return ok

    def _not_a_choice(self, value: Any, path: str) -> str:
        accepted = ", ".join(str(c) for c in self.choices)
        return f"{path}: {short_repr(value)} is not accepted; expected one of: {accepted}"

    def _expected(self) -> str:
        what = {"int": "an integer", "number": "a number", "float": "a number",
                "bool": "true or false", "flag": "true or false", "str": "a string",
                "dtype": "a NumPy numeric type name (e.g. uint8, float32)",
                "ints": "a list of integers", "strs": "a string or a list of strings",
                "section": "a mapping of keys", "timespec": "seconds",
                "parquet_columns": "a list of columns",
                "hints": "a mapping of MPI-IO hint names to values",
                "options": "a mapping of option names to values"}[self.kind]
        bounds = [f">= {_bound(self.minimum)}" if self.minimum is not None else "",
                  f"<= {_bound(self.maximum)}" if self.maximum is not None else ""]
        if any(bounds):
            what += (" (each " if self.kind == "ints" else " ") + " and ".join(
                b for b in bounds if b) + (")" if self.kind == "ints" else "")
        if self.optional:
            what += " or null" if self.unset is None else f" or {self.unset}"
        return what


def _check_time_maximum(spec: TimeSpec, path: str, maximum: float) -> None:
    """Refuse a time whose mean or any parameter in seconds (all but gamma's shape) exceeds
    `maximum`: a step's or a sample's time is seconds, not days."""
    names = DISTRIBUTIONS[spec.type]
    over = [(name, v) for name, v in zip(names, spec.params) if name != "shape" and v > maximum]
    if over:
        name, v = over[0]
        got = f"{v:g}" if spec.is_constant else f"{path}.{name} {v:g}"
    elif spec.mean > maximum:
        got = f"a {spec.type} time of mean {spec.mean:g}"
    if over or spec.mean > maximum:
        raise ConfigError(f"{path}: expected at most {maximum:g} seconds (one day), got {got}")


def _bound(x: float) -> str:
    """A bound as a person reads it: 2^20 for large powers of two, integers in full."""
    if float(x).is_integer():
        n = int(x)
        if n >= 2**20 and n & (n - 1) == 0:
            return f"2^{n.bit_length() - 1}"
        if n >= 2**20 and n & (n + 1) == 0:
            return f"2^{n.bit_length()} - 1"
        return str(n)
    return f"{x:g}"


def _is_finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past the float range
        return False


def _is_numeric_dtype(name: str) -> bool:
    try:
        return np.dtype(name).kind in "iuf"
    except (TypeError, ValueError):
        return False


def _hints(value: Any, path: str, expected: str) -> tuple[tuple[str, str], ...]:
    """MPI info hints as (name, value) strings; YAML booleans as MPI spells them."""
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected {expected}, got {value!r}")
    hints = []
    for name, hint in value.items():
        if not isinstance(name, str) or not name or not isinstance(hint, (str, int, float)):
            raise ConfigError(f"{path}: expected {expected}, got {name!r}: {hint!r}")
        text = ("true" if hint else "false") if isinstance(hint, bool) else str(hint)
        hints.append((name, text))
    return tuple(hints)


def _options(value: Any, path: str, expected: str) -> tuple[tuple[str, Any], ...]:
    """A free-form mapping of names to scalars, as (name, value) pairs (hashable, frozen)."""
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected {expected}, got {short_repr(value)}")
    for name, option in value.items():
        if not isinstance(name, str) or not isinstance(option, (str, int, float, bool)):
            raise ConfigError(f"{path}.{name}: expected a string, number or boolean, "
                              f"got {short_repr(option)}")
    return tuple(value.items())


def key(default: Any, kind: str, **rule: Any) -> Any:
    """A field holding one key."""
    return field(default=default, metadata={"rule": Rule(kind, **rule)})


def section(cls: type, optional: bool = False, inert: str = "", acts_if: tuple = ()) -> Any:
    """A field holding a nested section (absent and optional -> None)."""
    rule = Rule("section", optional=optional, section=cls, inert=inert, acts_if=acts_if)
    if optional:
        return field(default=None, metadata={"rule": rule})
    return field(default_factory=cls, metadata={"rule": rule})


# --------------------------------------------------------------------------- model
@dataclass(frozen=True)
class Parallelism:
    tensor: int = key(1, "int", minimum=1, maximum=MAX_RANKS)
    pipeline: int = key(1, "int", minimum=1, maximum=MAX_RANKS)
    # < 0: comm_size // (tensor * pipeline); > 0 only in subset mode
    data: int = key(-1, "int", minimum=-1, maximum=MAX_RANKS)
    zero_stage: int = key(0, "int", choices=(0, 1, 2, 3))


@dataclass(frozen=True)
class Transformer:
    vocab_size: int = key(32000, "int", minimum=1, maximum=MAX_COUNT)
    hidden_size: int = key(2048, "int", minimum=1, maximum=2**20)
    ffn_hidden_size: int = key(8192, "int", minimum=1, maximum=2**22)
    num_attention_heads: int = key(32, "int", minimum=1, maximum=2**16)
    num_kv_heads: int = key(8, "int", minimum=1, maximum=2**16)


@dataclass(frozen=True)
class Model:
    name: str = key("default", "str")
    # The rest sizes checkpoints (checkpoint/sizing.py).
    type: str | None = key(None, "str", optional=True)  # 'transformer': LLM checkpoint sizing
    model_size_bytes: int = key(10240, "int", minimum=0, maximum=MAX_BYTES)  # alias: model_size
    # legacy explicit sizes
    optimization_groups: tuple[int, ...] = key((), "ints", minimum=0, maximum=MAX_BYTES)
    num_layers: int = key(-1, "int", minimum=-1, maximum=2**20)  # -1: unset
    layer_parameters: tuple[int, ...] = key((), "ints", minimum=0, maximum=MAX_BYTES)
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
    profiling: bool = key(False, "bool", inert=PROFILING)
    query: str | None = key(None, "str", optional=True,
                            inert="only DLIO's dlio_benchmark_query tool reads it")
    debug: bool = key(False, "bool", inert="it only sets DLIO 2.0.0's log level to DEBUG "
                                           "(later DLIO never reads it), and dlio-mpi's log "
                                           "has no levels")
    # dlrm.yaml's spelling of workflow.evaluation: DLIO 2.0.0 runs its dlrm without evaluation
    do_eval: bool | None = key(None, "bool", optional=True, inert=RELEASED_UNREAD)


# The object-storage client libraries of MLPerf Storage's DLIO (its StorageLibrary)
STORAGE_LIBRARIES = ("s3torchconnector", "s3dlio", "minio")
OBJECT_STORAGE = ("s3", "aistore")  # storage.storage_type values that are not file systems
OBJECT_STORAGE_ONLY = "it configures object storage, which is not implemented yet"
# storage.storage_type direct_fs: storage_library s3dlio and storage_options' uri_scheme
# direct name its O_DIRECT mode, which reader.odirect gives (config.loader checks them)
DIRECT_FS = (("storage.storage_type", ("direct_fs",)),)


STRIPE_SIZE_UNIT = 64 * 1024  # lfs: a stripe size is a multiple of 64 KiB, below 4 GiB
_SIZE_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def _stripe_size_bytes(text: str, path: str) -> int:
    """A stripe size as lfs takes it, in bytes: '1048576', '4M', '512k' (binary suffixes)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", text)
    size = int(match[1]) * _SIZE_SUFFIXES[match[2].upper()] if match else 0
    if not match or size % STRIPE_SIZE_UNIT or not 0 < size < 2**32:
        raise ConfigError(f"{path}: expected a size in bytes, or with a suffix K, M or G "
                          f"(binary), that is a multiple of 64K below 4G, got {short_repr(text)}")
    return size


@dataclass(frozen=True)
class Lustre:
    """Ours: the Lustre layout set with `lfs setstripe` on the data folder and the checkpoint
    folder before files are created (filesystems.apply_striping). Unset keys keep lfs's
    defaults."""

    stripe_count: int | None = key(None, "int", optional=True, minimum=-1,  # -1: all OSTs
                                   maximum=2000)  # Lustre's LOV_MAX_STRIPE_COUNT
    stripe_size: int | None = key(None, "str", optional=True)  # bytes, or "4M"; stored as bytes
    pool: str | None = key(None, "str", optional=True)  # an OST pool: "flash" or "fsname.flash"
    # true: a data or checkpoint folder that is not on Lustre, or a layout lfs cannot set,
    # is an error
    required: bool = key(False, "bool")

    def __post_init__(self) -> None:
        if self.stripe_size is not None:
            object.__setattr__(self, "stripe_size", _stripe_size_bytes(
                str(self.stripe_size), "storage.lustre.stripe_size"))
        if self.pool is not None and not re.fullmatch(r"[\w.-]{1,64}", self.pool):
            raise ConfigError(f"storage.lustre.pool: expected an OST pool name (letters, "
                              f"digits, '_', '-', '.'), got {short_repr(self.pool)}")


@dataclass(frozen=True)
class StageIn:
    """Ours: before training, copy the dataset to a faster tier and read it there
    (tiers/stage_in.py)."""

    to: str = key("", "str")  # the stage folder (a burst buffer; node-local with scope node)
    scope: str = key("job", "str", choices=("job", "node"))  # one copy, or one per node
    odirect: bool = key(False, "bool")  # read the source and write the copy with O_DIRECT
    # bytes per read and write call, and the largest piece of a file one rank copies
    buffer_bytes: int = key(64 << 20, "int", minimum=4096, maximum=MAX_CALL_BYTES)
    # drop each source piece from the page cache before reading it (posix_fadvise), so the
    # copy reads storage, not memory
    drop_page_cache: bool = key(True, "bool")
    clean: bool = key(False, "bool")  # remove the staged copy after the run

    def __post_init__(self) -> None:
        if not self.to.strip():
            raise ConfigError("storage.stage_in.to: expected the folder to copy the dataset "
                              "to (a burst buffer, or node-local storage with scope: node)")
        if self.buffer_bytes % 4096:
            raise ConfigError(f"storage.stage_in.buffer_bytes: expected a multiple of 4096 "
                              f"(direct I/O's alignment), got {self.buffer_bytes}")


@dataclass(frozen=True)
class Storage:
    # local_fs and parallel_fs: both a POSIX path (DLIO 2.0.0 has no branch for parallel_fs);
    # direct_fs (MLPerf's DLIO fork, mlpstorage --o-direct): a file system read with O_DIRECT
    # (s3dlio's direct:// mode there; config.loader.direct_fs_reads_direct here)
    storage_type: str = key("local_fs", "str", choices=("local_fs", "parallel_fs", "direct_fs",
                                                        "s3", "aistore"),
                            unimplemented=("s3", "aistore"))
    storage_root: str = key("./", "str")  # prefixed to dataset.data_folder on file systems
    # MLPerf Storage's DLIO: the client library of storage_type s3 (no effect on file systems)
    storage_library: str | None = key(None, "str", optional=True, choices=STORAGE_LIBRARIES,
                                      inert=OBJECT_STORAGE_ONLY, acts_if=DIRECT_FS)
    # DLIO's free-form mapping handed to the object-storage library (endpoint_url, region,
    # credentials, ...): any option names, kept as (name, value) pairs, never shown (secrets)
    storage_options: tuple | None = key(None, "options", optional=True,
                                        inert=OBJECT_STORAGE_ONLY, acts_if=DIRECT_FS)
    lustre: Lustre | None = section(Lustre, optional=True)  # ours
    stage_in: StageIn | None = section(  # ours
        StageIn, optional=True, acts_if=(("workflow.train", (True,)),),
        inert="it copies the dataset for the training epochs that read it, and "
              "workflow.train is false")


# --------------------------------------------------------------------------- dataset
@dataclass(frozen=True)
class Hdf5:
    chunk_dims: tuple[int, ...] = key((), "ints", minimum=1, maximum=MAX_COUNT)
    num_dset_per_record: int = key(1, "int", minimum=1, maximum=2**16)
    max_shape: tuple[int, ...] = key((), "ints", minimum=1, maximum=MAX_COUNT)


# dataset.parquet.columns[i].dtype: the numeric types and bool of MLPerf's DLIO fork
# (mlcommons/DLIO_local_changes, data_generator/parquet_generator.py)
PARQUET_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                  "uint16", "uint32", "uint64", "bool")
# the fork's other column types, of content-dependent sizes (strings) or unused by MLPerf
PARQUET_DTYPES_LATER = ("string", "binary", "list")
PARQUET_COLUMN_KEYS = ("name", "dtype", "size", "read")


@dataclass(frozen=True)
class ParquetColumn:
    """One column of dataset.parquet.columns: `size` values of `dtype` a row (a scalar when
    1, else a fixed-size list), read in training when `read`."""

    name: str
    dtype: str = "float32"  # the fork's default
    size: int = 1
    read: bool = True

    @property
    def row_bytes(self) -> int:
        """Bytes of one row's values (bool: numpy's byte; parquet packs it in a bit)."""
        return int(np.dtype(self.dtype).itemsize) * self.size

    def to_yaml(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "size": self.size, "read": self.read}


def _parquet_dtype(value: Any, path: str) -> str:
    """A column's dtype: one of PARQUET_DTYPES; the fork's others are not implemented yet."""
    dtype = Rule("str").convert(value, path)
    if dtype in PARQUET_DTYPES_LATER:
        raise ConfigError(f"{path}: {dtype!r} is not implemented yet in dlio-mpi; accepted: "
                          f"{', '.join(PARQUET_DTYPES)}")
    if dtype not in PARQUET_DTYPES:
        raise ConfigError(f"{path}: {short_repr(dtype)} is not accepted; expected one of: "
                          f"{', '.join(PARQUET_DTYPES)} ({', '.join(PARQUET_DTYPES_LATER)}: "
                          "not implemented yet in dlio-mpi)")
    return dtype


def _parquet_columns(value: Any, path: str) -> tuple[ParquetColumn, ...]:
    """dataset.parquet.columns: a list of {name, dtype, size, read} mappings."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{path}: expected a list of columns ({{name, dtype, size, read}}), "
                          f"got {short_repr(value)}")
    columns, names = [], set()
    for i, raw in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a mapping with keys "
                              f"{', '.join(PARQUET_COLUMN_KEYS)}, got {short_repr(raw)}")
        for name in raw:
            if name not in PARQUET_COLUMN_KEYS:
                raise ConfigError(f"unknown key '{where}.{name}'; accepted in {where}: "
                                  f"{', '.join(PARQUET_COLUMN_KEYS)}")
        if "name" not in raw:
            raise ConfigError(f"{where}.name: expected a column name, got none")
        column = ParquetColumn(
            Rule("str").convert(raw["name"], f"{where}.name"),
            _parquet_dtype(raw.get("dtype", "float32"), f"{where}.dtype"),
            Rule("int", minimum=1, maximum=2**31 - 1).convert(raw.get("size", 1), f"{where}.size"),
            Rule("bool").convert(raw.get("read", True), f"{where}.read"))
        if column.dtype == "bool" and column.size != 1:
            raise ConfigError(f"{where}.size: bool columns hold one value a row (MLPerf's fork "
                              f"writes them so), got {column.size}; expected 1")
        if not column.name or column.name in names:
            raise ConfigError(f"{where}.name: {column.name!r} is "
                              f"{'empty' if not column.name else 'named twice'}; expected "
                              "a name of its own")
        names.add(column.name)
        columns.append(column)
    return tuple(columns)


@dataclass(frozen=True)
class Parquet:
    # rows (samples) per row group, the read unit: MLPerf's DLIO fork's key and default
    # (its ConfigArguments.parquet_row_group_size); a file of fewer rows is one group
    row_group_size: int = key(1024, "int", minimum=1, maximum=MAX_COUNT)
    # the fork's: rows generated and handed to one write_table call (0: row_group_size);
    # each call starts its own row groups, so it can cut them shorter
    generation_batch_size: int = key(0, "int", minimum=0, maximum=MAX_COUNT)
    # the fork's: how training reads the files; both read row groups (see formats/parquet.py)
    read_mode: str = key("default", "str", choices=("default", "row_group"))
    # the fork's: generate through s3dlio's generator; ours writes the same files
    use_s3dlio_gen: bool = key(False, "bool",
                               inert="dlio-mpi's own generator writes the same files (its "
                                     "columns and row groups) as s3dlio's would")
    # the fork's: the columns of every file, each row a sample; () = one fixed_size_binary
    # column 'data' of the sample's bytes (dlio-mpi's layout before the fork had columns)
    columns: tuple[ParquetColumn, ...] = key((), "parquet_columns")


@dataclass(frozen=True)
class Dataset:
    # alias: record_length. 0 has no meaning: DLIO makes it 1-byte samples (or divides by
    # zero with a stdev). Sizes stay below the 2^62 bytes the C engine addresses in a file.
    record_length_bytes: float = key(65536, "number", minimum=1, maximum=MAX_BYTES)
    record_length_bytes_stdev: float = key(0, "number", minimum=0,  # alias: record_length_stdev
                                           maximum=MAX_BYTES)
    record_length_bytes_resize: float = key(0, "number", minimum=0,  # alias: record_length_resize
                                            maximum=MAX_BYTES, inert=BATCH_COPY,
                                            acts_if=FRAMEWORK)
    # Every rank keeps a few bytes per file (drawn shapes, spot checks): 10^9 files is far
    # beyond any data set a file system holds in one folder tree, and beyond memory at scale.
    num_files_train: int = key(8, "int", minimum=0, maximum=MAX_FILES)
    num_files_eval: int = key(0, "int", minimum=0, maximum=MAX_FILES)
    # DLIO 2.0.0's dlrm holds 4,195,198,976 samples in one file; plan.checks bounds the
    # split's samples (2^62 ids) and bytes
    num_samples_per_file: int = key(1, "int", minimum=1, maximum=MAX_BYTES)
    generation_buffer_size: int = key(
        2147483648, "int", minimum=1, maximum=MAX_BYTES,
        inert="it sizes the writes of DLIO's indexed_binary generator; the C generator "
              "streams in chunks of its own")
    data_folder: str = key("./data", "str")
    num_subfolders_train: int = key(0, "int", minimum=0, maximum=MAX_FILES)
    num_subfolders_eval: int = key(0, "int", minimum=0, maximum=MAX_FILES)
    file_prefix: str = key("img", "str")
    format: str = key("tfrecord", "str", choices=FORMATS)
    # hdf5 files are generated compressed (gzip, lzf) as DLIO writes them, parquet files with
    # pyarrow's codecs (PARQUET_CODECS: parquet only, refused for other formats by
    # loader.check_consistency); other formats' compression (npz: zip; csv) is not implemented
    compression: str = key("none", "str", choices=("none", "gzip", "lzf", "bz2", "zip", "xz",
                                                   *PARQUET_CODECS),
                           unimplemented=("bz2", "zip", "xz"), inert=HDF5_ONLY,
                           acts_if=(("dataset.format", ("hdf5", "parquet")),))
    compression_level: int = key(4, "int", minimum=0, maximum=9,
                                 inert="only gzip has a level (dataset.format hdf5, "
                                       "dataset.compression gzip)",
                                 acts_if=(("dataset.format", ("hdf5",)),
                                          ("dataset.compression", ("gzip",))))
    enable_chunking: bool = key(False, "bool", inert=DEAD)
    chunk_size: int = key(0, "int", minimum=0, maximum=MAX_BYTES, inert=DEAD)
    keep_files: bool = key(True, "bool")
    record_element_type: str = key("uint8", "dtype")
    record_element_bytes: int | None = key(
        None, "int", optional=True, minimum=1, maximum=64,
        inert="the element size is dataset.record_element_type's, as DLIO derives it")
    record_dims: tuple[int, ...] = key((), "ints", minimum=1, maximum=MAX_COUNT)
    hdf5: Hdf5 = section(Hdf5, inert=HDF5_ONLY, acts_if=(("dataset.format", ("hdf5",)),))
    parquet: Parquet = section(Parquet, inert=PARQUET_ONLY,
                               acts_if=(("dataset.format", ("parquet",)),))
    # ours: where the samples sit in npy/npz arrays ('first_axis': one sample is one contiguous
    # extent; 'last_axis': DLIO's generator layout)
    sample_layout: str = key("first_axis", "str", choices=("first_axis", "last_axis"))
    # MLPerf's DLIO fork (main.py; mlpstorage sets both on every datagen and run): the file
    # list from DLIO's naming convention instead of a listing of the data folder, rank 0
    # checking that the first, the last and every listing_validation_interval-th file exist
    # (0: none); a string ("True", "false") is read as a bool, as the fork reads it
    skip_listing: bool = key(False, "flag")
    listing_validation_interval: int = key(
        1000, "int", minimum=0, maximum=MAX_FILES,
        inert="it sets how many files dataset.skip_listing checks, and skip_listing is false",
        acts_if=(("dataset.skip_listing", (True,)),))
    # evaluation files hold num_samples_per_file samples, as every file does
    eval_num_samples_per_file: int | None = key(None, "int", optional=True, minimum=0,
                                                maximum=MAX_BYTES, inert=RELEASED_UNREAD)


# --------------------------------------------------------------------------- reader
@dataclass(frozen=True)
class ReaderCache:
    """Ours: a node-local caching tier shared by the node's ranks (tiers/cache.py)."""

    folder: str = key("", "str")  # node-local storage (folder/node<k> on emulated nodes)
    # None: the folder's free space
    capacity_bytes: int | None = key(None, "int", optional=True, minimum=1, maximum=MAX_BYTES)
    policy: str = key("none", "str", choices=("none", "lru"))

    def __post_init__(self) -> None:
        if not self.folder.strip():
            raise ConfigError("reader.cache.folder: expected the node-local folder the cache "
                              "keeps its copies in")


@dataclass(frozen=True)
class Reader:
    # pytorch and tensorflow: with reader.engine native, the native engine reads with that
    # DLIO reader's access pattern (plan.loader_note); with engine framework the real loader
    # runs (pytorch: readers/torch_loader.py). The others run Python or DALI code dlio-mpi
    # does not have. One naming a framework is the workload's framework
    data_loader: str = key("tensorflow", "str", choices=DATA_LOADERS,
                           unimplemented=("dali", "native_dali", "custom", "synthetic"),
                           agrees_with="framework")
    # ours: what reads. native: the C engine or MPI-IO (reader.file_access) with the access
    # pattern of DLIO's reader; framework: the real loader reader.data_loader names, in this
    # process and its workers (the combinations readers.FRAMEWORK_LOADERS lists; the others
    # are refused before any I/O)
    engine: str = key("native", "str", choices=("native", "framework"))
    # when set, DLIO runs this user class whatever data_loader says
    data_loader_classname: str | None = key(None, "str", optional=True,
                                            unimplemented=NON_DEFAULT)
    data_loader_sampler: str | None = key(
        None, "str", optional=True, choices=("iterative", "index", "none"),
        inert="the native engine deals every rank an exact share of each epoch's samples "
              "(reader.sample_shuffle, reader.file_shuffle), whatever DLIO's sampler would be")
    reader_classname: str | None = key(None, "str", optional=True, unimplemented=NON_DEFAULT)
    batch_size: int = key(1, "int", minimum=1, maximum=MAX_COUNT)
    batch_size_eval: int = key(1, "int", minimum=1, maximum=MAX_COUNT)
    read_threads: int = key(1, "int", minimum=0, maximum=_core.MAX_THREADS)
    computation_threads: int = key(
        1, "int", minimum=1, maximum=_core.MAX_THREADS,
        inert="it sets the threads of the batch map in DLIO's tf.data TFRecord pipeline, a "
              "stage the native engine does not have (reader.engine framework with "
              "reader.data_loader tensorflow runs it)",
        acts_if=TF_DATA)
    prefetch_size: int = key(2, "int", minimum=0, maximum=2**20)  # dio_engine_open's limit
    # act with reader.engine framework (the torch DataLoader's); with engine native the plan
    # notes them (plan._engine_notes)
    pin_memory: bool = key(True, "bool")
    multiprocessing_context: str = key("fork", "str", choices=("fork", "spawn", "forkserver"))
    file_shuffle: str = key("off", "str", choices=SHUFFLES)
    sample_shuffle: str = key("off", "str", choices=SHUFFLES)
    shuffle_size: int = key(
        1024, "int", minimum=1, maximum=MAX_COUNT,
        inert="it sizes the shuffle buffer of DLIO's tf.data TFRecord pipeline, which runs with "
              "reader.engine framework, reader.data_loader tensorflow, dataset.format "
              "tfrecord and reader.sample_shuffle on; the native engine shuffles whole epochs "
              "(reader.sample_shuffle)",
        acts_if=(*TF_DATA, ("dataset.format", ("tfrecord",)),
                 ("reader.sample_shuffle", ("seed", "random"))))
    read_type: str = key("on_demand", "str", choices=("on_demand", "memory"))
    # DLIO validates it and never reads it; here it picks the reader backend (readers/):
    # multi (posix): the native C engine; shared (mpio): MPI-IO independent reads; collective:
    # one MPI-IO collective read per file and step
    file_access: str = key("multi", "str",
                           choices=("multi", "shared", "collective", "mpio", "posix"))
    # ours: MPI info hints given at every MPI-IO File.Open (striping_factor, cb_buffer_size,
    # romio_cb_read, ...); what the library kept is read back into summary.json
    mpiio_hints: tuple = key((), "hints")
    transfer_size: int | None = key(
        None, "int", optional=True, minimum=1, maximum=MAX_CALL_BYTES,
        inert="it is the buffer_size of DLIO's tf.data TFRecordDataset, which streams "
              "TFRecord files only (reader.engine framework runs it; the native engine reads "
              "whole TFRecord files in reads of that size)",
        acts_if=(("dataset.format", ("tfrecord",)),))
    dont_use_mmap: bool = key(False, "bool",
                              inert="only DLIO's native DALI readers use it, and "
                                    "reader.data_loader native_dali is not implemented yet")
    odirect: bool = key(False, "bool")
    # slept per sample by the reader thread after the sample's read, before its batch is
    # ready (a loader's preprocessing, overlapping compute; MPI-IO: after the batch's reads)
    preprocess_time: TimeSpec = key(TimeSpec(), "timespec", stdev_key="preprocess_time_stdev",
                                    maximum=MAX_STEP_SECONDS)
    # ours: per sample, CPU time the reader thread spends after the sample's read (and
    # preprocess_time's sleep) before its batch is ready: a loader's decode and transform as
    # CPU work, which contends for the cores with the other readers, the kernel and the step
    # loop as the real work does (`dlio-mpi calibrate` measures it); the native C engine's
    preprocess_cpu_time: TimeSpec = key(TimeSpec(), "timespec",
                                        stdev_key="preprocess_cpu_time_stdev",
                                        maximum=MAX_STEP_SECONDS)
    # ours: per step, CPU time the training process spends taking its batch from the loader
    # (receiving it from the worker processes, collating, pinning), on the step loop's thread
    # once the batch is there, before the compute: not compute, so it lowers AU as it does in
    # the real job (`dlio-mpi calibrate` measures it)
    step_cpu_time: TimeSpec = key(TimeSpec(), "timespec", stdev_key="step_cpu_time_stdev",
                                  maximum=MAX_STEP_SECONDS)
    # ours: per step, then, time the training process waits taking a batch that is ready
    # (its hand-over from a worker process: the batch's shared memory passed between
    # processes, which needs the worker's threads), slept on the step loop's thread: not
    # compute either (`dlio-mpi calibrate` measures it)
    step_wait_time: TimeSpec = key(TimeSpec(), "timespec", stdev_key="step_wait_time_stdev",
                                   maximum=MAX_STEP_SECONDS)
    # ours: seconds the loader takes to start in each phase's first epoch (a DataLoader's
    # persistent worker processes starting): the reader threads begin reading that long after
    # the epoch's start; the native C engine's
    startup_time: float = key(0.0, "float", minimum=0, maximum=3600)
    transformed_record_dims: tuple[int, ...] = key((), "ints", minimum=1, maximum=MAX_COUNT,
                                                   inert=BATCH_COPY,
                                                   acts_if=FRAMEWORK)
    transformed_record_element_type: str = key("uint8", "dtype", inert=BATCH_COPY,
                                               acts_if=FRAMEWORK)
    # ours: how samples are read. 'sample': exact extents (parquet: row groups); 'file': the
    # whole file per sample (DLIO on_demand); 'file_once': each file once per epoch, samples
    # served from memory (DLIO memory); 'auto': read_type decides, except
    # indexed_binary/mmap_indexed_binary/hdf5 (and parquet with reader.engine native) -> sample
    read_mode: str = key("auto", "str", choices=("auto", "sample", "file", "file_once"))
    # ours: how files are opened. 'loader': as the real loader (a whole-file load or a read of
    # a one-sample file opens, probes and closes the file with the loader's system calls;
    # many-sample files read by extent stay open per reader thread until the epoch ends);
    # 'lean': descriptors cached across epochs and one read per request
    access: str = key("loader", "str", choices=("loader", "lean"))
    # ours: the order of each batch's reads. 'shuffled': the epoch order's (today's); 'sorted':
    # each batch's samples read by (file, offset), the same samples per batch (sampling/sharding.py)
    access_order: str = key("shuffled", "str", choices=("shuffled", "sorted"))
    # ours: descriptors kept open per rank for reads outside whole-file loads, split evenly
    # over the reader threads, each a least-recently-used cache
    fd_cache_size: int = key(256, "int", minimum=1, maximum=2**24)  # dio_engine_open's limit
    # ours: before each epoch, posix_fadvise(DONTNEED) the files it will read, so that the
    # page cache cannot serve them
    drop_page_cache: bool = key(False, "bool")
    # ours: batches land in a ring of (prefetch_size + 1) batch buffers, the host memory a
    # loader's batches take; false: every read lands in one small buffer per reader thread
    # (the same system calls and bytes from storage, without the batches' memory traffic)
    keep_data: bool = key(True, "bool")
    # ours: a read or open that has waited this many seconds (a dead NFS or Lustre server) is
    # reported, naming the rank, the file and the wait; 0: never
    io_watchdog_seconds: float = key(60.0, "float", minimum=0, maximum=2**33 - 1)
    # ours: end the job (every rank, non-zero exit) once the watchdog has reported
    io_watchdog_abort: bool = key(False, "bool")
    # ours: a node-local caching tier (tiers/cache.py); the native C engine's
    cache: ReaderCache | None = section(ReaderCache, optional=True)
    # ours: read_once: every file read once for the job into the ranks' memory, batches
    # served from there through an MPI exchange per step (readers/read_once.py); replicated:
    # every rank reads every file into its own memory, batches served from its copy
    # (readers/replicated.py)
    staging: str = key("none", "str", choices=("none", "read_once", "replicated"))
    # ours: how training draws its samples: epoch (each sample once per epoch, DLIO's) or
    # replacement (each rank draws uniformly from all samples: sharding.rank_draws)
    sampling: str = key("epoch", "str", choices=("epoch", "replacement"))


# --------------------------------------------------------------------------- train, evaluation
@dataclass(frozen=True)
class Train:
    # the results keep a record per epoch and rank: plan.checks counts them in rank 0's memory
    epochs: int = key(1, "int", minimum=1, maximum=MAX_COUNT)
    # > 0 caps the steps of each epoch; -1 (DLIO's) and 0: no cap
    total_training_steps: int = key(-1, "int", minimum=-1, maximum=MAX_COUNT)
    computation_time: TimeSpec = key(TimeSpec(), "timespec",
                                     stdev_key="computation_time_stdev",
                                     maximum=MAX_STEP_SECONDS)
    seed: int = key(123, "int", minimum=0, maximum=2**32 - 1)  # as np.random.seed (DLIO)
    seed_change_epoch: bool = key(True, "bool")
    # ours: the last microseconds of each compute wait are polled rather than slept, hiding the
    # timer's wake-up latency; and the per-step barrier polls (yielding the core) this long
    # before napping. "auto": 1.5 x the wake-up latency measured on each rank at start.
    # At most a second: the C pacer and barrier take int64 nanoseconds.
    compute_spin_us: float | None = key(None, "number", optional=True, minimum=0,
                                        maximum=1e6, unset="auto")
    sync_spin_us: float | None = key(None, "number", optional=True, minimum=0, maximum=1e6,
                                     unset="auto")
    # ours: a step whose batch the read threads are still reading polls for it (yielding the
    # core) this long before sleeping. "auto": 2 ms where the host's step loops, read threads
    # and checkpoint writers have a CPU each and no loader costs are modelled, else 0
    # (mpi/pacing.py)
    batch_spin_us: float | None = key(None, "number", optional=True, minimum=0, maximum=1e6,
                                      unset="auto")
    total_eval_steps: int | None = key(None, "int", optional=True, minimum=-1,
                                       maximum=MAX_COUNT, inert=RELEASED_UNREAD)


@dataclass(frozen=True)
class Evaluation:
    eval_time: TimeSpec = key(TimeSpec(), "timespec", stdev_key="eval_time_stdev",
                              maximum=MAX_STEP_SECONDS)
    eval_after_epoch: int = key(1, "int", minimum=0, maximum=MAX_COUNT)
    epochs_between_evals: int = key(1, "int", minimum=1, maximum=MAX_COUNT)
    # evaluations come between epochs (epochs_between_evals), never between steps
    steps_between_evals: int | None = key(None, "int", optional=True, minimum=-1,
                                          maximum=MAX_COUNT, inert=RELEASED_UNREAD)


# --------------------------------------------------------------------------- checkpoint
@dataclass(frozen=True)
class Ksm:
    """Kernel same-page merging of checkpoint tensors; present (even {}) = enabled."""

    madv_mergeable_id: int = key(12, "int", minimum=0, maximum=MAX_COUNT)
    high_ram_trigger: float = key(30.0, "float", minimum=0, maximum=100)
    low_ram_exit: float = key(15.0, "float", minimum=0, maximum=100)
    await_time: float = key(200, "number", minimum=0, maximum=MAX_STEP_SECONDS)


@dataclass(frozen=True)
class Drain:
    """Ours: each checkpoint, once written to checkpoint_folder (the fast tier: a burst
    buffer, node-local NVMe), copied in the background to `to` (the parallel file system)
    by the C copy engine (checkpoint/drain.py)."""

    to: str = key("", "str")
    # which checkpoints stay on the fast tier once drained: all, the last one, none
    keep: str = key("all", "str", choices=("all", "last", "none"))
    restore_from: str = key("fast_tier", "str", choices=("fast_tier", "pfs"))
    odirect: bool = key(False, "bool")  # read the fast tier's files and write the copies so
    # bytes per read and write call
    buffer_bytes: int = key(64 << 20, "int", minimum=4096, maximum=MAX_CALL_BYTES)

    def __post_init__(self) -> None:
        if not self.to.strip():
            raise ConfigError("checkpoint.drain.to: expected the folder to drain checkpoints "
                              "to (on the parallel file system)")
        if self.buffer_bytes % 4096:
            raise ConfigError(f"checkpoint.drain.buffer_bytes: expected a multiple of 4096 "
                              f"(direct I/O's alignment), got {self.buffer_bytes}")


@dataclass(frozen=True)
class Content:
    """Ours: what checkpoints' bytes are made of (checkpoint/content.py). By default every
    4 KiB is fresh and incompressible, so no storage can shortcut it; an architect modelling
    real tensors sets what a compressor (R:1, zstd or lz4) and a deduplicating store (D:1 at
    4 KiB) would get out of them (docs/checkpoints.md gives real weights' and Adam states')."""

    compression_ratio: float = key(1.0, "number", minimum=1, maximum=64)
    dedup_ratio: float = key(1.0, "number", minimum=1, maximum=2**20)


@dataclass(frozen=True)
class Dcp:
    """Ours: checkpoint.layout dcp's FileSystemWriter options (checkpoint/dcp_writer.py)."""

    # files per rank (torch's thread_count: one thread writes each; default 1, as torch's)
    thread_count: int = key(1, "int", minimum=1, maximum=64)


@dataclass(frozen=True)
class Checkpoint:
    checkpoint_folder: str = key("./checkpoints", "str")
    checkpoint_after_epoch: int = key(1, "int", minimum=0, maximum=MAX_COUNT)
    epochs_between_checkpoints: int = key(1, "int", minimum=1, maximum=MAX_COUNT)
    # >= 0: step mode; -1: epoch mode
    steps_between_checkpoints: int = key(-1, "int", minimum=-1, maximum=MAX_COUNT)
    # which ranks write: DLIO 2.0.0 reads it (all_ranks: every rank writes the whole
    # checkpoint), later DLIO does not; in dlio-mpi model.parallelism decides
    type: str = key("rank_zero", "str", choices=("rank_zero", "all_ranks"), inert=(
        "model.parallelism decides which ranks write (by default rank 0 alone, as DLIO "
        "2.0.0's rank_zero); DLIO 2.0.0's all_ranks, every rank writing the whole "
        "checkpoint, is not emulated, and later DLIO never reads it"))
    mode: str = key("default", "str", choices=("default", "subset"))
    # True, as MLPerf Storage requires: a stated deviation from DLIO's default (false, and
    # DLIO never syncs whatever it says)
    fsync: bool = key(True, "bool")
    # checkpoint-only mode: emulated compute between checkpoints; None = unset (DLIO's -1)
    time_between_checkpoints: TimeSpec | None = key(None, "timespec", optional=True, unset=-1,
                                                    maximum=MAX_STEP_SECONDS)
    # each save's room is checked before any I/O (checkpoint.folder)
    num_checkpoints_write: int = key(-1, "int", minimum=-1, maximum=MAX_COUNT)
    num_checkpoints_read: int = key(-1, "int", minimum=-1, maximum=MAX_COUNT)
    recovery_rank_shift: bool = key(False, "bool")
    rank_sync: bool = key(False, "bool")
    # false: DLIO writes tensors of ones (compressible, deduplicable)
    randomize_tensor: bool = key(True, "bool", unimplemented=(False,))
    content: Content = section(Content)  # ours
    checkpoint_mechanism_classname: str | None = key(None, "str", optional=True,
                                                     unimplemented=NON_DEFAULT)
    ksm: Ksm | None = section(Ksm, optional=True, inert=UNUSED_MEMORY)
    # ours: how the bytes are written. native: the C core (file_per_rank) or MPI-IO
    # (shared); pt_save: a real torch.save per file (DLIO's PyTorch checkpointing)
    checkpoint_mechanism: str = key("native", "str", choices=("native", "pt_save", "tf_save"),
                                    unimplemented=("tf_save",))
    layout: str = key("file_per_rank", "str", choices=("file_per_rank", "shared", "dcp"))
    dcp: Dcp = section(Dcp)  # ours: layout dcp's options
    odirect: bool = key(False, "bool")  # O_DIRECT writes and restores (file_per_rank)
    mpiio_hints: tuple[tuple[str, str], ...] = key((), "hints")  # layout shared
    # ours: asynchronous saves (checkpoint/async_write.py): the step loop stalls only for a
    # snapshot of the rank's share into host memory, written in the background while training
    # goes on; the next save, an evaluation or the run's end waits for the write
    async_write: bool = key(False, "bool")
    drain: Drain | None = section(Drain, optional=True)  # ours
    # ours: the snapshot copy's pace (bytes/s; a device-to-host copy over PCIe); 0: as fast
    # as memcpy. A pace at which a snapshot would take over a day is refused (plan.checks)
    snapshot_bytes_per_second: float = key(0, "number", minimum=0, maximum=MAX_RATE)


# --------------------------------------------------------------------------- output, metric, ...
@dataclass(frozen=True)
class OutputMetric:
    exclude_start_steps: int = key(1, "int", minimum=0, maximum=MAX_COUNT)
    exclude_end_steps: int = key(0, "int", minimum=0, maximum=MAX_COUNT)


@dataclass(frozen=True)
class Output:
    folder: str = key("output", "str")  # DLIO: the Hydra run dir, else output/
    log_file: str = key("dlio.log", "str")
    metric: OutputMetric = section(OutputMetric)
    access_log: bool = key(False, "bool")  # ours: write which samples each rank read
    trace: bool = key(False, "bool")  # ours: per-rank Chrome trace-event files (metrics/trace.py)
    # ours: seconds between rank 0's progress lines when stdout is not a terminal; 0: no
    # progress shown (neither lines nor the bar a terminal gets)
    progress_interval: float = key(10.0, "float", minimum=0, maximum=MAX_STEP_SECONDS)
    # ours: every N seconds the job's throughput, AU and read latency of the last N seconds
    # (fio's --status-interval), one line in the log and a row of interval_stats.json; 0: off.
    # 10 s: long runs get a readable time series (360 rows an hour) while each interval still
    # spans many steps, so its AU and percentiles mean something; costs one wake-up a rank
    # per interval. Below 0.01 s refused (config.loader.check_consistency)
    stats_interval: float = key(10.0, "float", minimum=0, maximum=MAX_STEP_SECONDS)


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
    profiling: Profiling = section(Profiling, inert=PROFILING)

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
        elif rule.kind in ("hints", "options") and value is not None:
            out[f.name] = dict(value)
        elif rule.kind == "parquet_columns":
            out[f.name] = [column.to_yaml() for column in value]
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        else:
            out[f.name] = rule.unset if value is None and rule.unset is not None else value
    return out


def _set_keys(obj: Any, path: str = "", inherited: str = "", root: Any = None):
    """(dotted key, rule, value, default, inert reason) of every key of `obj` set away from
    its default; a set optional section is one entry (its keys are not shown). `root`: the
    whole configuration, which Rule.acts_if looks into (default: `obj`)."""
    root = obj if root is None else root
    for f in fields(obj):
        rule, value, where = f.metadata["rule"], getattr(obj, f.name), _join(path, f.name)
        default = f.default if f.default is not MISSING else f.default_factory()
        acts = rule.acts_if and all(_value_at(root, key) in values for key, values in rule.acts_if)
        inert = inherited if acts else rule.inert or inherited
        if rule.kind == "section" and value is not None and not rule.optional:
            yield from _set_keys(value, where, inert, root)
        elif value != default:
            yield where, rule, value, default, inert


def _value_at(obj: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def _yaml_text(value: Any) -> str:
    """A value as written in YAML (true, [3, 4], {type: normal, ...})."""
    if isinstance(value, (TimeSpec, ParquetColumn)):
        value = value.to_yaml()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_yaml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_text(v)}" for k, v in value.items()) + "}"
    return "null" if value is None else str(value)


def check_support(cfg: Config) -> None:
    """Refuse a value dlio-mpi does not implement yet (Rule.unimplemented)."""
    for where, rule, value, default, _ in _set_keys(cfg):
        refused = rule.unimplemented
        if refused == NON_DEFAULT or value in refused:
            accepted = ([str(c) for c in rule.choices if c not in refused] if rule.choices
                        else [_yaml_text(default)])
            shown = short_repr(value) if isinstance(value, str) else _yaml_text(value)
            raise ConfigError(f"{where}: {shown} is not implemented yet in dlio-mpi; "
                              f"accepted: {', '.join(accepted)}")


def support_notes(cfg: Config) -> list[str]:
    """One note per reason, naming the keys set away from their default that have no effect
    in dlio-mpi for that reason (Rule.inert)."""
    by_reason: dict[str, list[str]] = {}
    for where, rule, value, _, inert in _set_keys(cfg):
        if inert:
            hidden = rule.kind in ("section", "options")  # they may hold credentials
            shown = where if hidden else f"{where}={_yaml_text(value)}"
            by_reason.setdefault(inert, []).append(shown)
    return [f"{', '.join(keys)}: accepted, no effect, {reason}" if reason.startswith("as in ")
            else f"{', '.join(keys)}: accepted, {'has' if len(keys) == 1 else 'have'} no effect "
                 f"in dlio-mpi because {reason}" for reason, keys in by_reason.items()]


def keys_set(cfg: Config, prefixes: tuple[str, ...]) -> list[str]:
    """'key=value' of the keys starting with one of `prefixes` set away from their default
    (model.name and keys that never act, noted by support_notes, left out)."""
    return [where if rule.kind == "section" else
            f"{where}={_yaml_text(dict(value) if rule.kind == 'hints' else value)}"
            for where, rule, value, _, inert in _set_keys(cfg)
            if where.startswith(prefixes) and where != "model.name" and not inert]


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
        if not parent and c_parent and ratio < 0.8:
            continue  # a top-level name is a section misspelt, or a key named nearly alike
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


def message_key(message: str) -> str | None:
    """The configuration key an error message is about: the schema key it starts with
    ("reader.batch_size: ...", "reader.batch_size=2 is ..."), the key of an "unknown key
    '...'" message, the same key on every line of a message of several lines; else None."""
    keys = set()
    for line in message.splitlines() or [""]:
        unknown = re.match(r"unknown key '([^']+)'", line)
        if unknown:
            keys.add(unknown.group(1))
            continue
        lead = re.match(r"([A-Za-z_][\w.]*?)(?:\[\d+\])*[:=]", line)
        keys.add(lead.group(1) if lead and lead.group(1) in _all_keys() else None)
    return keys.pop() if len(keys) == 1 else None


@functools.lru_cache(maxsize=1)
def _all_keys() -> frozenset[str]:
    return frozenset(schema_keys())


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
