"""Partition: a different rule for each group of parameters, in one tree walk.

Practitioners train the hidden matrices of a network with Muon or Hyperball and everything else
(embeddings, the output head, norm gains, biases) with AdamW (Keller Jordan's Muon README;
modded-nanogpt; Moonlight). :class:`Partition` expresses this as one rule: each parameter leaf gets a
*label*, each label a rule, in the manner of optax's ``partition`` (``multi_transform``) combinator.

Labellings: the reference models give theirs as data, a tree of label strings shaped like the params
(``refopt.models.gpt.labels(params)``, ``refopt.models.mlp.labels(params)``; ``refopt.gpt_labels`` and
``refopt.mlp_labels`` are aliases), which checkpoints store; :func:`matrix_labels` (every 2-D array) is
optax.contrib.muon's default (CONVENTIONS.md 2.4).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import numpy as np

from refopt import tree as T
from refopt.core import Rule
from refopt.rules import _checks


class RefoptWarning(UserWarning):
    """A configuration that runs but probably does not do what was meant (e.g. a Partition rule that no
    parameter reaches). Turn it into an error with ``warnings.simplefilter("error", refopt.RefoptWarning)``."""

HIDDEN = "hidden"
OTHER = "other"


class PartitionLeaf(NamedTuple):
    """Per-array state of :class:`Partition`: the leaf's ``label`` (fixed at init) and the state of the
    rule that owns that label (``inner``)."""

    label: str
    inner: Any


@dataclass(frozen=True)
class Partition(Rule):
    r"""Apply ``rules[label(x)]`` to each parameter array x (one tree walk, as optax's ``partition``).

    For every leaf x_i with path p_i, ``label_i = labels(p_i, x_i)`` (or the string at p_i in a labels
    tree), fixed once at :func:`refopt.init`, and every step:

    .. math::

        x_i \leftarrow \text{step of } \mathrm{rules}[\mathrm{label}_i] \text{ on } (x_i, g_i, \mathrm{state}_i)

    Each sub-rule sees exactly what it would see alone: its own per-leaf state, its own global state and
    its own step context (``context`` of each sub-rule is called once per step with the shared t), and the
    leaf's real path. Hence a Partition step equals running every sub-rule on its own sub-tree, bit for
    bit. :func:`refopt.direction` and :func:`refopt.eval_params` dispatch the same way (so a Partition
    with a Schedule-Free or averaging sub-rule evaluates that group at its averaged weights).

    Args:
      rules: ``{label: rule}``, a non-empty dict with string labels and refopt rules as values. A rule
        whose label no leaf carries is allowed (it then just runs its ``context`` every step), but
        :func:`refopt.init` warns (:class:`RefoptWarning`) since it is usually a labelling mistake.
      labels: either a function ``(path, array) -> label`` (path as :mod:`refopt.tree` writes it, e.g.
        ``blocks[0].attn.w_q``; see :func:`matrix_labels`), or a tree of label strings with the same
        structure as params (e.g. ``refopt.models.gpt.labels(params)``); a labels tree is matched to params by
        leaf path.

    State: per leaf :class:`PartitionLeaf` ``(label, inner)``; global ``{label: sub-rule global}``.

    Shapes/dtypes: whatever each sub-rule accepts.

    Raises:
      ValueError: at construction: empty ``rules``, a non-string label, a value that is not a rule, a
        labels tree with a non-string leaf or a label without a rule (naming the leaf path). At
        :func:`refopt.init`: a params leaf with no entry in the labels tree, or a label function returning
        a label without a rule; the message names the leaf path.

    Limitation: a labels tree with *extra* entries for paths that params lacks is only detected if the
    driver passes the full path list to :meth:`check_params` (see its docstring).
    """

    rules: Mapping[str, Rule] = None
    labels: Any = None

    def __post_init__(self):
        if not isinstance(self.rules, Mapping) or not self.rules:
            raise ValueError(f"rules must be a non-empty dict {{label: rule}}, got {self.rules!r}")
        for k, r in self.rules.items():
            if not isinstance(k, str) or not k:
                raise ValueError(f"rules: labels must be non-empty strings, got {k!r}")
            if not isinstance(r, Rule):
                raise ValueError(f"rules[{k!r}] must be a refopt rule, got {type(r).__name__}")
            if "closure" in r.inputs:
                raise ValueError(f"rules[{k!r}]: {type(r).__name__} evaluates the loss at other points of the whole "
                                 f"params (closure=), so it cannot step a part of them; use it alone")
        object.__setattr__(self, "rules", _checks.FrozenDict(self.rules))   # the walk validated these rules
        if self.labels is None:
            raise ValueError("labels must be a function (path, array) -> label or a tree of labels")
        table = None
        if not callable(self.labels):
            vals, paths, _ = T.flatten(self.labels)
            if not vals:
                raise ValueError("labels tree has no leaves")
            for p, v in zip(paths, vals):
                self._check_label(v, p)
            table = dict(zip(paths, vals))
        object.__setattr__(self, "_table", table)

    def _check_label(self, label: Any, path: str) -> str:
        if not isinstance(label, str):
            raise ValueError(f"Partition: the label of {path} must be a string, got {label!r}")
        if label not in self.rules:
            raise ValueError(f"Partition: no rule for label {label!r} at {path} "
                             f"(rules have labels {sorted(self.rules)})")
        return label

    def label_of(self, path: str, x: np.ndarray) -> str:
        """The label of the leaf ``x`` at ``path`` (ValueError naming the path if there is none)."""
        if self._table is None:
            return self._check_label(self.labels(path, x), path)
        if path not in self._table:
            raise ValueError(f"Partition: the labels tree has no label for params leaf {path} "
                             f"(labels tree and params differ)")
        return self._table[path]

    def check_params(self, paths: list[str]) -> None:
        """Check a labels tree against the full list of params leaf paths: ValueError naming the first
        path of the labels tree that params lacks. (The per-leaf hooks catch params leaves without a label;
        only this whole-tree check catches extra labels. It runs if the driver calls it.)"""
        if self._table is None:
            return
        have = set(paths)
        extra = [p for p in self._table if p not in have]
        if extra:
            raise ValueError(f"Partition: the labels tree has a label for {extra[0]}, which params lacks "
                             f"(labels tree and params differ)")

    def _rule(self, s: Any, path: str) -> Rule:
        if not isinstance(s, PartitionLeaf) or s.label not in self.rules:
            raise ValueError(f"Partition: the state at {path} is not a Partition state of this rule "
                             f"(got {type(s).__name__}); was it made by refopt.init with these rules?")
        return self.rules[s.label]

    # --- hooks -----------------------------------------------------------------------------------
    def init_leaf(self, x, path):
        label = self.label_of(path, x)
        return PartitionLeaf(label, self.rules[label].init_leaf(x, path))

    def init_global(self):
        return {k: r.init_global() for k, r in self.rules.items()}

    def context(self, t, glob):
        if not isinstance(glob, dict) or set(glob) != set(self.rules):
            raise ValueError("Partition: the global state does not hold one entry per label of this rule; "
                             "was the state made by refopt.init with these rules?")
        ctx, new = {}, {}
        for k, r in self.rules.items():
            ctx[k], new[k] = r.context(t, glob[k])
        return ctx, new

    def update_leaf(self, ctx, s, x, g, path):
        rule = self._rule(s, path)
        x, inner = rule.update_leaf(ctx[s.label], s.inner, x, g, path)
        return x, (s if inner is s.inner else PartitionLeaf(s.label, inner))

    def direction_leaf(self, ctx, s, x, g, path):
        rule = self._rule(s, path)
        u, inner = rule.direction_leaf(ctx[s.label], s.inner, x, g, path)
        return u, PartitionLeaf(s.label, inner)

    def eval_leaf(self, s, x, path):
        return self._rule(s, path).eval_leaf(s.inner, x, path)

    def leaf_spec(self, x, path):
        label = self.label_of(path, x)
        return PartitionLeaf(label, self.rules[label].leaf_spec(x, path))

    def squares_grads(self, s):
        return self._rule(s, "").squares_grads(s.inner)

    def lr_info(self, ctx):
        """``{label: lr_t}`` (``{"label.group": lr_t}`` for a sub-rule reporting several groups)."""
        out = {}
        for k, r in self.rules.items():
            for g, v in r.lr_info(ctx[k]).items():
                out[k if g == "all" else f"{k}.{g}"] = v
        return out

    def _groups(self, ss):
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(ss):
            groups.setdefault(s.label, []).append(i)
        return groups

    def prepare(self, ctx, ss, xs, gs, paths):
        """Each sub-rule's pre-pass over the leaves it owns (e.g. a ClipByGlobalNorm per group)."""
        gs = list(gs)
        for label, idx in self._groups(ss).items():
            sub = self.rules[label].prepare(ctx[label], [ss[i].inner for i in idx], [xs[i] for i in idx],
                                            [gs[i] for i in idx], [paths[i] for i in idx])
            for i, g in zip(idx, sub):
                gs[i] = g
        return gs

    def reduce_tree(self, ctx, glob, ss, xs, gs, paths):
        """Each sub-rule's whole-tree reductions over the leaves it owns (a DoG per group, as optax's
        multi_transform gives)."""
        new_ctx, new_glob = dict(ctx), dict(glob)
        for label, idx in self._groups(ss).items():
            new_ctx[label], new_glob[label] = self.rules[label].reduce_tree(
                ctx[label], glob[label], [ss[i].inner for i in idx], [xs[i] for i in idx], [gs[i] for i in idx],
                [paths[i] for i in idx])
        changed = any(new_ctx[k] is not ctx[k] for k in ctx)
        return (new_ctx if changed else ctx), new_glob

    @property
    def inputs(self):
        """The inputs beyond the gradients that any of its rules needs (each rule gets those it declares)."""
        return tuple(dict.fromkeys(k for r in self.rules.values() for k in r.inputs))

    def reduce_inputs(self, ctx, glob, inputs, ss, xs, gs, paths):
        """Each sub-rule that takes inputs (:meth:`refopt.core.Rule.reduce_inputs`) over the leaves it owns."""
        new_ctx, new_glob = dict(ctx), dict(glob)
        for label, idx in self._groups(ss).items():
            r = self.rules[label]
            if r.inputs:
                new_ctx[label], new_glob[label] = r.reduce_inputs(
                    ctx[label], glob[label], {k: inputs[k] for k in r.inputs}, [ss[i].inner for i in idx],
                    [xs[i] for i in idx], [gs[i] for i in idx], [paths[i] for i in idx])
        changed = any(new_ctx[k] is not ctx[k] for k in ctx)
        return (new_ctx if changed else ctx), new_glob

    def after_init(self, leaves, paths):
        """Warn (:class:`refopt.RefoptWarning`) for each rule that got no parameter: it would silently never
        run (e.g. Muon under labels that put every array in 'other'). Then each sub-rule's own look."""
        groups = self._groups(leaves)
        for label in self.rules:
            if label not in groups:
                warnings.warn(f"Partition: no parameter has the label {label!r}, so its rule "
                              f"{type(self.rules[label]).__name__} never runs (labels: "
                              f"{ {k: len(v) for k, v in groups.items()} } arrays)", RefoptWarning, stacklevel=3)
        for label, idx in groups.items():
            self.rules[label].after_init([leaves[i].inner for i in idx], [paths[i] for i in idx])


def matrix_labels(path: str, x: np.ndarray) -> str:
    """``'hidden'`` for every 2-D array, ``'other'`` for the rest: the default split of
    ``optax.contrib.muon`` (CONVENTIONS.md 2.4). Note that it also sends 2-D embeddings and heads to the
    'hidden' rule, which practitioners avoid (use the models' own labellings, :func:`refopt.gpt_labels` /
    :func:`refopt.mlp_labels`, for that)."""
    return HIDDEN if x.ndim == 2 else OTHER


def at_least_2d_labels(path: str, x: np.ndarray) -> str:
    """``'hidden'`` for every array with two or more dimensions, ``'other'`` for vectors and scalars: the
    split of pytorch_optimizer's MARS (``optimize_1d=False``), whose ``p.ndim >= 2`` also takes conv filters."""
    return HIDDEN if x.ndim >= 2 else OTHER
