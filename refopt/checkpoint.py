"""Checkpoints: params, optimizer state and rule in one file; resuming is bit-exact.

File format (``FORMAT_VERSION`` 1). One zip archive (numpy's ``.npz`` layout, uncompressed) holding

* one ``.npy`` member per array, named by where it lives: ``params/<path>`` and ``state/<path>`` with the
  leaf paths of :mod:`refopt.tree` (``params/layers[0].w``, ``state/leaves.layers[0].w.m``);
* ``metadata.json`` (read it with ``unzip -p ckpt.npz metadata.json``)::

      {"format": "refopt-checkpoint", "format_version": 1, "refopt_version": "...",
       "rule": <the rule, serialized recursively, or null>,
       "params": <tree>, "state": <tree>, "extra": {...user metadata...}}

  where a tree is ``{"def": <treedef>, "leaves": [<leaf>, ...]}``. The treedef records every container
  (dict keys with their types, list, tuple, NamedTuple by module and qualified name, None); each leaf is an
  array ``{"kind": "array", "key", "dtype", "shape", "sha256"}`` (sha256 of the C-order bytes), a numpy
  scalar ``{"kind": "npscalar", "key", "dtype", "sha256"}`` (kept as a 0-d array so that np.float32 stays
  np.float32) or a Python scalar ``{"kind": "py", "value"}`` (int, float, bool, str, stored exactly: JSON
  floats are written with ``repr``, which round-trips; inf/nan as Infinity/NaN).

The rule is stored as ``{"__rule__": [module, qualname], "fields": {...}}`` with nested rules, schedules
(any dataclass of the refopt package: ``{"__dataclass__": ...}``), functions of the refopt package
(``{"__function__": ...}``, e.g. :func:`refopt.rules.partition.gpt_labels`), tuples, dicts and plain
scalars. Loading rebuilds it by importing the named class **only from the refopt package** (module
``refopt`` or ``refopt.*``), never arbitrary code; its ``__post_init__`` re-validates the fields.

Decision on what cannot be serialized (a lambda or user function as schedule or label function, a rule
class outside refopt): :func:`save` raises :class:`CheckpointError` naming the field, **before** writing
anything. Pass ``rule=None`` to save without the rule; :func:`load` then returns ``rule=None`` and you
supply the rule yourself (``load(path, rule=my_rule)`` returns it in place of the stored one).

NamedTuple types in params/state: those of refopt are re-imported; others are found in ``types=`` given
to :func:`load` (matched by module and qualified name) or else rebuilt as a ``collections.namedtuple`` of
the same name and fields (equal values, but a different type).

Writes are atomic: a temporary file in the target's directory, flushed and fsync'ed, then ``os.replace``
(a crash leaves either the old file or the new one, never half of one).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import importlib
import json
import os
import tempfile
import types as _types
import zipfile
import zlib
from typing import Any, Iterable, NamedTuple

import numpy as np

from refopt import tree as T
from refopt.core import OptState, Rule

FORMAT = "refopt-checkpoint"
FORMAT_VERSION = 1
META_NAME = "metadata.json"


class Checkpoint(NamedTuple):
    """What :func:`load` returns: ``params``, ``state`` (an OptState), ``rule`` (None if saved without)
    and ``metadata`` (the keyword arguments given to :func:`save` as ``extra_metadata``)."""

    params: Any
    state: OptState
    rule: Rule | None
    metadata: dict


# rules and hyperparameters <-> JSON live in refopt.serialize (one walker for checkpoints, config.json and
# golden vectors); these names are kept here for existing callers
from refopt.serialize import (CheckpointError, _decode_value, _encode_value, _in_refopt, _qualname,  # noqa: E402,F401
                              _resolve, rule_from_json, rule_to_json)


# --- trees <-> (treedef JSON, leaf records, arrays) -----------------------------------------------

def _encode_treedef(d: T.TreeDef) -> Any:
    kids = [_encode_treedef(c) for c in d.children]
    if d.kind in ("leaf", "none"):
        return {"kind": d.kind}
    if d.kind == "dict":
        for k in d.meta:
            if type(k) not in (str, int):
                raise CheckpointError(f"cannot store a dict key {k!r} of type {type(k).__name__} (str or int only)")
        return {"kind": "dict", "keys": list(d.meta), "children": kids}
    if d.kind == "namedtuple":
        return {"kind": "namedtuple", "type": _qualname(d.meta), "fields": list(d.meta._fields),
                "children": kids}
    return {"kind": d.kind, "children": kids}


def _decode_treedef(e: Any, types_: dict) -> T.TreeDef:
    kind = e["kind"]
    if kind in ("leaf", "none"):
        return T.TreeDef(kind, None, ())
    kids = tuple(_decode_treedef(c, types_) for c in e["children"])
    if kind == "dict":
        return T.TreeDef("dict", tuple(e["keys"]), kids)
    if kind == "namedtuple":
        module, qualname = e["type"]
        fields = tuple(e["fields"])
        if f"{module}.{qualname}" in types_:
            cls = types_[f"{module}.{qualname}"]
        elif _in_refopt(module):
            cls = _resolve(module, qualname)
        else:
            cls = collections.namedtuple(qualname.split(".")[-1], fields)
        if not (isinstance(cls, type) and issubclass(cls, tuple) and tuple(getattr(cls, "_fields", ())) == fields):
            raise CheckpointError(f"{module}.{qualname} is not a NamedTuple with fields {fields}")
        return T.TreeDef("namedtuple", cls, kids)
    if kind in ("list", "tuple"):
        return T.TreeDef(kind, None, kids)
    raise CheckpointError(f"unknown tree node kind {kind!r}")


def _sha256(a: np.ndarray) -> str:
    """sha256 of the array's C-order bytes (dtype and shape are checked separately)."""
    return hashlib.sha256(np.asarray(a, order="C").reshape(-1).view(np.uint8).data).hexdigest()


