"""Plain values across the sandbox's edge: what a case's code returned, as one line of JSON; stdlib only.

Both sides use it: the sandboxed process encodes (``grpocli.rewards.sandbox_harness`` sends this file's
source along), the trainer decodes. Only these exact types cross: None, bool, int, float, complex,
str, bytes, list, tuple, dict, set and frozenset, nested. JSON keeps None, bool, int, float, str and
list apart by itself; the others are one-key objects (``{"tuple": [...]}``). A subclass of any of
them, whatever its ``__eq__`` does, is not plain: ``encode`` refuses it, so what the trainer compares
are its own builtin objects, built from text it read with a size limit.
"""

import json

TAGS = ("tuple", "dict", "set", "frozenset", "bytes", "complex")
SCALARS = (type(None), bool, int, float, str)


class NotPlain(TypeError):
    """A value that is not plain data (its type is named in the message)."""


def encode(value, depth=0):
    """``value`` as JSON-ready data; NotPlain for anything but the exact types above (or nesting past 100)."""
    kind = type(value)
    if depth > 100:
        raise NotPlain("nested more than 100 deep")
    if kind in SCALARS:
        return value
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple or kind is set or kind is frozenset:
        return {kind.__name__: [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    raise NotPlain(f"a {kind.__module__}.{kind.__qualname__} is not plain data")


def dumps(value):
    return json.dumps(encode(value), separators=(",", ":"))


def _tagged(pairs):
    if len(pairs) != 1 or pairs[0][0] not in TAGS:
        raise ValueError(f"not a tagged value: {[k for k, _ in pairs][:3]}")
    tag, items = pairs[0]
    if tag == "bytes":
        return bytes.fromhex(items)
    if not isinstance(items, list):
        raise ValueError(f"{tag} of a {type(items).__name__}")  # noqa: TRY004 - loads says ValueError for bad text
    if tag == "complex":
        return complex(*items)
    if tag == "dict":
        return {k: v for k, v in items}  # each item a [key, value] pair
    return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)


def loads(text):
    """The plain value in one line of ``dumps`` (or a JSON list holding such values: the messages of the
    sandbox, ``["ok", value]``, are lists, never objects); ValueError for anything else (bad JSON, an unknown tag,
    an unhashable key, nesting too deep, an integer too long)."""
    try:
        return json.loads(text, object_pairs_hook=_tagged)
    except (TypeError, RecursionError, OverflowError) as exc:
        raise ValueError(str(exc)[:200]) from None
