"""Loading a workload: a YAML file by path or shipped name (also DLIO's `workload=NAME`), DLIO's
legacy key aliases, command-line overrides (`dataset.num_files_train=16`, Hydra's
`++workload.dataset.num_files_train=16`, `+workload.x=y`, `~workload.x`), the typed build, the
values not implemented yet and the checks that relate several keys. Everything is checked
before any dataset I/O; every refusal is one ConfigError line naming the file or key.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..formats import get_format, implemented_formats
from ..storage import storage_for
from .schema import (
    OBJECT_STORAGE,
    PARQUET_CODECS,
    Config,
    ConfigError,
    Dataset,
    build_section,
    check_support,
    short_repr,
)

log = logging.getLogger(__name__)

# DLIO's historic key names -> canonical names (dotted paths; the top-level rename comes first).
# Several names may lead to one key: giving two of them is an error, not a precedence rule.
ALIASES = {
    "data_reader": "reader",
    "dataset.record_length": "dataset.record_length_bytes",
    "dataset.record_length_stdev": "dataset.record_length_bytes_stdev",
    "dataset.record_length_resize": "dataset.record_length_bytes_resize",
    "model.model_size": "model.model_size_bytes",
    # The released DLIO package (dlio-benchmark 2.0.0, utils/config.py LoadConfig) reads what
    # sizes a checkpoint under `checkpoint:`; later DLIO, and dlio-mpi, under `model:`. Same
    # meaning, except where said:
    # - model_size: bytes of the flat model tensor (int8 in PyTorch; TensorFlow's int32 tensor
    #   of model_size / 4 elements is as many bytes).
    # - optimization_groups: per group two int8 tensors of that many bytes, plus one of their sum.
    "checkpoint.model_size": "model.model_size_bytes",
    "checkpoint.optimization_groups": "model.optimization_groups",
    # - num_layers and layer_parameters come as a pair: DLIO 2.0.0 writes the layer_parameters
    #   tensors (int8) once per layer. Its defaults (1 layer of [17371, 24740228]) differ from
    #   ours (no layers; model.num_layers alone sizes a transformer by formula), so one of them
    #   given at its 2.0.0 place without the other takes 2.0.0's default for the other
    #   (RELEASED_LAYER_DEFAULTS), as 2.0.0 reads it.
    "checkpoint.num_layers": "model.num_layers",
    "checkpoint.layer_parameters": "model.layer_parameters",
    # - tensor_parallelism, pipeline_parallelism: the same ways of splitting, but not the same
    #   files. DLIO 2.0.0 has every rank with rank % PP == 0 write every layer whole (and
    #   num_layers + TP layers when TP > 1); dlio-mpi splits the layers over the pipeline
    #   stages and each layer's tensors over the TP ranks, as later DLIO does.
    "checkpoint.tensor_parallelism": "model.parallelism.tensor",
    "checkpoint.pipeline_parallelism": "model.parallelism.pipeline",
    # Not here: DLIO 2.0.0's checkpoint.type is which ranks write (rank_zero | all_ranks), not
    # model.type; it keeps its name (schema.Checkpoint.type says what it does in dlio-mpi).
}
# What DLIO 2.0.0 takes for the other key of the num_layers / layer_parameters pair
# (ConfigArguments defaults), keyed by the legacy name given
RELEASED_LAYER_DEFAULTS = {
    "checkpoint.num_layers": ("model.layer_parameters", [17371, 24740228]),
    "checkpoint.layer_parameters": ("model.num_layers", 1),
}
MAX_YAML_BYTES = 16 << 20  # a workload is a few KiB; anything this big is not one
# dataset.record_dims: ComputedLayouts keys a file's header class by the digit count of each
# dim (and one more flag) in base 21 in an int64: 21^14 < 2^63
MAX_RECORD_DIMS = 12


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, also reading YAML 1.2 floats without a dot (1e-3, 5E+6)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))

MIN_STATS_INTERVAL = 0.01  # seconds: output.stats_interval's shortest


DEFAULT_WORKLOAD = "demo"  # the workload a command without one runs


def split_args(args: list[str]) -> tuple[str, list[str]]:
    """(config source, overrides): the first argument without '=' (or workload=NAME) is the
    config; without one the shipped demo workload is used."""
    source, overrides = None, []
    for arg in args:
        if source is None and ("=" not in arg or arg.startswith("workload=")):
            source = arg
        else:
            overrides.append(arg)
    return source or DEFAULT_WORKLOAD, overrides


def parse_yaml(text: str, what: str) -> Any:
    """The YAML document `text` (from `what`: a file or an override); a key given twice in
    one mapping is an error, as YAML 1.2 says (PyYAML would keep the last silently)."""
    loader = None
    try:
        loader = _YamlLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node, "", what, set())
        return loader.construct_document(node)
    except RecursionError:
        raise ConfigError(f"{what}: nested too deeply to be a workload") from None
    except yaml.reader.ReaderError as exc:  # a control character: binary, not YAML text
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise ConfigError(f"{what}: not a YAML text file (character U+{char:04X} at offset "
                          f"{exc.position} is not allowed in YAML)") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = " ".join(str(exc.problem or exc.context).split())
        raise ConfigError(f"{what}{where}: not valid YAML ({problem})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what}: not valid YAML ({' '.join(str(exc).split())})") from None
    finally:
        if loader is not None:
            loader.dispose()


def _refuse_duplicate_keys(node: yaml.Node, path: str, what: str, seen_nodes: set) -> None:
    # each node once: an alias is the same node again, and nested aliases repeat it
    # exponentially ("billion laughs")
    if id(node) in seen_nodes:
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item, path, what, seen_nodes)
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[str, int] = {}
    for key_node, value_node in node.value:
        name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
        dotted = f"{path}.{name}" if path else name
        line = key_node.start_mark.line + 1
        if key_node.tag != "tag:yaml.org,2002:merge" and name in seen:
            raise ConfigError(f"{what}: key '{dotted}' is given twice (lines {seen[name]} and "
                              f"{line}); keep one")
        seen[name] = line
        _refuse_duplicate_keys(value_node, dotted, what, seen_nodes)


# --------------------------------------------------------------------------- shipped workloads
def workload_dir() -> Any:
    """The shipped configs/workload folder: the installed `dlio_mpi.configs` package, else the
    source tree's configs/ next to the dlio_mpi package."""
    try:
        folder = resources.files("dlio_mpi.configs").joinpath("workload")
        if folder.is_dir():
            return folder
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "configs" / "workload"


