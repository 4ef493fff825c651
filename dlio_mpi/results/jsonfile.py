"""Result files of many entries (summary.json, per_epoch_stats.json, the per-rank files,
interval_stats.json, the results manifest) written as indented JSON whose deeper values are
each encoded by json's C encoder.

With `indent`, Python's json falls back to its pure-Python encoder, 3-5 times slower: a
stopped run of 10,000 short epochs spent seconds writing its results that way. The files
read the same (json.load gives the same values); only their layout differs: below `depth`
levels a value takes one line, and so does a list of numbers or strings at any level."""

from __future__ import annotations

import json
from json.encoder import c_make_encoder, encode_basestring_ascii
from typing import Any, TextIO

INDENT = "  "


def _one_line_encoder():
    """json.dumps's encoding (its separators, ASCII, NaN allowed, no circular check: results
    hold no cycles), made once: json.dumps makes one a call, 1.3 us of each small entry's."""
    if c_make_encoder is None:  # a Python built without _json
        return json.dumps
    encode = c_make_encoder(None, json.JSONEncoder().default, encode_basestring_ascii, None,
                            ": ", ", ", False, False, True)
    return lambda value: "".join(encode(value, 0))


_encode = _one_line_encoder()


class Encoded(str):
    """JSON text encoded already (an epoch's entry, as the epoch ended): dumps writes it as it
    is, at the levels it indents, and with_members as a member's value."""


def encode(value: Any) -> str:
    """`value` on one line, as json.dumps writes it."""
    return _encode(value)


def with_members(text: str, members: dict) -> Encoded:
    """The encoded object `text` with `members` (keys it does not hold) added at its end, as
    dict.update adds them; values Encoded are taken as they are."""
    if not members:
        return Encoded(text)
    added = ", ".join(f"{_key(key)}: {value if isinstance(value, Encoded) else _encode(value)}"
                      for key, value in members.items())
    return Encoded(f"{text[:-1]}, {added}}}" if text != "{}" else f"{{{added}}}")


def dumps(obj: Any, depth: int | None = 1, _level: int = 0) -> str:
    """`obj` as JSON: the objects and arrays of the first `depth` levels (None: all) one
    member a line, indented as json's indent=2 does, anything deeper on its member's line; a
    list of scalars always on one line; Encoded text as it is."""
    if isinstance(obj, Encoded):
        return obj
    if (depth is not None and _level >= depth) or not obj or not isinstance(obj, (dict, list)) or (
            isinstance(obj, list) and not any(isinstance(v, (dict, list)) for v in obj)):
        return _encode(obj)
    if isinstance(obj, dict):
        members = [f"{_key(key)}: {dumps(value, depth, _level + 1)}"
                   for key, value in obj.items()]
        opening, closing = "{", "}"
    else:
        members = [dumps(value, depth, _level + 1) for value in obj]
        opening, closing = "[", "]"
    pad = "\n" + INDENT * (_level + 1)
    return f"{opening}{pad}{(',' + pad).join(members)}\n{INDENT * _level}{closing}"


def _key(key: Any) -> str:
    # json turns int, float, bool and None keys into strings its own way
    return encode_basestring_ascii(key) if isinstance(key, str) else _encode({key: 0})[1:-4]


def dump(obj: Any, fp: TextIO, depth: int | None = 1) -> None:
    """Write dumps(obj, depth) and a final newline to `fp`."""
    fp.write(dumps(obj, depth))
    fp.write("\n")
