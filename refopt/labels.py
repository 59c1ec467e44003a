"""Labellings for :class:`refopt.Partition`: which rule each parameter array gets.

Practitioners send the hidden matrices of a network to Muon or Hyperball (label ``'hidden'``) and the
embeddings, the output head, norm gains and biases to AdamW (``'other'``), as Keller Jordan's Muon README
and modded-nanogpt do. :func:`matrix_labels` is optax.contrib.muon's default (every 2-D array),
:func:`at_least_2d_labels` pytorch_optimizer's split by ``ndim >= 2`` (MARS's ``optimize_1d=False``);
:func:`gpt_labels` and :func:`mlp_labels` are the splits of the reference models (:mod:`refopt.models`),
which use them; they live here so that the optimizer package never imports the models.
"""
from __future__ import annotations

import re

import numpy as np

from refopt import tree as T
from refopt.rules.partition import at_least_2d_labels, matrix_labels  # noqa: F401 (defined there: checkpoints name them so)


_HIDDEN = re.compile(r"blocks\[\d+\]\.(attn\.w_(q|k|v|o)|mlp\.w_(up|gate|down))")
_OTHER_MATRIX = re.compile(r"(wte|wpe|lm_head)")


def gpt_labels(path: str, x: np.ndarray) -> str:
    """The parameter group of one array of the reference GPT (:mod:`refopt.models.gpt`), for
    ``Partition(labels=refopt.gpt_labels)``; ``refopt.models.gpt.labels(params)`` gives the same as a tree:

    * ``'hidden'`` (Muon / Hyperball): the attention and MLP matrices of every block,
      ``blocks[i].attn.w_q``, ``w_k``, ``w_v``, ``w_o``, ``blocks[i].mlp.w_up``, ``w_gate``, ``w_down``.
    * ``'other'`` (AdamW): the token and position embeddings ``wte``, ``wpe``, the head ``lm_head``, and
      every array with ndim <= 1 (RMSNorm gains, QK-norm gains, biases if any).

    This is the split of Keller Jordan's Muon README and modded-nanogpt (embeddings, head and gains to
    AdamW). Raises ValueError naming the path for a hidden matrix that is not at least 2-D, or for an array
    with ndim >= 2 whose name is none of the above (so a renamed or new matrix is never silently sent to
    the wrong optimizer).
    """
    if _HIDDEN.fullmatch(path):
        if x.ndim < 2:
            raise ValueError(f"gpt_labels: {path} should be a matrix, got shape {x.shape}")
        return "hidden"
    if x.ndim <= 1 or _OTHER_MATRIX.fullmatch(path):
        return "other"
    raise ValueError(f"gpt_labels: unknown GPT matrix {path} (shape {x.shape}); known: blocks[i].attn.w_q/"
                     f"w_k/w_v/w_o, blocks[i].mlp.w_up/w_gate/w_down, wte, wpe, lm_head")


def mlp_labels(params, first: str = "hidden", last: str = "other"):
    """The parameter groups of the reference MLP (:mod:`refopt.models.mlp`) as data: a labels tree (shaped like
    ``params``) for ``refopt.Partition(labels=...)``.

    The weight matrices are the 2-D leaves taken in flatten order, which is layer order for this MLP
    (``{"layers": [{"w": (fan_in, fan_out), "b": (fan_out,)}, ...]}``). The last one (the classifier head) gets
    ``last`` ('other': AdamW), the first one (the input layer) ``first`` ('hidden' by default, so that the
    one-hidden-layer MLP of the README has a matrix for Muon, as ``refopt train --model mlp``; pass
    ``first='other'`` for Keller Jordan's advice of AdamW on the input layer too), the matrices in between
    'hidden'; every array with ndim != 2 (biases) 'other'. The result is a plain tree of strings, so
    checkpoints store it.

    Raises: ValueError if params has no 2-D leaf; TypeError when called as a per-array labelling function
      ``(path, array)`` (it needs the whole params: pass ``labels=refopt.mlp_labels(params)``).
    """
    if isinstance(params, str):
        raise TypeError("mlp_labels takes the whole params tree, not (path, array): use "
                        "Partition(labels=refopt.mlp_labels(params)) (the last layer cannot be told from one array)")
    xs, paths, td = T.flatten(params)
    mats = [i for i, x in enumerate(xs) if np.ndim(x) == 2]
    if not mats:
        raise ValueError("mlp_labels: params has no 2-D weight matrix")
    out = ["hidden" if i in mats else "other" for i in range(len(xs))]
    out[mats[0]] = first
    out[mats[-1]] = last if len(mats) > 1 else first
    return T.unflatten(td, out)
