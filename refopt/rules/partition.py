"""Partition: a different rule for each group of parameters, in one tree walk.

Practitioners train the hidden matrices of a network with Muon or Hyperball and everything else
(embeddings, the output head, norm gains, biases) with AdamW (Keller Jordan's Muon README;
modded-nanogpt; Moonlight). :class:`Partition` expresses this as one rule: each parameter leaf gets a
*label*, each label a rule, in the manner of optax's ``partition`` (``multi_transform``) combinator.

Default labellings (each documented below): :func:`gpt_labels` for refopt's GPT (``models/gpt.py``),
:func:`mlp_labels` for an MLP, and :func:`matrix_labels` (every 2-D array) as in
``optax.contrib.muon``'s default (CONVENTIONS.md 2.4).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import numpy as np

from refopt import tree as T
from refopt.core import Rule

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
    tree), fixed once at :func:`refopt.init`, and every step::

        x_i <- step of rules[label_i] on (x_i, g_i, state_i)

    Each sub-rule sees exactly what it would see alone: its own per-leaf state, its own global state and
    its own step context (``context`` of each sub-rule is called once per step with the shared t), and the
    leaf's real path. Hence a Partition step equals running every sub-rule on its own sub-tree, bit for
    bit. :func:`refopt.direction` and :func:`refopt.eval_params` dispatch the same way (so a Partition
    with a Schedule-Free or averaging sub-rule evaluates that group at its averaged weights).

    Args:
      rules: ``{label: rule}``, a non-empty dict with string labels and refopt rules as values. A rule
        whose label no leaf carries is allowed (it then just runs its ``context`` every step).
      labels: either a function ``(path, array) -> label`` (path as :mod:`refopt.tree` writes it, e.g.
        ``blocks[0].attn.w_q``; see :func:`gpt_labels`, :func:`matrix_labels`), or a tree of label
        strings with the same structure as params (e.g. from :func:`mlp_labels`); a labels tree is
        matched to params by leaf path.

    State: per leaf :class:`PartitionLeaf` ``(label, inner)``; global ``{label: sub-rule global}``.
    Shapes/dtypes: whatever each sub-rule accepts.
    Raises:
      ValueError at construction: empty ``rules``, a non-string label, a value that is not a rule, a
        labels tree with a non-string leaf or a label without a rule (naming the leaf path).
      ValueError at :func:`refopt.init`: a params leaf with no entry in the labels tree, or a label
        function returning a label without a rule; the message names the leaf path.
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
        return x, PartitionLeaf(s.label, inner)

    def direction_leaf(self, ctx, s, x, g, path):
        rule = self._rule(s, path)
        u, inner = rule.direction_leaf(ctx[s.label], s.inner, x, g, path)
        return u, PartitionLeaf(s.label, inner)

    def eval_leaf(self, s, x, path):
        return self._rule(s, path).eval_leaf(s.inner, x, path)


# --- default labellings ---------------------------------------------------------------------------

_GPT_HIDDEN = re.compile(r"blocks\[\d+\]\.(attn\.w_(q|k|v|o)|mlp\.w_(up|gate|down))")
_GPT_OTHER_MATRIX = re.compile(r"(wte|wpe|lm_head)")


def gpt_labels(path: str, x: np.ndarray) -> str:
    """Label of a parameter of refopt's GPT (``models/gpt.py``) for :class:`Partition`.

    * ``'hidden'`` (Muon / Hyperball): the attention and MLP matrices of every block,
      ``blocks[i].attn.w_q``, ``w_k``, ``w_v``, ``w_o``, ``blocks[i].mlp.w_up``, ``w_gate``, ``w_down``.
    * ``'other'`` (AdamW): the token and position embeddings ``wte``, ``wpe``, the head ``lm_head``, and
      every array with ndim <= 1 (RMSNorm gains ``blocks[i].attn_norm``, ``mlp_norm``, ``final_norm``,
      QK-norm gains, biases if any).

    This is the split of Keller Jordan's Muon README and modded-nanogpt (embeddings, head and gains to
    AdamW). It reads the path string only (refopt's core never imports ``models``).

    Raises: ValueError naming the path for a hidden matrix that is not at least 2-D, or for an array with
      ndim >= 2 whose name is none of the above (so a renamed or new matrix is never silently sent to
      the wrong optimizer; pass your own labels function then).
    """
    if _GPT_HIDDEN.fullmatch(path):
        if x.ndim < 2:
            raise ValueError(f"gpt_labels: {path} should be a matrix, got shape {x.shape}")
        return HIDDEN
    if x.ndim <= 1 or _GPT_OTHER_MATRIX.fullmatch(path):
        return OTHER
    raise ValueError(f"gpt_labels: unknown GPT matrix {path} (shape {x.shape}); known: blocks[i].attn.w_q/"
                     f"w_k/w_v/w_o, blocks[i].mlp.w_up/w_gate/w_down, wte, wpe, lm_head")


def matrix_labels(path: str, x: np.ndarray) -> str:
    """``'hidden'`` for every 2-D array, ``'other'`` for the rest: the default split of
    ``optax.contrib.muon`` (CONVENTIONS.md 2.4). Note that it also sends 2-D embeddings and heads to the
    'hidden' rule, which practitioners avoid (use :func:`gpt_labels` / :func:`mlp_labels` for that)."""
    return HIDDEN if x.ndim == 2 else OTHER


def mlp_labels(params: Any, first: str = OTHER, last: str = OTHER) -> Any:
    """A labels tree (shaped like ``params``) for an MLP, for ``Partition(labels=mlp_labels(params))``.

    The weight matrices are the 2-D leaves taken in flatten order, which is layer order for refopt's MLP
    (``{"layers": [{"w": (fan_in, fan_out), "b": (fan_out,)}, ...]}``). The first one (the input layer)
    gets ``first`` and the last one (the classifier head) gets ``last``, both ``'other'`` (AdamW) by
    default, as Keller Jordan's Muon README advises (Muon for hidden layers only; input layer and head
    with AdamW). The matrices in between get ``'hidden'``; every array with ndim != 2 (biases) gets
    ``'other'``. Consequently an MLP with a single hidden layer (two weight matrices) has no 'hidden'
    leaf unless you pass ``first='hidden'`` or ``last='hidden'``.

    This takes params rather than one (path, array) pair because "the last layer" cannot be read from a
    single path. The result is a plain tree of strings, so it is stored in checkpoints.
    Raises: ValueError if params has no 2-D leaf.
    """
    xs, paths, td = T.flatten(params)
    mats = [i for i, x in enumerate(xs) if np.ndim(x) == 2]
    if not mats:
        raise ValueError("mlp_labels: params has no 2-D weight matrix")
    labels = [HIDDEN if i in mats else OTHER for i in range(len(xs))]
    labels[mats[0]] = first
    labels[mats[-1]] = last if len(mats) > 1 else first
    return T.unflatten(td, labels)
