"""Emulated time specifications: train.computation_time, evaluation.eval_time,
reader.preprocess_time and checkpoint.time_between_checkpoints.

DLIO accepts a number (constant seconds) or a mapping:
  {mean}                      constant
  {mean, stdev}               normal
  {type: normal, mean, stdev} {type: uniform, min, max} {type: gamma, shape, scale}
  {type: exponential, scale}  {type: poisson, lam}
  {}                          zero
and the sibling keys `computation_time_stdev`, `eval_time_stdev`, `preprocess_time_stdev` add a
stdev to the mapping. `parse_timespec` turns any of these into a `TimeSpec`, raising ValueError
with a one-line message that names the key (the loader turns it into a ConfigError).
"""

from __future__ import annotations

import difflib
import math
import reprlib
from dataclasses import dataclass
from typing import Any

import numpy as np

# Parameters are at most 10^9 s (31.7 years); draws are clipped below 2^62 ns so that a step's
# deadline (now + draw, in int64 nanoseconds) cannot overflow, whatever the distribution's tail.
MAX_SECONDS = 1e9
MAX_DRAW_SECONDS = 2**62 / 1e9

# Parameter names of each distribution, in the order `TimeSpec.params` stores them.
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "constant": ("mean",),
    "normal": ("mean", "stdev"),
    "uniform": ("min", "max"),
    "gamma": ("shape", "scale"),
    "exponential": ("scale",),
    "poisson": ("lam",),
}


@dataclass(frozen=True)
class TimeSpec:
    """A distribution of emulated durations in seconds.

    `type` is one of DISTRIBUTIONS; `params` holds its parameters in the order listed there
    (e.g. normal: (mean, stdev)). Draws below zero (normal only) are clipped to 0; DLIO instead
    reflects them with abs(), which shifts the mean upwards by a different amount. Draws past
    MAX_DRAW_SECONDS (about 146 years) are clipped to it.
    """

    type: str = "constant"
    params: tuple[float, ...] = (0.0,)

    def __post_init__(self) -> None:
        names = DISTRIBUTIONS.get(self.type)
        if names is None:
            raise ValueError(f"unknown time distribution {self.type!r}; "
                             f"expected one of: {', '.join(DISTRIBUTIONS)}")
        if len(self.params) != len(names):
            raise ValueError(f"a {self.type} time takes {len(names)} parameters "
                             f"({', '.join(names)}), got {self.params!r}")

    @classmethod
    def constant(cls, seconds: float) -> TimeSpec:
        return cls("constant", (float(seconds),))

    def param(self, name: str) -> float:
        """The named parameter (e.g. 'stdev' of a normal time)."""
        return self.params[DISTRIBUTIONS[self.type].index(name)]

    @property
    def is_constant(self) -> bool:
        return self.type == "constant"

    @property
    def mean(self) -> float:
        """Expected seconds of one draw, after clipping at 0 (exact for the clipped normal)."""
        p = self.params
        if self.type == "normal":
            mu, sigma = p
            if sigma == 0.0:
                return max(mu, 0.0)
            z = mu / sigma
            cdf = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
            pdf = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
            return mu * cdf + sigma * pdf
        if self.type == "uniform":
            return (p[0] + p[1]) / 2.0
        if self.type == "gamma":
            return p[0] * p[1]
        return p[0]  # constant, exponential (scale), poisson (lam)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` durations in seconds (float64), clipped to [0, MAX_DRAW_SECONDS] (DLIO reflects
        negative draws with abs())."""
        p = self.params
        if self.type == "constant":
            values = np.full(n, p[0], dtype=np.float64)
        elif self.type == "normal":
            values = rng.normal(p[0], p[1], n)
        elif self.type == "uniform":
            values = rng.uniform(p[0], p[1], n)
        elif self.type == "gamma":
            values = rng.gamma(p[0], p[1], n)
        elif self.type == "exponential":
            values = rng.exponential(p[0], n)
        else:
            values = rng.poisson(p[0], n).astype(np.float64)
        return np.clip(values, 0.0, MAX_DRAW_SECONDS)

    def to_yaml(self) -> float | dict[str, Any]:
        """DLIO's spelling: a plain number for a constant, else {type, <params>}."""
        if self.is_constant:
            return self.params[0]
        return {"type": self.type, **dict(zip(DISTRIBUTIONS[self.type], self.params))}


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: expected a number of seconds, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: expected a finite number of seconds, got {value!r}")
    shown = f"{value:g}" if isinstance(value, float) else reprlib.repr(value)
    if value < 0:
        raise ValueError(f"{where}: expected a number >= 0, got {shown}")
    if value > MAX_SECONDS:
        raise ValueError(f"{where}: expected at most {MAX_SECONDS:g} seconds (31.7 years), "
                         f"got {shown}")
    return float(value)


def _unknown_params(extra: list[str], names: tuple[str, ...], path: str, kind: str) -> str:
    bad = extra[0]
    close = difflib.get_close_matches(bad, names, n=1)
    hint = f"; did you mean '{path}.{close[0]}'?" if close else ""
    return (f"unknown key '{path}.{bad}' for a {kind} time (accepted: "
            f"{', '.join(('type',) + names if kind != 'constant' else names)}){hint}")


def parse_timespec(value: Any, path: str, stdev: Any = None, stdev_key: str = "") -> TimeSpec:
    """A TimeSpec from DLIO's number-or-mapping form. `stdev` is the value of the sibling key
    `stdev_key` (e.g. train.computation_time_stdev) when it was given, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise ValueError(f"{path}: expected seconds as a number or a mapping such as "
                         f"{{mean: 0.5, stdev: 0.1}} or {{type: uniform, min: 0.1, max: 0.2}}, "
                         f"got {value!r}")
    if not isinstance(value, dict):
        _number(value, path)
    spec = dict(value) if isinstance(value, dict) else {"mean": value}
    if stdev is not None:
        if "stdev" in spec:
            raise ValueError(f"both {stdev_key} and {path}.stdev are given; keep one")
        if spec.get("type", "normal") != "normal":
            raise ValueError(f"{stdev_key}: a stdev only applies to a normal time, "
                             f"but {path} is of type {spec['type']!r}")
        if "mean" not in spec:
            raise ValueError(f"{stdev_key}: given without a mean in {path}")
        spec["stdev"] = stdev
    if not spec:
        return TimeSpec.constant(0.0)
    kind = spec.pop("type", None)
    if kind is None:
        kind = "normal" if "stdev" in spec else "constant"
    if kind not in DISTRIBUTIONS:
        raise ValueError(f"{path}.type: {kind!r} is not accepted; expected one of: "
                         f"{', '.join(k for k in DISTRIBUTIONS if k != 'constant')}")
    names = DISTRIBUTIONS[kind]
    extra = [str(k) for k in spec if k not in names]
    if extra:
        raise ValueError(_unknown_params(extra, names, path, kind))
    missing = [k for k in names if k not in spec]
    if missing:
        raise ValueError(f"{path}: a {kind} time needs {', '.join(names)}; "
                         f"missing {', '.join(missing)}")
    params = tuple(_number(spec[k], f"{path}.{k}") for k in names)
    if kind == "uniform" and params[0] > params[1]:
        raise ValueError(f"{path}: min ({params[0]}) is larger than max ({params[1]})")
    if kind == "normal" and params[1] == 0.0:
        return TimeSpec.constant(params[0])
    return TimeSpec(kind, params)