# Subfolders of configs/workload holding other projects' files, named NAMESPACE/NAME
NAMESPACES = ("mlperf",)  # MLPerf Storage's files (configs/workload/mlperf/README.md)
SHIPPED_NAME = re.compile(r"(?:(" + "|".join(NAMESPACES) + r")/)?([\w.-]+)")


def list_workloads() -> list[str]:
    """Names of the shipped workloads (`unet3d_h100`, ..., then `mlperf/unet3d_b200`, ...)."""
    folder = workload_dir()
    if not folder.is_dir():
        return []
    names = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
    for space in NAMESPACES:
        sub = folder.joinpath(space)
        if sub.is_dir():
            names += sorted(f"{space}/{p.name[:-5]}" for p in sub.iterdir()
                            if p.name.endswith(".yaml"))
    return names


def shipped_file(name: str) -> Any:
    """The shipped file of workload `name` (`unet3d_h100`, `mlperf/unet3d_b200`), or None."""
    match = SHIPPED_NAME.fullmatch(name)
    if not match or match[2] in (".", ".."):
        return None
    folder = workload_dir()
    shipped = (folder.joinpath(match[1]) if match[1] else folder).joinpath(f"{match[2]}.yaml")
    return shipped if shipped.is_file() else None


def _locate(source: str) -> tuple[Any, str, bool]:
    """(the file `source` names, how messages name it, whether it is a shipped one): a YAML
    path, a shipped name or `workload=NAME`; ConfigError for a name nothing answers to."""
    name = source[len("workload="):] if source.startswith("workload=") else source
    path = Path(name)
    shipped = None if path.suffix in (".yaml", ".yml") or _exists(path) else shipped_file(name)
    if shipped is not None:  # a file of that path, if there is one, comes first
        return shipped, f"workload {name}", True
    if ("/" in name and not SHIPPED_NAME.fullmatch(name)) or path.suffix in (
            ".yaml", ".yml") or _exists(path):
        return path, name, False
    close = difflib.get_close_matches(name, list_workloads(), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"unknown workload '{name}'{hint} "
                      f"(shipped: {', '.join(list_workloads())}; or give a YAML path)")


