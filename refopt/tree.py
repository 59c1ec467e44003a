"""Pytrees: nested dict / list / tuple / NamedTuple containers with array leaves.

This is the only module that knows how containers nest. Everything that walks params, grads or
optimizer states goes through :func:`flatten` / :func:`unflatten` (or :func:`tree_map`, built on them).

Conventions
-----------
* Containers: ``dict`` (keys visited in sorted order, so two dicts with the same keys always flatten the
  same way), ``list``, ``tuple`` and ``NamedTuple`` (fields in declaration order). ``None`` is an empty
  container (no leaves). Everything else is a leaf; a bare ``ndarray`` is a tree of one leaf.
* Paths name a leaf the way Python would reach it: dict key ``k`` -> ``.k`` (or ``['k']`` when ``k`` is
  not an identifier), sequence index ``i`` -> ``[i]``, NamedTuple field ``f`` -> ``.f``. The leading dot is
  dropped, so ``{"layers": [{"w": W}]}`` names ``W`` as ``layers[0].w``. The root leaf's path is ``<root>``.
"""
from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple

import numpy as np

ROOT = "<root>"


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


class TreeDef(NamedTuple):
    """The shape of a tree without its leaves: ``kind`` is 'leaf', 'none', 'dict', 'list', 'tuple' or
    'namedtuple'; ``meta`` the dict keys / NamedTuple type; ``children`` the sub-definitions."""

    kind: str
    meta: Any
    children: tuple

    def __str__(self) -> str:  # compact, for error messages
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        inner = ", ".join(str(c) for c in self.children)
        if self.kind == "dict":
            inner = ", ".join(f"{k!r}: {c}" for k, c in zip(self.meta, self.children))
            return "{" + inner + "}"
        if self.kind == "list":
            return "[" + inner + "]"
        if self.kind == "namedtuple":
            return f"{self.meta.__name__}({inner})"
        return "(" + inner + ("," if len(self.children) == 1 else "") + ")"


_LEAF = TreeDef("leaf", None, ())


def _key_path(prefix: str, key: Any) -> str:
    if isinstance(key, str):
        return f"{prefix}.{key}" if key.isidentifier() else f"{prefix}[{key!r}]"
    return f"{prefix}[{key!r}]"


def _children(node: Any) -> tuple[str, Any, list[tuple[Any, Any]]]:
    """(kind, meta, [(key, child), ...]) for a container node."""
    if node is None:
        return "none", None, []
    if isinstance(node, dict):
        keys = _sorted_keys(node)
        return "dict", tuple(keys), [(k, node[k]) for k in keys]
    if _is_namedtuple(node):
        return "namedtuple", type(node), [(f, getattr(node, f)) for f in node._fields]
    if isinstance(node, list):
        return "list", None, list(enumerate(node))
    if isinstance(node, tuple):
        return "tuple", None, list(enumerate(node))
    return "leaf", None, []


def _sorted_keys(node: dict) -> list:
    keys = list(node)
    if all(type(k) is str for k in keys):   # the common case: the same order as the general key below
        keys.sort()
        return keys
    return sorted(keys, key=lambda k: (type(k).__name__, k))


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None,
            with_paths: bool = True) -> tuple[list, list[str], TreeDef]:
    """Flatten ``tree`` into ``(leaves, paths, treedef)`` in a fixed depth-first order.

    ``is_leaf(node) -> bool`` may stop the descent early (e.g. to treat per-leaf state NamedTuples as
    leaves). The walk recurses once per level of container nesting (a handful for real models).
    ``with_paths=False`` skips the path strings (``paths`` is then empty); they are a function of the
    treedef alone (:func:`treedef_paths`).
    """
    leaves: list = []
    append = leaves.append
    ndarray = np.ndarray

    def build(node: Any) -> TreeDef:
        if type(node) is ndarray or (is_leaf is not None and is_leaf(node)):
            append(node)
            return _LEAF
        if type(node) is dict:
            keys = _sorted_keys(node)
            kids = []
            for k in keys:
                child = node[k]
                if type(child) is ndarray and is_leaf is None:   # the common leaf, without a call
                    append(child)
                    kids.append(_LEAF)
                else:
                    kids.append(build(child))
            return TreeDef("dict", tuple(keys), tuple(kids))
        kind, meta, items = _children(node)
        if kind == "leaf":
            append(node)
            return _LEAF
        return TreeDef(kind, meta, tuple([build(child) for _, child in items]))

    treedef = build(tree)
    return leaves, (list(treedef_paths(treedef)) if with_paths else []), treedef


