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
import math
import os
import struct
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
    if kind not in ("dict", "namedtuple", "list", "tuple"):
        raise CheckpointError(f"unknown tree node kind {kind!r}")
    kids = tuple(_decode_treedef(c, types_) for c in e["children"])
    if kind == "dict":
        keys = tuple(e["keys"])
        if len(keys) != len(kids) or any(type(k) not in (str, int) for k in keys) or len(set(keys)) != len(keys):
            raise CheckpointError(f"a stored dict has keys {list(keys)[:5]}: not {len(kids)} distinct str or int")
        return T.TreeDef("dict", keys, kids)
    if kind == "namedtuple":
        module, qualname = e["type"]
        fields = tuple(e["fields"])
        if len(fields) != len(kids) or not all(isinstance(f, str) for f in fields):
            raise CheckpointError(f"a stored NamedTuple {qualname!r} has fields {list(fields)[:5]} for "
                                  f"{len(kids)} children")
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
      CheckpointError: a rule field, a state leaf or an extra value cannot be serialized, or state does
        not match params (other containers, or an array whose shape or dtype differs from the state
        ``refopt.init(rule, params)`` makes; without a rule, from the parameter's unless 0-d or empty).
        Nothing is written then.
      FileNotFoundError: the directory of ``path`` does not exist (nothing is created).
      OSError: the file cannot be written.
    """
    from refopt import __version__
    if not isinstance(state, OptState):
        raise CheckpointError(f"state must be an OptState from refopt.init, got {type(state).__name__}")
    _check_state(params, state, rule)
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
    if not os.path.isdir(directory):   # else mkstemp's error would name its temporary file, not the folder
        raise FileNotFoundError(f"cannot save the checkpoint {path}: the directory {directory} does not exist")
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


#: what a corrupted file can make the zip and npy readers raise; all become CheckpointError
_READ_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, zlib.error, ValueError,
                NotImplementedError, RuntimeError, UnicodeDecodeError, struct.error, OverflowError)
#: what malformed metadata can make decoding raise (a missing key, a wrong type, a bad name ...)
_META_ERRORS = (KeyError, TypeError, IndexError, AttributeError, ValueError, OverflowError, RecursionError)
_MAX_META_BYTES = 1 << 28      # 256 MiB of JSON is far beyond any real tree description


def _open(path) -> zipfile.ZipFile:
    """The archive at ``path``, after checking every member is stored the way :func:`save` writes it
    (uncompressed, unencrypted, its sizes within the file), so that no read allocates more than the file
    holds and no decompressor or decrypter runs on untrusted bytes."""
    path = os.fspath(path)
    try:
        z = zipfile.ZipFile(path, "r")
    except FileNotFoundError:
        raise
    except _READ_ERRORS as e:
        raise CheckpointError(f"{path} is not a readable refopt checkpoint (truncated or corrupted?): {e}") \
            from None
    try:
        size = os.path.getsize(path)
        names = set()
        for info in z.infolist():
            if info.filename in names:
                raise CheckpointError(f"{path}: the member {info.filename!r} appears twice (corrupted?)")
            names.add(info.filename)
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                raise CheckpointError(f"{path}: the member {info.filename!r} is compressed or encrypted; "
                                      f"refopt writes stored members only (truncated or corrupted?)")
            if info.file_size != info.compress_size or info.compress_size > size:
                raise CheckpointError(f"{path}: the member {info.filename!r} claims {info.file_size} bytes, "
                                      f"more than the file holds (truncated or corrupted?)")
    except BaseException:
        z.close()
        raise
    return z


def _read_meta(z: zipfile.ZipFile, path) -> dict:
    try:
        if z.getinfo(META_NAME).file_size > _MAX_META_BYTES:
            raise CheckpointError(f"{path}: {META_NAME} is larger than {_MAX_META_BYTES} bytes (corrupted?)")
        meta = json.loads(z.read(META_NAME).decode("utf-8"))
    except KeyError:
        raise CheckpointError(f"{path} has no {META_NAME}: not a refopt checkpoint") from None
    except (*_READ_ERRORS, RecursionError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: unreadable {META_NAME} (truncated or corrupted?): {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a refopt checkpoint (format {meta.get('format')!r})"
                              if isinstance(meta, dict) else f"{path}: malformed {META_NAME}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format version {meta.get('format_version')!r}; this "
                              f"refopt reads version {FORMAT_VERSION}")
    _check_meta(meta, path)
    return meta


def _check_meta(meta: dict, path) -> None:
    """Check the shape of the metadata header (every key present, every leaf record well formed) before
    anything is read or built from it. Raises CheckpointError naming the first problem."""
    def bad(what):
        raise CheckpointError(f"{path}: malformed {META_NAME}: {what}")

    for key in ("refopt_version", "rule", "params", "state", "extra"):
        if key not in meta:
            bad(f"no {key!r} entry")
    if not isinstance(meta["extra"], dict):
        bad("'extra' is not an object")
    seen = set()
    for part in ("params", "state"):
        tree = meta[part]
        if not isinstance(tree, dict) or not isinstance(tree.get("def"), dict) or \
                not isinstance(tree.get("leaves"), list):
            bad(f"{part!r} is not a tree ({{'def': ..., 'leaves': [...]}})")
        for i, rec in enumerate(tree["leaves"]):
            where = f"{part} leaf {i}"
            if not isinstance(rec, dict) or rec.get("kind") not in ("py", "array", "npscalar"):
                bad(f"{where} has no valid 'kind'")
            if rec["kind"] == "py":
                if "value" not in rec or not (rec["value"] is None or type(rec["value"]) in (bool, int, float, str)):
                    bad(f"{where}: a Python scalar leaf needs a 'value' (None, bool, int, float or str)")
                continue
            key, dtype, shape, digest = (rec.get(k) for k in ("key", "dtype", "shape", "sha256"))
            if not isinstance(key, str) or not key.startswith(part + "/") or key in seen:
                bad(f"{where}: its 'key' {key!r} is not a unique name under {part}/")
            seen.add(key)
            if not isinstance(digest, str) or len(digest) != 64:
                bad(f"{key}: no valid 'sha256'")
            try:
                ok_dtype = isinstance(dtype, str) and np.dtype(dtype).kind in "biufc" and np.dtype(dtype).str == dtype
            except _META_ERRORS:
                ok_dtype = False
            if not ok_dtype:
                bad(f"{key}: 'dtype' {dtype!r} is not a numeric numpy dtype string")
            if not isinstance(shape, list) or len(shape) > 64 or \
                    not all(type(n) is int and n >= 0 for n in shape) or (rec["kind"] == "npscalar" and shape):
                bad(f"{key}: 'shape' {shape!r} is not a list of sizes >= 0")


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
        ``rule=None``); a :class:`refopt.RefoptWarning` says so when it differs from the stored one (e.g.
        an Adam checkpoint continued as AdamW: the state fits both).
      types: NamedTuple classes from outside refopt used in params (matched by module and qualname).

    Raises:
      FileNotFoundError: no such file.
      CheckpointError: whatever is wrong with the file: truncated or corrupted bytes, a compressed or
        encrypted member, malformed metadata (a key missing, a wrong type, an invalid tree definition),
        sha256 / dtype / shape mismatch between an array and the metadata, a missing or unexpected
        array, a state that does not fit params and rule (as in :func:`save`), another format or format
        version, or a stored class refopt does not have. No array is allocated before its npy header
        and member size agree with the metadata, and nothing but refopt classes is imported.
    """
    types_ = {f"{c.__module__}.{c.__qualname__}": c for c in types}
    given_rule = rule is not None
    with _open(path) as z:
        meta = _read_meta(z, path)
        recs = [r for part in ("params", "state") for r in meta[part]["leaves"] if r["kind"] != "py"]
        names = set(z.namelist()) - {META_NAME}
        wanted = {r["key"] + ".npy" for r in recs}
        if names - wanted:
            raise CheckpointError(f"{path}: unexpected members {sorted(names - wanted)[:3]}")
        arrays = {r["key"]: _read_array(z, r, path) for r in recs}
    try:
        params = _decode_tree(meta["params"], arrays, types_)
        state = _decode_tree(meta["state"], arrays, types_)
        if rule is None and meta["rule"] is not None:
            rule = rule_from_json(meta["rule"], strict=True)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except _META_ERRORS as e:
        raise CheckpointError(f"{path}: malformed metadata ({type(e).__name__}: {e})") from None
    if not isinstance(state, OptState) or type(state.t) is not int or state.t < 0:
        raise CheckpointError(f"{path}: the stored state is not an OptState with a step count t >= 0")
    try:
        _check_state(params, state, rule)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    if given_rule and meta["rule"] is not None:
        try:      # compared as rules (Adam(lr=np.float64(1e-3)) == Adam(lr=1e-3)), not as their JSON
            same = rule_from_json(meta["rule"], strict=True) == rule
        except Exception:          # noqa: BLE001 - a stored rule that cannot be rebuilt: nothing to compare
            same = True
        if not same:
            import warnings

            from refopt.rules.partition import RefoptWarning

            stored = meta["rule"].get("__rule__", ["", "?"])[-1] if isinstance(meta["rule"], dict) else "?"
            warnings.warn(f"{path}: the rule given to load ({type(rule).__name__}) differs from the rule stored "
                          f"with the checkpoint ({stored}, or the same class with other hyperparameters); the "
                          f"stored state is continued with the given rule", RefoptWarning, stacklevel=2)
    return Checkpoint(params, state, rule, meta["extra"])


def _check_state(params: Any, state: OptState, rule: Rule | None) -> None:
    """Raise CheckpointError unless ``state.leaves`` fits ``params``: the same containers and, leaf by
    leaf, the per-leaf state that ``rule`` would create (structure, array shapes and dtypes). Without a
    rule, every state array must have its parameter's dtype and its shape, or be 0-d or empty."""
    try:
        xs, paths, _ = T.flatten(params)
        subtrees = T.flatten_up_to(T.structure(params), state.leaves, name="state.leaves")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if not all(isinstance(x, np.ndarray) and x.dtype.kind == "f" for x in xs):
        raise CheckpointError("every params leaf must be a floating ndarray")
    expected = None
    if rule is not None:
        try:   # the state the rule creates for arrays of these shapes (ones: no value-dependent refusal)
            ones = T.unflatten(T.structure(params), [np.ones_like(x) for x in xs])
            expected = T.flatten_up_to(T.structure(params), _init(rule, ones).leaves, name="state.leaves")
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"the rule {type(rule).__name__} cannot take these params: {e}") from None
        g0 = rule.init_global()
        if T.structure(state.glob) != T.structure(g0) or \
                any(_kind(a) != _kind(b) for a, b in zip(T.leaves(state.glob), T.leaves(g0))):
            raise CheckpointError(f"the global state {T.structure(state.glob)} is not of the kind "
                                  f"{T.structure(g0)} that {type(rule).__name__} keeps")
    for i, (x, s, p) in enumerate(zip(xs, subtrees, paths)):
        got_leaves, _, got_def = T.flatten(s)
        if expected is not None:
            want_leaves, _, want_def = T.flatten(expected[i])
            if got_def != want_def:
                raise CheckpointError(f"the state of {p} does not match params and rule: it is {got_def}, "
                                      f"{type(rule).__name__} makes {want_def}")
            for a, b in zip(got_leaves, want_leaves):
                if not isinstance(b, np.ndarray) and (_kind(a) != _kind(b) or (isinstance(b, str) and a != b)):
                    # e.g. a Partition label, which must be the one the rule gives this parameter
                    raise CheckpointError(f"the state of {p} holds {a!r} where {type(rule).__name__} keeps {b!r}")
                if isinstance(b, np.ndarray) and not (isinstance(a, np.ndarray) and a.shape == b.shape
                                                      and a.dtype == b.dtype):
                    what = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
                    raise CheckpointError(f"the state of {p} holds {what} where {type(rule).__name__} keeps "
                                          f"{b.dtype}{list(b.shape)} for the parameter {x.dtype}{list(x.shape)}")
        else:
            for a in got_leaves:
                if isinstance(a, np.ndarray) and not (a.dtype == x.dtype and (a.shape == x.shape or a.ndim == 0
                                                                              or a.size == 0)):
                    raise CheckpointError(f"the state of {p} holds an array {a.dtype}{list(a.shape)} that does "
                                          f"not match the parameter {x.dtype}{list(x.shape)}")