def _encode_tree(tree: Any, prefix: str, arrays: dict) -> dict:
    leaves, paths, td = T.flatten(tree)
    recs = []
    for leaf, path in zip(leaves, paths):
        key = f"{prefix}/{path}"
        if isinstance(leaf, np.ndarray) or isinstance(leaf, np.generic):
            a = np.asarray(leaf)
            if a.dtype.kind not in "biufc":
                raise CheckpointError(f"cannot store {key}: dtype {a.dtype} (numeric arrays only)")
            if key in arrays:
                raise CheckpointError(f"two leaves share the name {key}")
            a = np.asarray(a, order="C")
            arrays[key] = a
            kind = "npscalar" if isinstance(leaf, np.generic) else "array"
            recs.append({"kind": kind, "key": key, "dtype": a.dtype.str, "shape": list(a.shape),
                         "sha256": _sha256(a)})
        elif leaf is None or type(leaf) in (bool, int, float, str):
            recs.append({"kind": "py", "value": leaf})
        else:
            raise CheckpointError(f"cannot store the leaf {key} of type {type(leaf).__name__} "
                                  f"(arrays, numpy scalars, int, float, bool, str only)")
    return {"def": _encode_treedef(td), "leaves": recs}


def _decode_tree(enc: dict, arrays: dict, types_: dict) -> Any:
    td = _decode_treedef(enc["def"], types_)
    leaves = []
    for rec in enc["leaves"]:
        if rec["kind"] == "py":
            leaves.append(rec["value"])
            continue
        a = arrays[rec["key"]]
        leaves.append(a[()] if rec["kind"] == "npscalar" else a)
    try:
        return T.unflatten(td, leaves)
    except (StopIteration, ValueError) as e:
        raise CheckpointError(f"the stored tree definition and its leaves disagree ({e})") from None


# --- save / load --------------------------------------------------------------------------------

