"""Rules, schedules and hyperparameters as plain data and back: the one walker behind checkpoints,
``config.json`` and golden vectors.

* :func:`rule_to_json` / :func:`rule_from_json`: the exact, machine-readable form stored in checkpoints and
  golden files, ``{"__rule__": [module, qualname], "fields": {...}}`` with nested rules, schedules
  (``{"__dataclass__": ...}``), functions of the refopt package (``{"__function__": ...}``), tuples, dicts and
  plain scalars. Loading imports classes **only from the refopt package**, never arbitrary code; each
  rule's ``__post_init__`` re-validates its fields.
* :func:`describe`: the readable form written into ``config.json`` (``{"name": class, field: value, ...}``),
  and :func:`from_description`, its inverse for a given set of classes (the schedules use it).
* :func:`nested_rules`: the rules inside a rule (a wrapper's base, a Partition's rules), depth first.
"""
from __future__ import annotations

import dataclasses
import importlib
import types as _types
from typing import Any

import numpy as np

from refopt.core import Rule


class CheckpointError(ValueError):
    """A checkpoint cannot be written (something in it cannot be serialized) or read (truncated,
    corrupted, a hash mismatch, a missing array, an unknown format version or class)."""


# --- names of refopt objects ------------------------------------------------------------------------

def _qualname(obj: Any) -> list[str]:
    return [obj.__module__, obj.__qualname__]


def _in_refopt(module: str) -> bool:
    return module == "refopt" or module.startswith("refopt.")


def _lookup(module: str, qualname: str) -> Any:
    """The object reached as ``module.qualname``, importing ``module`` only if it belongs to the refopt package."""
    if not isinstance(module, str) or not isinstance(qualname, str) or not _in_refopt(module):
        raise CheckpointError(f"refusing to import {module}.{qualname}: only refopt objects are rebuilt")
    if "<locals>" in qualname or any(p.startswith("__") for p in qualname.split(".")):
        raise CheckpointError(f"cannot rebuild the object {module}.{qualname}")
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError, TypeError) as e:
        raise CheckpointError(f"unknown refopt object {module}.{qualname} ({e}); "
                              f"saved by another refopt version?") from None
    return obj


def _resolve(module: str, qualname: str) -> Any:
    """The refopt object stored as ``module.qualname``: defined there, or defined in refopt and re-exported
    under that name (refopt.gpt_labels is refopt.labels.gpt_labels); merely reachable is refused
    (refopt.checkpoint.os._exit is not a refopt object)."""
    obj = _lookup(module, qualname)
    if (getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)) != (module, qualname) and \
            not _importable(obj):
        raise CheckpointError(f"refusing {module}.{qualname}: it is not defined in the refopt package")
    return obj


