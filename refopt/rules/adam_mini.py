"""Adam-mini (Zhang, Chen, Li, Ding, Chen, Kingma, Luo, Sun & Luo 2024, "Adam-mini: Use Fewer Learning Rates To
Gain More", arXiv:2406.16793): AdamW whose second moment is one number per block of the array, the mean of the
squared gradient over the block, so that every entry of a block steps with the same learning rate."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.rules import _checks
from refopt.rules.base import lr_at

#: the partitions of one array into blocks (see :class:`AdamMini`)
BLOCKS = ("element", "tensor", "fan_out", "row", "heads")


class AdamMiniState(NamedTuple):
    """Per-array state: the first moment ``m`` (like x), the block second moment ``v`` (one entry per block:
    like x for ``'element'``, shape () for ``'tensor'``, (fan_out,), (n_0,) or (fan_out // head_dim,)), and the
    array's ``block`` and whether it is ``decayed``, both fixed at init."""

    m: np.ndarray
    v: np.ndarray
    block: str
    decayed: bool


class AdamMiniContext(NamedTuple):
    lr_t: float
    decay: float      # 1 - lr_t * weight_decay (x is decayed before the step, where the mask says so)
    beta1: float
    omb1: float
    beta2: float
    omb2: float
    bc1: float        # 1 - beta1**t
    sqrt_bc2: float   # sqrt(1 - beta2**t)
    eps: float


def block_shape(block: str, shape: tuple, head_dim: int | None, path: str = "x") -> tuple:
    """The shape of the block second moment of an array of ``shape``; ValueError naming ``path`` for a
    partition the array does not have (a vector's fan_out, heads that do not divide fan_out)."""
    if block == "element":
        return tuple(shape)
    if block == "tensor":
        return ()
    if len(shape) < 2:
        raise ValueError(f"AdamMini(block={block!r}) needs an array of two or more axes; {path} has shape "
                         f"{tuple(shape)} (give vectors block='tensor' or 'element')")
    if block == "fan_out":
        return (shape[-1],)
    if block == "row":
        return (shape[0],)
    if len(shape) != 2 or shape[1] % head_dim:
        raise ValueError(f"AdamMini(block='heads', head_dim={head_dim}) needs a (fan_in, fan_out) matrix whose "
                         f"fan_out is a multiple of head_dim; {path} has shape {tuple(shape)}")
    return (shape[1] // head_dim,)


def block_mean(block: str, a: np.ndarray, head_dim: int | None) -> np.ndarray:
    """The mean of ``a`` over each block (shape :func:`block_shape`)."""
    if block == "element":
        return a
    if block == "tensor":
        return np.asarray(a.mean())
    if block == "fan_out":
        return a.mean(axis=tuple(range(a.ndim - 1)))
    if block == "row":
        return a.mean(axis=tuple(range(1, a.ndim)))
    return a.reshape(a.shape[0], -1, head_dim).mean(axis=(0, 2))


def expand(block: str, b: np.ndarray, shape: tuple, head_dim: int | None) -> np.ndarray:
    """A per-block array ``b`` broadcast to the array's ``shape`` (every entry gets its block's value)."""
    if block == "row":
        return b.reshape((shape[0],) + (1,) * (len(shape) - 1))
    if block == "heads":
        return np.repeat(b, head_dim)
    return b


@dataclass(frozen=True)
class AdamMini(Rule):
    r"""Adam-mini (Zhang et al. 2024, arXiv:2406.16793, Algorithm 1) on one partition of every array. At step t
    (t = 1 first), lr_t = lr gamma_t, with B(i) the block of entry i and |B| its size:

    .. math::

        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
        v_{t,B} &= \beta_2 v_{t-1,B} + (1 - \beta_2)\, \frac{1}{|B|} \sum_{i \in B} g_{t,i}^2 \\
        x_{t,i} &= (1 - \mathrm{lr}_t \lambda)\, x_{t-1,i} - \mathrm{lr}_t\, \frac{m_{t,i}}{(1 - \beta_1^t)\,
        \big(\sqrt{v_{t,B(i)}} / \sqrt{1 - \beta_2^t} + \epsilon\big)}

    One block per entry is AdamW (torch.optim.AdamW's form: decoupled decay, eps outside the root). The paper
    cuts a Transformer by the blocks of its Hessian; on refopt's (fan_in, fan_out) layout:

    * ``'heads'``: the query and key matrices, one block per head (``head_dim`` consecutive output neurons:
      columns);
    * ``'fan_out'``: value, attention output and MLP matrices, one block per output neuron (the last axis);
    * ``'row'``: embedding and output tables, one block per token (the first axis);
    * ``'tensor'``: one block for the whole array (pytorch_optimizer's choice for everything but the embedding
      and the query and key); ``'element'``: Adam (the authors' code for biases).

    Over a whole network ``block`` is a function of the parameter's path and array, as
    ``refopt.like("pytorch_optimizer.AdamMini", ...)`` builds it from the package's name rules, and
    ``decay_mask`` says which arrays decay.

    Args:
      lr: >= 0 (1e-3); beta1, beta2: in [0, 1) (0.9, 0.999); eps: > 0 (1e-8); weight_decay: >= 0, decoupled
        (0).
      block: one of ``'element'``, ``'tensor'``, ``'fan_out'``, ``'row'``, ``'heads'`` (``'tensor'``), or a
        function ``(path, x) -> one of them`` called once per array at :func:`refopt.init`.
      head_dim: positive int, the output neurons per head; required where a block is ``'heads'``.
      decay_mask: None (every array decays) or a function ``(path, x) -> bool`` (True: x decays), called at init.
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array (``'fan_out'`` and ``'row'``: two or more axes; ``'heads'``: a
    matrix whose fan_out is a multiple of head_dim); ``m`` like x, ``v`` one entry per block in x's dtype.

    Raises:
      ValueError: at construction, for a hyperparameter out of its range, an unknown block, head_dim missing
        with ``'heads'`` or given with another fixed block, a non-callable decay_mask; at :func:`refopt.init`,
        naming the leaf, for a block function's unknown answer, ``'heads'`` without head_dim, or an array the
        block does not fit.
    """

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    block: str | Callable[[str, np.ndarray], str] = "tensor"
    head_dim: int | None = None
    decay_mask: Callable[[str, np.ndarray], bool] | None = None
    schedule: Callable[[int], float] | None = None

    State = AdamMiniState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        if not callable(self.block):
            _checks.one_of("block", self.block, BLOCKS)
            if self.block != "heads" and self.head_dim is not None:
                raise ValueError(f"AdamMini: head_dim={self.head_dim!r} only applies to block='heads' "
                                 f"(block={self.block!r})")
        if self.head_dim is not None:
            _checks.positive_int("head_dim", self.head_dim)
        elif self.block == "heads":
            raise ValueError("AdamMini(block='heads') needs head_dim, the output neurons per head")
        if self.decay_mask is not None and not callable(self.decay_mask):
            raise ValueError(f"AdamMini: decay_mask must be None or a function (path, x) -> bool, got "
                             f"{self.decay_mask!r}")
        _checks.schedule(self.schedule)

    def _leaf(self, x, path):
        """(block, decayed, v's shape) of one array."""
        block = self.block(path, x) if callable(self.block) else self.block
        if block not in BLOCKS:
            raise ValueError(f"AdamMini: the block function gave {block!r} for {path}; it must give one of "
                             f"{list(BLOCKS)}")
        if block == "heads" and self.head_dim is None:
            raise ValueError(f"AdamMini: {path} has block 'heads' but the rule has no head_dim")
        decayed = True if self.decay_mask is None else self.decay_mask(path, x)
        if not isinstance(decayed, (bool, np.bool_)):
            raise ValueError(f"AdamMini: decay_mask gave {decayed!r} for {path}; it must give True or False")
        return block, bool(decayed), block_shape(block, x.shape, self.head_dim, path)

    def init_leaf(self, x, path):
        block, decayed, shape = self._leaf(x, path)
        return AdamMiniState(np.zeros_like(x), np.zeros(shape, x.dtype), block, decayed)

    def leaf_spec(self, x, path):
        block, decayed, shape = self._leaf(x, path)
        return AdamMiniState(ArraySpec.like(x), ArraySpec(shape, x.dtype), block, decayed)

    def squares_grads(self, s):
        return True

    def decoupled_decay(self):
        return self.weight_decay > 0

    def context(self, t, glob):
        lr_t, b1, b2 = lr_at(self, t), float(self.beta1), float(self.beta2)
        return AdamMiniContext(lr_t, 1.0 - lr_t * float(self.weight_decay), b1, 1.0 - b1, b2, 1.0 - b2,
                               1.0 - b1 ** t, math.sqrt(1.0 - b2 ** t), float(self.eps)), glob

    def _direction(self, c, s, g):
        """m_t and v_t written into s; returns m_t / ((1 - beta1^t)(sqrt(v_t) / sqrt(1 - beta2^t) + eps))."""
        s.m[...] = c.beta1 * s.m + c.omb1 * g
        s.v[...] = c.beta2 * s.v + c.omb2 * block_mean(s.block, g * g, self.head_dim)
        h = np.sqrt(s.v) / c.sqrt_bc2 + c.eps
        return s.m / (c.bc1 * expand(s.block, h, g.shape, self.head_dim))

    def update_leaf(self, c, s, x, g, path):
        u = self._direction(c, s, g)
        if s.decayed and c.decay != 1:
            x *= c.decay
        x -= c.lr_t * u
        return x, s

    def direction_leaf(self, c, s, x, g, path):
        return self._direction(c, s, g), s