def save(path: str | os.PathLike, params: Any, state: OptState, rule: Rule | None,
         **extra_metadata: Any) -> None:
    """Write ``params``, ``state`` and ``rule`` to the checkpoint file ``path`` (atomically).

    Args:
      path: the file to (over)write; no suffix is added (``.npz`` is customary).
      params: the params tree (floating ndarray leaves) the state belongs to.
      state: the :class:`~refopt.core.OptState` from refopt.init / update (checked against params).
      rule: the rule, or None to store no rule (needed when it holds a user function).
      extra_metadata: JSON-serializable values stored as ``metadata`` (e.g. step=..., seed=...).

    Raises:
      CheckpointError: a rule field, a state leaf or an extra value cannot be serialized (nothing is
        written then), or state does not match params.
      OSError: the file cannot be written.
    """
    from refopt import __version__
    if not isinstance(state, OptState):
        raise CheckpointError(f"state must be an OptState from refopt.init, got {type(state).__name__}")
    try:
        T.flatten_up_to(T.structure(params), state.leaves, name="state.leaves")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    arrays: dict[str, np.ndarray] = {}
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "refopt_version": __version__,
        "rule": None if rule is None else rule_to_json(rule),
        "params": _encode_tree(params, "params", arrays),
        "state": _encode_tree(state, "state", arrays),
        "extra": extra_metadata,
    }
    try:
        text = json.dumps(meta, indent=1, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"extra metadata is not JSON-serializable: {e}") from None

    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
                # fixed member timestamps and modes: the same checkpoint gives the same bytes
                z.writestr(_member(META_NAME), text)
                for key, a in arrays.items():
                    with z.open(_member(key + ".npy"), "w", force_zip64=True) as m:
                        np.lib.format.write_array(m, a, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable (POSIX); harmless to skip where unsupported
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _member(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_STORED
    return info


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _open(path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(os.fspath(path), "r")
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise CheckpointError(f"{path} is not a readable refopt checkpoint (truncated or corrupted?): {e}") \
            from None


def _read_meta(z: zipfile.ZipFile, path) -> dict:
    try:
        meta = json.loads(z.read(META_NAME).decode("utf-8"))
    except KeyError:
        raise CheckpointError(f"{path} has no {META_NAME}: not a refopt checkpoint") from None
    except (zipfile.BadZipFile, EOFError, OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable {META_NAME} (truncated or corrupted?): {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a refopt checkpoint (format {meta.get('format')!r})"
                              if isinstance(meta, dict) else f"{path}: malformed {META_NAME}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format version {meta.get('format_version')!r}; this "
                              f"refopt reads version {FORMAT_VERSION}")
    return meta


def read_metadata(path: str | os.PathLike) -> dict:
    """The full metadata header of a checkpoint (format, versions, rule, trees, extra) without reading
    the arrays. Raises CheckpointError like :func:`load`."""
    with _open(path) as z:
        return _read_meta(z, path)


def load(path: str | os.PathLike, rule: Rule | None = None,
         types: Iterable[type] = ()) -> Checkpoint:
    """Read a checkpoint written by :func:`save`: ``(params, state, rule, metadata)``.

    The arrays come back as fresh, writable, C-contiguous arrays of the saved dtype (so
    :func:`refopt.update_` can continue in place), every one checked against its sha256. Python scalars
    of the state (t, labels, weight sums) come back with their exact type and value, numpy scalars as the
    same numpy type. Continuing from the loaded state gives bit for bit the trajectory that was
    interrupted.

    Args:
      path: the checkpoint file.
      rule: if given, returned instead of the stored rule (needed when the checkpoint was saved with
        ``rule=None``); it is not compared with the stored one.
      types: NamedTuple classes from outside refopt used in params (matched by module and qualname).

    Raises:
      FileNotFoundError: no such file.
      CheckpointError: truncated or corrupted file, sha256 / dtype / shape mismatch, a missing or
        unexpected array, another format or format version, or a stored class refopt does not have.
    """
    types_ = {f"{c.__module__}.{c.__qualname__}": c for c in types}
    with _open(path) as z:
        meta = _read_meta(z, path)
        try:
            recs = [r for part in ("params", "state") for r in meta[part]["leaves"] if r["kind"] != "py"]
            names = set(z.namelist()) - {META_NAME}
            wanted = {r["key"] + ".npy" for r in recs}
            if names - wanted:
                raise CheckpointError(f"{path}: unexpected members {sorted(names - wanted)[:3]}")
            arrays = {}
            for r in recs:
                arrays[r["key"]] = _read_array(z, r, path)
            params = _decode_tree(meta["params"], arrays, types_)
            state = _decode_tree(meta["state"], arrays, types_)
        except (KeyError, TypeError, IndexError) as e:
            raise CheckpointError(f"{path}: malformed metadata ({type(e).__name__}: {e})") from None
    if not isinstance(state, OptState):
        raise CheckpointError(f"{path}: the stored state is not an OptState")
    try:
        T.flatten_up_to(T.structure(params), state.leaves, name="state.leaves")
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    if rule is None and meta["rule"] is not None:
        rule = rule_from_json(meta["rule"])
    return Checkpoint(params, state, rule, meta.get("extra", {}))


def _read_array(z: zipfile.ZipFile, rec: dict, path) -> np.ndarray:
    key = rec["key"]
    try:
        with z.open(key + ".npy") as m:           # streamed: no second copy of the bytes in memory
            a = np.lib.format.read_array(m, allow_pickle=False)
            m.read()                              # reach the end so that the zip CRC is checked
    except KeyError:
        raise CheckpointError(f"{path}: the array {key} is missing") from None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, zlib.error) as e:
        raise CheckpointError(f"{path}: the array {key} is unreadable (truncated or corrupted?): {e}") from None
    if a.dtype.str != rec["dtype"] or list(a.shape) != list(rec["shape"]):
        raise CheckpointError(f"{path}: the array {key} is {a.dtype.str}{list(a.shape)}, the metadata says "
                              f"{rec['dtype']}{rec['shape']}")
    if _sha256(a) != rec["sha256"]:
        raise CheckpointError(f"{path}: sha256 mismatch for {key} (the file is corrupted)")
    return np.require(a, requirements=["C", "W"])
