"""Result files of many entries (per_epoch_stats.json, interval_stats.json, the results
manifest) written as JSON with one entry a line, each encoded by json's C encoder.

With `indent`, Python's json falls back to its pure-Python encoder, 3-5 times slower: a
stopped run of 10,000 short epochs spent seconds writing its results that way. The files
read the same (json.load gives the same values); only their layout differs."""

from __future__ import annotations

import json
from typing import Any, TextIO

INDENT = "  "


def dumps(obj: Any, depth: int = 1, _level: int = 0) -> str:
    """`obj` as JSON: the objects and arrays of the first `depth` levels one member a line
    (indented), everything deeper on its member's line. Keys must be strings."""
    if _level >= depth or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj)
    if isinstance(obj, dict):
        members = [f"{json.dumps(key)}: {dumps(value, depth, _level + 1)}"
                   for key, value in obj.items()]
        opening, closing = "{", "}"
    else:
        members = [dumps(value, depth, _level + 1) for value in obj]
        opening, closing = "[", "]"
    pad = "\n" + INDENT * (_level + 1)
    return f"{opening}{pad}{(',' + pad).join(members)}\n{INDENT * _level}{closing}"


def dump(obj: Any, fp: TextIO, depth: int = 1) -> None:
    """Write dumps(obj, depth) and a final newline to `fp`."""
    fp.write(dumps(obj, depth))
    fp.write("\n")