def _importable(obj: Any) -> bool:
    """True if ``obj`` is the object its own ``__module__.__qualname__`` names inside refopt (so load can
    rebuild it)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or not _in_refopt(module):
        return False
    try:
        return _lookup(module, qualname) is obj
    except CheckpointError:
        return False


# --- rules and hyperparameters <-> JSON -----------------------------------------------------------

def _encode_value(v: Any, where: str) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, float)) and type(v) in (int, float):
        return v
    if isinstance(v, np.generic) and v.dtype.kind in "biuf":
        return {"__npscalar__": v.dtype.str, "value": v.item()}
    if isinstance(v, tuple) and not hasattr(type(v), "_fields"):
        return {"__tuple__": [_encode_value(a, f"{where}[{i}]") for i, a in enumerate(v)]}
    if isinstance(v, list):
        return [_encode_value(a, f"{where}[{i}]") for i, a in enumerate(v)]
    if isinstance(v, dict):
        items = []
        for k, a in v.items():
            if type(k) not in (str, int):
                raise CheckpointError(f"cannot serialize {where}: dict key {k!r} is not a str or int")
            items.append([k, _encode_value(a, f"{where}[{k!r}]")])
        return {"__dict__": items}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        if not _importable(type(v)):
            raise CheckpointError(f"cannot serialize {where}: {type(v).__module__}.{type(v).__qualname__} is "
                                  f"not a refopt class; save with rule=None and pass the rule to load")
        tag = "__rule__" if isinstance(v, Rule) else "__dataclass__"
        fields = {f.name: _encode_value(getattr(v, f.name), f"{where}.{f.name}")
                  for f in dataclasses.fields(v) if f.init}
        return {tag: _qualname(type(v)), "fields": fields}
    if isinstance(v, _types.FunctionType) and _importable(v):
        return {"__function__": _qualname(v)}
    raise CheckpointError(
        f"cannot serialize {where} = {v!r}: only refopt rules, refopt schedules and functions, and plain "
        f"numbers, strings, tuples, lists and dicts are stored. A user function (e.g. a lambda schedule or "
        f"labels function) cannot be: save with rule=None and pass the rule to load(path, rule=...)")


def _decode_value(v: Any, strict: bool = False) -> Any:
    if isinstance(v, list):
        return [_decode_value(a, strict) for a in v]
    if not isinstance(v, dict):
        return v
    if "__tuple__" in v:
        return tuple(_decode_value(a, strict) for a in v["__tuple__"])
    if "__dict__" in v:
        return {k: _decode_value(a, strict) for k, a in v["__dict__"]}
    if "__npscalar__" in v:
        return np.dtype(v["__npscalar__"]).type(v["value"])
    if "__function__" in v:
        f = _resolve(*v["__function__"])
        if not callable(f):
            raise CheckpointError(f"{'.'.join(v['__function__'])} is not a function")
        return f
    for tag in ("__rule__", "__dataclass__"):
        if tag in v:
            cls = _resolve(*v[tag])
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)) or \
                    (tag == "__rule__" and not issubclass(cls, Rule)):
                raise CheckpointError(f"{'.'.join(v[tag])} is not a refopt {tag.strip('_')} class")
            names = {f.name for f in dataclasses.fields(cls) if f.init}
            if not isinstance(v.get("fields"), dict) or not set(v["fields"]) <= names:
                raise CheckpointError(f"the stored {'.'.join(v[tag])} has fields the class lacks "
                                      f"({sorted(set(v.get('fields') or ()) - names)}); saved by another refopt "
                                      f"version?")
            if strict and set(v["fields"]) != names:   # a missing field would silently take its default
                raise CheckpointError(f"the stored {'.'.join(v[tag])} lacks the fields "
                                      f"{sorted(names - set(v['fields']))}; saved by another refopt version?")
            # otherwise a field the file lacks takes its default (golden files written before it was added)
            kwargs = {k: _decode_value(a, strict) for k, a in v["fields"].items()}
            try:
                return cls(**kwargs)
            except (TypeError, ValueError) as e:
                raise CheckpointError(f"cannot rebuild {'.'.join(v[tag])} from the checkpoint: {e}") from None
    raise CheckpointError(f"unknown entry in the stored rule: {v!r}")


def rule_to_json(rule: Rule) -> Any:
    """The JSON-able description of ``rule`` stored in checkpoints (raises CheckpointError if a field
    cannot be serialized, e.g. a lambda schedule)."""
    if not isinstance(rule, Rule):
        raise CheckpointError(f"expected a refopt rule, got {type(rule).__name__}")
    return _encode_value(rule, type(rule).__name__)


def rule_from_json(desc: Any, strict: bool = False) -> Rule:
    """Inverse of :func:`rule_to_json` (imports classes from the refopt package only). ``strict=True``
    (checkpoints) also refuses a description that lacks a field; otherwise missing fields take their
    defaults (golden files written before a field was added). Raises CheckpointError."""
    rule = _decode_value(desc, strict)
    if not isinstance(rule, Rule):
        raise CheckpointError("the stored rule is not a refopt rule")
    return rule


def describe(v: Any) -> Any:
    """``v`` as readable JSON-ready data: dataclasses (rules, schedules) as ``{"name": class name, field:
    value, ...}`` recursively, tuples as lists, functions by qualified name."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"name": type(v).__name__, **{f.name: describe(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    if isinstance(v, dict):
        return {str(k): describe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [describe(x) for x in v]
    return getattr(v, "__qualname__", repr(v))


def from_description(d: Any, kinds: dict) -> Any:
    """Inverse of :func:`describe` for the classes in ``kinds`` (name -> class): dicts with a known
    ``"name"`` are rebuilt (lists inside become tuples). ValueError for an unknown name or bad fields."""
    if isinstance(d, list):
        return tuple(from_description(x, kinds) for x in d)
    if not isinstance(d, dict):
        return d
    if d.get("name") not in kinds:
        raise ValueError(f"not a description of one of {sorted(kinds)}: {d!r}")
    kw = {k: from_description(v, kinds) for k, v in d.items() if k != "name"}
    try:
        return kinds[d["name"]](**kw)
    except TypeError as e:
        raise ValueError(f"bad fields for {d['name']}: {e}") from None


def nested_rules(rule: Rule):
    """The rules inside ``rule``'s fields (a wrapper's base, a Partition's rules), depth first."""
    for f in dataclasses.fields(rule):
        stack = [getattr(rule, f.name)]
        while stack:
            v = stack.pop()
            if isinstance(v, Rule):
                yield v
                yield from nested_rules(v)
            elif isinstance(v, dict):
                stack.extend(v.values())
            elif isinstance(v, (list, tuple)):
                stack.extend(v)