def _kind(v: Any) -> str:
    """What a state leaf is, loosely: numbers of any Python or numpy type (not bool) are alike, so a
    rule may keep a float that a schedule turned into an np.float64."""
    if isinstance(v, np.ndarray):
        return f"array{v.ndim}"
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, (int, float, np.number)):
        return "number"
    return type(v).__name__


def _init(rule: Rule, params: Any) -> OptState:
    from refopt.core import init
    return init(rule, params)


def _read_array(z: zipfile.ZipFile, rec: dict, path) -> np.ndarray:
    """The array ``rec`` promises, read from its member: the npy header is checked against the metadata
    (dtype, shape, C order) and the member's size against the header *before* the array is allocated, so
    a forged header cannot make load allocate more than the metadata promises."""
    key = rec["key"]
    dtype = np.dtype(rec["dtype"])
    shape = tuple(rec["shape"])
    nbytes = dtype.itemsize * math.prod(shape)
    try:
        info = z.getinfo(key + ".npy")
    except KeyError:
        raise CheckpointError(f"{path}: the array {key} is missing") from None
    try:
        with z.open(info) as m:
            version = np.lib.format.read_magic(m)
            if version == (1, 0):
                h_shape, fortran, h_dtype = np.lib.format.read_array_header_1_0(m)
            elif version == (2, 0):
                h_shape, fortran, h_dtype = np.lib.format.read_array_header_2_0(m)
            else:
                raise ValueError(f"npy format version {version}")
            if h_dtype != dtype or h_dtype.str != rec["dtype"] or tuple(h_shape) != shape or fortran:
                raise CheckpointError(f"{path}: the array {key} is {h_dtype.str}{list(h_shape)}"
                                      f"{' (Fortran order)' if fortran else ''}, the metadata says "
                                      f"{rec['dtype']}{rec['shape']}")
            if info.file_size - m.tell() != nbytes:
                raise CheckpointError(f"{path}: the array {key} holds {info.file_size - m.tell()} bytes of data, "
                                      f"its header promises {nbytes} (truncated or corrupted?)")
            a = np.empty(shape, dtype)
            if nbytes and m.readinto(memoryview(a.reshape(-1).view(np.uint8))) != nbytes:
                raise EOFError("the member ends early")
            m.read()                              # reach the end so that the zip CRC is checked
    except CheckpointError:
        raise
    except _READ_ERRORS as e:
        raise CheckpointError(f"{path}: the array {key} is unreadable (truncated or corrupted?): {e}") from None
    if _sha256(a) != rec["sha256"]:
        raise CheckpointError(f"{path}: sha256 mismatch for {key} (the file is corrupted)")
    return a