def source_file(source: str) -> str:
    """The absolute path, symbolic links resolved, of the workload file `source` names (the
    plan's `workload file`, summary.json's dlio_mpi.workload_file)."""
    return os.path.realpath(str(_locate(source)[0]))


def read_source(source: str) -> dict[str, Any]:
    """The workload mapping of `source`: a YAML path, a shipped name or `workload=NAME`.
    The sections may sit at the top level (DLIO workload files) or under `workload:`."""
    found, what, shipped = _locate(source)
    text = found.read_text(encoding="utf-8") if shipped else _read_text(found, what)
    data = parse_yaml(text, what)
    if isinstance(data, dict) and "workload" in data:
        others = [str(k) for k in data if k not in ("workload", "hydra")]
        if others:
            raise ConfigError(f"{what}: has both a 'workload' mapping and top-level keys "
                              f"({', '.join(others)}); put every section under 'workload'")
        data, what = data["workload"], f"{what}: workload"
    if data is None or data == {}:
        raise ConfigError(f"{what}: the workload is empty; expected a mapping of sections "
                          f"(dataset:, reader:, train:, ...)")
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: expected a mapping of sections (dataset:, reader:, ...), "
                          f"got {short_repr(data)}")
    return data


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long for a path, say: not a file then
        return False


def _read_text(path: Path, name: str) -> str:
    """The text of the workload file `path` (given as `name`), or ConfigError."""
    try:
        if path.is_dir():
            raise ConfigError(f"{name}: is a directory; expected a workload YAML file")
        if not path.exists():
            raise ConfigError(f"configuration file not found: {name}")
        if not path.is_file():  # a FIFO or a device could block or never end
            raise ConfigError(f"{name}: is not a regular file; expected a workload YAML file")
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ConfigError(f"{name}: is {size} bytes, not a workload YAML file (at most "
                              f"{MAX_YAML_BYTES >> 20} MiB)")
        # cannot block, even if swapped since
        data = storage_for(str(path)).read_small(str(path), MAX_YAML_BYTES)
    except ConfigError:
        raise
    except ValueError:  # read_small: not a regular file after all
        raise ConfigError(f"{name}: is not a regular file; expected a workload YAML file") \
            from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read the workload file ({exc.strerror})") from None
    if data is None:
        raise ConfigError(f"configuration file not found: {name}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: not a YAML text file (byte {data[exc.start]:#04x} at "
                          f"offset {exc.start} is not UTF-8)") from None


# --------------------------------------------------------------------------- aliases
def canonical_key(dotted: str) -> str:
    """`dotted` with a legacy alias prefix replaced by its canonical name."""
    for alias, canonical in ALIASES.items():
        if dotted == alias or dotted.startswith(alias + "."):
            dotted = canonical + dotted[len(alias):]
    return dotted


def normalize_aliases(tree: dict[str, Any]) -> dict[str, Any]:
    """Rewrite legacy spellings in place: a model named by a string (`model: unet3d`, DLIO
    2.0.0) becomes `model: {name: unet3d}`, and each ALIASES key moves to its canonical place.
    Two names of one key given together are an error. Returns `tree`."""
    _model_named_by_string(tree)
    names: dict[str, list[str]] = {}
    for alias, canonical in ALIASES.items():
        names.setdefault(canonical, []).append(alias)
    moved = []
    for canonical, aliases in names.items():
        given = [alias for alias in aliases if _is_given(tree, alias)]
        if not given:
            continue
        if len(given) > 1 or _is_given(tree, canonical):
            raise ConfigError(_same_key_message(given, canonical, _is_given(tree, canonical)))
        log.debug("config: legacy key '%s' read as '%s'", given[0], canonical)
        parts = given[0].split(".")
        value = _mapping_at(tree, parts[:-1]).pop(parts[-1])
        _put(tree, canonical, value, given[0])
        moved.append(given[0])
    for alias in moved:
        _fill_released_layer_default(tree, alias)
    return tree


def _model_named_by_string(tree: dict[str, Any]) -> None:
    # DLIO 2.0.0 reads `model` as the model's name (and nothing else there)
    if _is_model_name(tree.get("model")):
        tree["model"] = {"name": tree["model"]}