def treedef_paths(treedef: TreeDef) -> tuple[str, ...]:
    """The leaf paths of a tree of definition ``treedef`` (e.g. ``layers[1].w``), in flatten order."""
    out: list[str] = []

    def walk(d: TreeDef, path: str) -> None:
        if d.kind == "leaf":
            out.append((path[1:] if path.startswith(".") else path) or ROOT)
            return
        keys = d.meta if d.kind == "dict" else (d.meta._fields if d.kind == "namedtuple" else range(len(d.children)))
        for k, c in zip(keys, d.children):
            walk(c, _key_path(path, k))

    walk(treedef, "")
    return tuple(out)


def leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list:
    """The leaves of ``tree`` in flatten order."""
    return flatten(tree, is_leaf, with_paths=False)[0]


def paths(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[str]:
    """The leaf paths of ``tree`` (e.g. ``layers[1].w``) in flatten order."""
    return flatten(tree, is_leaf)[1]


def structure(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> TreeDef:
    """The :class:`TreeDef` of ``tree``."""
    return flatten(tree, is_leaf)[2]


def unflatten(treedef: TreeDef, leaves_: list) -> Any:
    """Rebuild a tree of shape ``treedef`` from ``leaves_`` (in flatten order)."""
    it = iter(leaves_)

    def build(d: TreeDef) -> Any:
        if d.kind == "leaf":
            try:
                return next(it)
            except StopIteration:
                raise ValueError("unflatten: fewer leaves than the tree definition holds") from None
        if d.kind == "none":
            return None
        kids = [build(c) for c in d.children]
        if d.kind == "dict":
            return dict(zip(d.meta, kids))
        if d.kind == "namedtuple":
            return d.meta(*kids)
        if d.kind == "list":
            return kids
        return tuple(kids)

    out = build(treedef)
    if next(it, _SENTINEL) is not _SENTINEL:
        raise ValueError("unflatten: more leaves than the tree definition holds")
    return out


_SENTINEL = object()


_PATH_PART = re.compile(r"(\.?)([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[('(?:[^'\\]|\\.)*')\]")


def _path_keys(path: str) -> list:
    """The dict keys (str) and sequence indices (int) of a path as :func:`flatten` writes it."""
    import ast

    keys, pos = [], 0
    while pos < len(path):
        m = _PATH_PART.match(path, pos)
        if m is None or (m.group(2) is not None and bool(m.group(1)) != (pos > 0)):
            raise ValueError(f"cannot read the tree path {path!r}")
        dot, name, index, quoted = m.groups()
        keys.append(name if name is not None else int(index) if index is not None else ast.literal_eval(quoted))
        pos = m.end()
    if not keys:
        raise ValueError(f"cannot read the tree path {path!r}")
    return keys


def from_paths(paths: list[str], leaves_: list) -> Any:
    """The tree of dicts and lists that holds ``leaves_[i]`` at ``paths[i]`` (paths as :func:`flatten` writes
    them, e.g. ``blocks[0].attn.w_q``, in any order; the indices of each list 0, 1, ... without a gap): the
    inverse of flattening a tree of dicts and lists, up to the order (its dicts flatten in sorted key order,
    whatever the order of ``paths``). Raises ValueError for a path it cannot read or paths that do not nest."""
    if len(paths) != len(leaves_):
        raise ValueError(f"{len(paths)} paths for {len(leaves_)} leaves")
    if list(paths) == [ROOT]:
        return leaves_[0]
    inner: dict = {}            # every container as a dict first (str keys: a dict; int keys: a list)
    nodes = set()
    for path, leaf in zip(paths, leaves_):
        keys = _path_keys(path)
        node = inner
        for i, k in enumerate(keys):
            last = i == len(keys) - 1
            if k in node and (last or id(node[k]) not in nodes):
                raise ValueError(f"the tree paths do not nest at {path!r}")
            if last:
                node[k] = leaf
            else:
                child = node.setdefault(k, {})
                nodes.add(id(child))
                node = child

    def build(node, where):
        if id(node) not in nodes and node is not inner:
            return node
        kinds = {type(k) for k in node}
        if len(kinds) > 1:
            raise ValueError(f"the tree paths do not nest: {where or 'the root'} has both names and indices")
        if kinds == {int}:
            if sorted(node) != list(range(len(node))):
                raise ValueError(f"the tree paths do not nest: the indices of {where or 'the root'} are "
                                 f"{sorted(node)}, not 0 .. {len(node) - 1}")
            return [build(node[k], f"{where}[{k}]") for k in range(len(node))]
        return {k: build(v, _key_path(where, k).lstrip(".")) for k, v in node.items()}

    return build(inner, "")


def tree_map(f: Callable, tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """``f`` applied leafwise to ``tree`` and the trees in ``rest`` (which must share its structure).

    Raises:
      ValueError: a tree in ``rest`` differs in structure; the message names the first differing path.
    """
    lv, pth, td = flatten(tree, is_leaf)
    others = []
    for r in rest:
        check_same_structure(tree, r, names=("tree", "other"), is_leaf=is_leaf)
        others.append(flatten(r, is_leaf)[0])
    return unflatten(td, [f(*args) for args in zip(lv, *others)])


def _keys_differ(first, second, names: tuple[str, str] = ("first", "second")) -> str:
    """'keys differ (only in NAME1: [...], only in NAME2: [...])' for two dicts' key tuples."""
    return (f"keys differ (only in {names[0]}: {sorted(set(first) - set(second), key=repr)}, "
            f"only in {names[1]}: {sorted(set(second) - set(first), key=repr)})")


def first_difference(a: TreeDef, b: TreeDef, path: str = "") -> str | None:
    """Path of the first node where two tree definitions differ, with what differs; None if equal."""
    if a.kind != b.kind or (a.kind == "namedtuple" and a.meta is not b.meta):
        wa = a.meta.__name__ if a.kind == "namedtuple" else a.kind
        wb = b.meta.__name__ if b.kind == "namedtuple" else b.kind
        return f"{path.lstrip('.') or ROOT}: {wa} vs {wb}"
    if a.kind == "dict" and a.meta != b.meta:
        return f"{path.lstrip('.') or ROOT}: {_keys_differ(a.meta, b.meta)}"
    if len(a.children) != len(b.children):
        return f"{path.lstrip('.') or ROOT}: length {len(a.children)} vs {len(b.children)}"
    keys = a.meta if a.kind == "dict" else (a.meta._fields if a.kind == "namedtuple" else range(len(a.children)))
    for k, ca, cb in zip(keys, a.children, b.children):
        d = first_difference(ca, cb, _key_path(path, k))
        if d is not None:
            return d
    return None


def check_same_structure(a: Any, b: Any, names: tuple[str, str] = ("params", "grads"),
                         is_leaf: Callable[[Any], bool] | None = None) -> None:
    """Raise ``ValueError`` naming the first differing path if ``a`` and ``b`` differ in structure."""
    _check_defs(structure(a, is_leaf), structure(b, is_leaf), names)


def _check_defs(da: TreeDef, db: TreeDef, names: tuple[str, str]) -> None:
    if da != db:
        raise ValueError(f"{names[0]} and {names[1]} trees differ at {first_difference(da, db)}")


def check_like(params: Any, grads: Any, names: tuple[str, str] = ("params", "grads")) -> tuple[list, list, list, TreeDef]:
    """Check that ``grads`` matches ``params`` leaf by leaf: same structure, ndarray leaves of the same
    shape and dtype, floating point. Raises ``ValueError`` (``TypeError`` for non-array leaves) naming
    the offending leaf path, e.g. ``layers[1].w``. Returns ``(param_leaves, grad_leaves, paths, treedef)``."""
    lp, paths_, dp = flatten(params)
    lg, _, dg = flatten(grads)
    _check_defs(dp, dg, names)
    for path, p, g in zip(paths_, lp, lg):
        for name, a in zip(names, (p, g)):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{name} leaf {path} is a {type(a).__name__}, expected a numpy ndarray")
            if isinstance(a, np.matrix):   # stays 2-D when flattened: pass np.asarray(m) instead
                raise TypeError(f"{name} leaf {path} is a numpy.matrix, expected a numpy ndarray "
                                f"(np.asarray(m) views it as one)")
            if isinstance(a, np.ma.MaskedArray):   # its mask would be ignored by every kernel
                raise TypeError(f"{name} leaf {path} is a numpy masked array, expected a numpy ndarray (the "
                                f"optimizers would ignore its mask; pass a.filled(v) or a.data)")
        if p.dtype not in (np.float32, np.float64) or not p.dtype.isnative:
            raise TypeError(f"{names[0]} leaf {path} has dtype {p.dtype}; optimizers need (native-endian) "
                            f"float32 or float64")
        if p.shape != g.shape:
            raise ValueError(f"shape mismatch at {path}: {names[0]} {p.shape} vs {names[1]} {g.shape}")
        if p.dtype != g.dtype:
            raise ValueError(f"dtype mismatch at {path}: {names[0]} {p.dtype} vs {names[1]} {g.dtype}")
    return lp, lg, paths_, dp


def zeros_like(tree: Any) -> Any:
    """A tree of zero arrays shaped like ``tree``."""
    return tree_map(np.zeros_like, tree)


def copy(tree: Any) -> Any:
    """A tree of fresh C-contiguous copies of the leaves of ``tree`` (containers rebuilt, arrays copied)."""
    return tree_map(lambda a: np.array(a, order="C", copy=True) if isinstance(a, np.ndarray) else a, tree)


def flatten_up_to(treedef: TreeDef, tree: Any, name: str = "state") -> list:
    """The subtrees of ``tree`` sitting at the leaf positions of ``treedef``, in flatten order.

    Used to pair each parameter leaf with its per-leaf optimizer state (a NamedTuple), and to take the
    leaves of a tree known to have ``treedef``'s shape without building a new definition. Raises
    ``ValueError`` naming the first path where ``tree`` does not have ``treedef``'s containers.
    """
    out: list = []
    append = out.append

    def walk(d: TreeDef, node: Any) -> None:
        kind = d.kind
        if kind == "leaf":
            append(node)
        elif kind == "dict" and type(node) is dict and len(node) == len(d.meta):
            try:
                kids = [node[k] for k in d.meta]
            except (KeyError, TypeError):
                raise _Mismatch from None
            for c, child in zip(d.children, kids):
                if c is _LEAF:
                    append(child)
                else:
                    walk(c, child)
        elif kind == "list" and type(node) is list and len(node) == len(d.children):
            for c, child in zip(d.children, node):
                if c is _LEAF:
                    append(child)
                else:
                    walk(c, child)
        elif kind == "none" and node is None:
            pass
        else:  # tuples, NamedTuples, subclasses: the general comparison
            k2, meta, items = _children(node)
            if not _matches(d, k2, meta, items):
                raise _Mismatch
            for (_, child), c in zip(items, d.children):
                walk(c, child)

    try:
        walk(treedef, tree)
    except _Mismatch:
        _raise_mismatch(treedef, tree, name)
    return out


class _Mismatch(Exception):
    pass


def _matches(d: TreeDef, kind: str, meta: Any, items: list) -> bool:
    """Whether a container node (as :func:`_children` reads it) has the container of ``d``."""
    return kind == d.kind and (kind != "namedtuple" or meta is d.meta) and len(items) == len(d.children) \
        and (kind != "dict" or meta == d.meta)


def _raise_mismatch(treedef: TreeDef, tree: Any, name: str) -> None:
    """The error of :func:`flatten_up_to`: the first path where ``tree`` lacks ``treedef``'s containers."""
    def walk(d: TreeDef, node: Any, path: str) -> None:
        if d.kind == "leaf":
            return
        kind, meta, items = _children(node)
        if not _matches(d, kind, meta, items):
            what = f"expected {d}, got {type(node).__name__}"
            if kind == d.kind == "dict":   # name the keys, not just the containers
                what = _keys_differ(d.meta, meta, ("params", name))
            raise ValueError(f"{name} tree does not match params at {path.lstrip('.') or ROOT}: {what}")
        for (key, child), cd in zip(items, d.children):
            walk(cd, child, _key_path(path, key))

    walk(treedef, tree, "")
    raise ValueError(f"{name} tree does not match params")  # pragma: no cover - walk raises first
