"""Configuration: DLIO's workload YAMLs read into a typed, frozen, validated `Config`.

    cfg = load_config("unet3d_h100", ["++workload.train.epochs=2"])
    cfg.reader.batch_size, cfg.train.computation_time.draw(rng, n), cfg.to_dict()

Modules: schema (the sections, the generic validator, and what each key does in dlio-mpi:
acts, refused as not implemented yet, or no effect), timespec (emulated time distributions),
loader (YAML sources, aliases, overrides, cross-key checks).
"""

from ..errors import ConfigError
from .loader import ALIASES, DEFAULT_WORKLOAD, is_given, list_workloads, load_config, split_args
from .schema import Config, keys_set, support_notes
from .timespec import TimeSpec

__all__ = ["ALIASES", "DEFAULT_WORKLOAD", "Config", "ConfigError", "TimeSpec", "keys_set",
           "is_given", "list_workloads", "load_config", "split_args", "support_notes"]