def _fill_released_layer_default(tree: dict[str, Any], alias: str) -> None:
    """After `alias` (a legacy num_layers / layer_parameters) was read, the other key of the
    pair takes DLIO 2.0.0's default unless it is given (see ALIASES)."""
    if alias in RELEASED_LAYER_DEFAULTS:
        partner, default = RELEASED_LAYER_DEFAULTS[alias]
        if not _is_given(tree, partner):
            log.debug("config: '%s' given without '%s': DLIO 2.0.0's %s", alias, partner,
                      default)
            _put(tree, partner, list(default) if isinstance(default, list) else default, alias)


def _same_key_message(given: list[str], canonical: str, canonical_given: bool) -> str:
    quoted = [f"'{name}'" for name in given]
    legacy = f"legacy name{'s' if len(given) > 1 else ''} of '{canonical}'"
    if canonical_given:
        both = "both " if len(given) == 1 else ""
        return (f"{both}{', '.join(quoted)} ({legacy}) and '{canonical}' are given; "
                f"keep '{canonical}'")
    names = f"{', '.join(quoted[:-1])} and {quoted[-1]}"
    both = "both " if len(given) == 2 else ""
    return f"{both}{names} are given, {legacy}; keep one, preferably '{canonical}'"


def _is_given(tree: dict[str, Any], dotted: str) -> bool:
    parts = dotted.split(".")
    parent = _mapping_at(tree, parts[:-1])
    return parent is not None and parts[-1] in parent


def _parent(tree: dict[str, Any], parts: list[str], in_the_way) -> dict[str, Any]:
    """The mapping of `tree` that holds key parts[-1], its sections created on the way; a
    value where a section should be goes to in_the_way(where, value, its key's parts), which
    returns a mapping to put in its place or raises ConfigError."""
    node = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            child = node[part] = in_the_way(".".join(parts[:depth + 1]), child,
                                            parts[:depth + 1])
        node = child
    return node


def _put(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    """Set `dotted` in `tree`, creating its sections (`source`: the key it was given as)."""
    def refuse(where: str, child: Any, _parts: list[str]) -> dict:
        raise ConfigError(f"{source}: is read as {dotted}, but {where} is "
                          f"{short_repr(child)}, not a mapping of keys")

    parts = dotted.split(".")
    _parent(tree, parts, refuse)[parts[-1]] = value


def _mapping_at(tree: dict[str, Any], parts: list[str]) -> dict[str, Any] | None:
    node: Any = tree
    for part in parts:
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


# --------------------------------------------------------------------------- overrides
def parse_override(text: str) -> tuple[str, bool, str]:
    """(canonical dotted key, delete?, raw YAML value) of one `KEY=VALUE` or `~KEY`."""
    given, delete, raw_value = _split_override(text)
    dotted = canonical_key(given)
    if dotted == "model" and not delete and _is_model_name(
            parse_yaml(raw_value, f"override '{text}'")):
        dotted = "model.name"  # DLIO 2.0.0's model=NAME: the name, the other model keys kept
    return dotted, delete, raw_value


def _split_override(text: str) -> tuple[str, bool, str]:
    """(dotted key as given, without the workload. prefix; delete?; raw YAML value)."""
    body = text.strip()
    delete = body.startswith("~")
    body = body.lstrip("+~")
    dotted, sep, raw_value = body.partition("=")
    dotted = dotted.strip()
    if dotted.startswith("workload."):
        dotted = dotted[len("workload."):]
    if (not sep and not delete) or not all(dotted.split(".")) or dotted == "workload":
        raise ConfigError(f"override '{text}': expected section.key=value "
                          f"(or ++workload.section.key=value)")
    if delete and "." not in dotted:
        # Hydra would drop the section, leaving every key of it at dlio-mpi's default (a
        # dataset generated under ./data): never what was meant
        raise ConfigError(f"override '{text}': deletes the whole {dotted} section, which leaves "
                          f"every {dotted} key at its default; expected ~{dotted}.KEY (one "
                          f"key) or {dotted}.KEY=VALUE")
    return dotted, delete, raw_value


def _is_model_name(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def apply_override(tree: dict[str, Any], text: str) -> None:
    """Apply one `KEY=VALUE` (or `~KEY`) override to the raw tree. Prefixes `+`, `++` and
    `workload.` are accepted and mean the same: set the key whether or not the YAML has it.
    VALUE is read as YAML (numbers, booleans, [lists], {mappings}). A legacy name sets its
    canonical key (ALIASES)."""
    def timespec_or_refuse(where: str, child: Any, prefix: list[str]) -> dict:
        if _is_number(child) and _is_timespec(prefix):  # a time given as a number
            return {"mean": child}
        raise ConfigError(f"override '{text}': {where} is {child!r}, not a mapping; "
                          f"set it whole instead ({where}={{...}})")

    dotted, delete, raw_value = parse_override(text)
    parts = dotted.split(".")
    node = _parent(tree, parts, timespec_or_refuse)
    if delete:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = parse_yaml(raw_value, f"override '{text}'")
        _fill_released_layer_default(tree, _split_override(text)[0])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_timespec(parts: list[str]) -> bool:
    cls: Any = Config
    for part in parts:
        rule = next((f.metadata["rule"] for f in fields(cls) if f.name == part), None)
        if rule is None:
            return False
        if rule.kind == "timespec":
            return part == parts[-1]
        cls = rule.section
        if cls is None:
            return False
    return False


# --------------------------------------------------------------------------- checks across keys
def path_keys(cfg: Config) -> list[tuple[str, str]]:
    """(key, value) of every folder or file key that is set: paths on a file system."""
    st, rd = cfg.storage, cfg.reader
    keys = [("storage.storage_root", st.storage_root), ("dataset.data_folder",
            cfg.dataset.data_folder), ("checkpoint.checkpoint_folder",
            cfg.checkpoint.checkpoint_folder), ("output.folder", cfg.output.folder),
            ("output.log_file", cfg.output.log_file)]
    if st.stage_in is not None:
        keys.append(("storage.stage_in.to", st.stage_in.to))
    if rd.cache is not None:
        keys.append(("reader.cache.folder", rd.cache.folder))
    if cfg.checkpoint.drain is not None:
        keys.append(("checkpoint.drain.to", cfg.checkpoint.drain.to))
    return keys


URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
FILE_SYSTEM_TYPES = ("local_fs", "parallel_fs", "direct_fs")


def refuse_object_storage(tree: dict[str, Any]) -> None:
    """A workload for object storage (storage.storage_type s3 or aistore) is refused with this
    one message before its other keys are read: its storage_library, storage_options and
    s3:// folders would otherwise each be a refusal of their own."""
    storage = tree.get("storage")
    kind = storage.get("storage_type") if isinstance(storage, dict) else None
    if isinstance(kind, str) and kind in OBJECT_STORAGE:
        raise ConfigError(f"storage.storage_type: {kind!r} is object storage, which is not "
                          f"implemented yet in dlio-mpi; accepted: "
                          f"{', '.join(FILE_SYSTEM_TYPES)}")


def _refuse_urls(cfg: Config) -> None:
    """storage.storage_type local_fs and parallel_fs take POSIX paths: a URL (s3://bucket/x)
    would be a local folder named 's3:'."""
    for key, value in path_keys(cfg):
        if URL_SCHEME.match(value.strip()):
            raise ConfigError(f"{key}: {value!r} is a URL, and storage.storage_type "
                              f"{cfg.storage.storage_type} takes a file-system path; expected "
                              f"a path (object storage, storage.storage_type s3, is not "
                              f"implemented yet)")


def check_consistency(cfg: Config) -> None:
    """DLIO's rules that relate several keys (those that do not need the MPI size)."""
    ds, rd, model, ck = cfg.dataset, cfg.reader, cfg.model, cfg.checkpoint
    par = model.parallelism
    _refuse_urls(cfg)
    if ds.file_prefix in ("", ".", "..") or "/" in ds.file_prefix:
        raise ConfigError(f"dataset.file_prefix: {ds.file_prefix!r} is not a file name prefix; "
                          f"expected a name without '/' (files are named "
                          f"<file_prefix>_<i>_of_<N>.<format> inside the split's folder)")
    if len(ds.record_dims) > MAX_RECORD_DIMS:
        raise ConfigError(f"dataset.record_dims: expected at most {MAX_RECORD_DIMS} dimensions, "
                          f"got {len(ds.record_dims)}")
    if 0 < cfg.output.stats_interval < MIN_STATS_INTERVAL:
        raise ConfigError(f"output.stats_interval: {cfg.output.stats_interval:g} s is shorter "
                          f"than {MIN_STATS_INTERVAL:g} s; expected 0 (off) or at least "
                          f"{MIN_STATS_INTERVAL:g} (an interval spans several steps, and every "
                          "rank sends rank 0 a message per interval)")
    if (cfg.workflow.train or cfg.workflow.generate_data) and ds.num_files_train < 1:
        raise ConfigError(f"dataset.num_files_train: expected an integer >= 1 when "
                          f"workflow.train or workflow.generate_data is true, "
                          f"got {ds.num_files_train}")
    if ds.record_dims and ds.record_length_bytes_stdev > 0:
        raise ConfigError(f"dataset.record_length_bytes_stdev: must be 0 when dataset.record_dims "
                          f"is set, got {ds.record_length_bytes_stdev} with record_dims "
                          f"{list(ds.record_dims)}")
    if ds.record_dims and ds.record_dims[0] % ds.hdf5.num_dset_per_record:
        raise ConfigError(f"dataset.hdf5.num_dset_per_record: must divide record_dims[0] "
                          f"({ds.record_dims[0]}), got {ds.hdf5.num_dset_per_record}")
    fmt = get_format(ds.format) if ds.format in implemented_formats() else None
    if ds.compression in PARQUET_CODECS and (fmt is None or ds.compression not in fmt.codecs):
        rule = next(f for f in fields(Dataset) if f.name == "compression").metadata["rule"]
        accepted = ", ".join(c for c in rule.choices if c not in PARQUET_CODECS)
        raise ConfigError(f"dataset.compression: {ds.compression!r} is not accepted; expected "
                          f"one of: {accepted} ({', '.join(PARQUET_CODECS)}: dataset.format "
                          "parquet only)")
    if fmt is not None:
        fmt.check_dataset(ds)
    if cfg.workflow.train or cfg.workflow.evaluation:  # what reads names its framework
        _check_agreements(cfg, rd, "reader")
    if 0 < model.num_layers < par.pipeline:
        raise ConfigError(f"model.num_layers: expected at least model.parallelism.pipeline "
                          f"({par.pipeline}) layers, got {model.num_layers}")
    if par.pipeline > 1 and par.zero_stage == 3:
        raise ConfigError(f"model.parallelism.zero_stage: 3 does not combine with "
                          f"model.parallelism.pipeline > 1, got pipeline {par.pipeline}")
    if ck.mode == "default" and par.data > 0:
        raise ConfigError(f"model.parallelism.data: derived from the rank count in checkpoint.mode "
                          f"default (leave it unset or use mode subset), got {par.data}")
    if ck.mode == "subset" and par.data < 1:
        raise ConfigError(f"model.parallelism.data: checkpoint.mode subset needs an explicit "
                          f"data-parallel size >= 1, got {par.data}")
    if ck.num_checkpoints_write > 0 and ck.num_checkpoints_read > ck.num_checkpoints_write:
        raise ConfigError(f"checkpoint.num_checkpoints_read: expected at most "
                          f"num_checkpoints_write ({ck.num_checkpoints_write}), "
                          f"got {ck.num_checkpoints_read}")
    if ck.checkpoint_mechanism == "pt_save" and ck.layout == "shared":
        raise ConfigError("checkpoint.layout: shared writes one file through MPI-IO, which "
                          "torch.save cannot; expected file_per_rank with "
                          "checkpoint_mechanism pt_save (or checkpoint_mechanism native)")
    if ck.odirect and ck.checkpoint_mechanism == "pt_save":
        raise ConfigError("checkpoint.odirect: true does not combine with checkpoint_mechanism "
                          "pt_save (torch.save writes through the page cache); expected false, "
                          "or checkpoint_mechanism native")
    if ck.async_write and ck.checkpoint_mechanism == "pt_save":
        raise ConfigError("checkpoint.async_write: true with checkpoint_mechanism pt_save is not "
                          "implemented yet; expected false, or checkpoint_mechanism native")
    _check_drain(ck)
    if ck.snapshot_bytes_per_second and not ck.async_write:
        raise ConfigError(f"checkpoint.snapshot_bytes_per_second: "
                          f"{ck.snapshot_bytes_per_second:.12g} paces the snapshot of "
                          "checkpoint.async_write: true, which is false; expected 0, or "
                          "async_write: true")


def _check_agreements(cfg: Config, section: Any, path: str) -> None:
    """The keys of `section` (at `path`) whose value names a value of a top-level key
    (Rule.agrees_with) the configuration does not hold there: DLIO's reader.data_loader and
    framework."""
    for f in fields(section):
        other = f.metadata["rule"].agrees_with
        if not other:
            continue
        value, wanted = getattr(section, f.name), getattr(cfg, other)
        named = next(g for g in fields(Config) if g.name == other).metadata["rule"].choices
        if value in named and value != wanted:
            raise ConfigError(f"{path}.{f.name}: '{value}' does not fit {other} '{wanted}'; "
                              f"expected '{wanted}' (or {other}: {value})")


def _check_drain(ck) -> None:
    """checkpoint.drain: restores that find what they read (its folder is checked against
    every other folder of the run by plan/folders.py)."""
    drain = ck.drain
    if drain is None:
        return
    if drain.keep != "all" and drain.restore_from == "fast_tier" and \
            ck.num_checkpoints_read > 0:
        raise ConfigError(f"checkpoint.drain.keep: {drain.keep} removes drained checkpoints "
                          "from checkpoint_folder, where checkpoint.drain.restore_from: "
                          "fast_tier would read them back; expected keep: all, or "
                          "restore_from: pfs")


# --------------------------------------------------------------------------- entry point
def load_config(source: str, overrides: Sequence[str] = ()) -> Config:
    """The validated Config of `source` (YAML path, shipped name or `workload=NAME`) with
    `overrides` applied in order. Raises ConfigError with a one-line message."""
    tree = config_tree(source, overrides)
    refuse_object_storage(tree)
    cfg = build_section(Config, tree, "")
    check_support(cfg)
    check_consistency(cfg)
    return columns_decide_samples(direct_fs_reads_direct(cfg))


def config_tree(source: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The keys `source` and `overrides` give, merged, under their canonical names (no
    defaults, not checked); ConfigError as load_config's."""
    _refuse_repeated_overrides(overrides)
    tree = normalize_aliases(read_source(source))
    for text in overrides:
        apply_override(tree, text)
    return normalize_aliases(tree)  # aliases inside mapping-valued overrides


def is_given(source: str, overrides: Sequence[str], dotted: str) -> bool:
    """Do `source` and `overrides` give the key `dotted` (a canonical name), not its default?"""
    return _is_given(config_tree(source, overrides), dotted)


def direct_fs_reads_direct(cfg: Config) -> Config:
    """storage.storage_type direct_fs (MLPerf's DLIO fork; mlpstorage --o-direct injects it
    with storage_library s3dlio and storage_options.uri_scheme direct): the data under
    storage_root read with O_DIRECT, s3dlio's direct:// mode, which reader.odirect is here.
    Another library or scheme named with it is refused."""
    st = cfg.storage
    if st.storage_type != "direct_fs":
        return cfg
    options = dict(st.storage_options or ())
    library = st.storage_library or options.get("storage_library", "s3dlio")
    scheme = options.get("uri_scheme", "direct")
    if library != "s3dlio" or scheme != "direct":
        raise ConfigError(f"storage.storage_type: direct_fs reads a file system through "
                          f"s3dlio's direct:// mode, but storage_library {library!r} and "
                          f"storage_options.uri_scheme {scheme!r} are given; expected s3dlio "
                          "and direct (or neither)")
    return replace(cfg, reader=replace(cfg.reader, odirect=True))


def columns_decide_samples(cfg: Config) -> Config:
    """With dataset.parquet.columns, a sample is a row of those columns, whatever
    record_length_bytes says (MLPerf's DLIO fork writes the columns and ignores the record
    length): the row's bytes become the sample's dims (record_dims of uint8, no stdev).
    The plan notes it (plan/notes.py); record_length_bytes keeps its value for that note."""
    ds = cfg.dataset
    if ds.format != "parquet" or not ds.parquet.columns:
        return cfg
    row = sum(column.row_bytes for column in ds.parquet.columns)
    return replace(cfg, dataset=replace(ds, record_dims=(row,), record_element_type="uint8",
                                        record_length_bytes_stdev=0))


def _refuse_repeated_overrides(overrides: Sequence[str]) -> None:
    """Two overrides of one key (whatever their spelling) are a mistake, not a sequence."""
    seen: dict[str, str] = {}
    for text in overrides:
        dotted = parse_override(text)[0]
        if dotted in seen:
            raise ConfigError(f"overrides '{seen[dotted]}' and '{text}' both set {dotted}; "
                              f"keep one")
        seen[dotted] = text
