"""The cautious mask (Liang, Chen, Liu & Liu 2024, "Cautious Optimizers: Improving Training with One Line of
Code"): a base rule's direction u kept only where it agrees in sign with the gradient, rescaled to keep its
mean size, as a wrapper of any rule with a direction (pytorch_optimizer's ``cautious``, heavyball's ``caution``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from refopt.rules import _checks
from refopt.rules.base import DirectionWrapper, rewrap

#: how the mask is formed and rescaled (:class:`Cautious`'s ``mask``)
MASKS = ("product", "signbit")


class CautiousState(NamedTuple):
    """Per-array state: the base rule's own per-array state (the mask keeps none)."""

    base: Any


def cautious_mask(u: np.ndarray, g: np.ndarray, form: str) -> np.ndarray:
    """u times the mask of one array, in u's dtype: 'product' keeps u where u g > 0 and multiplies by
    n / (k + 1) (k the entries kept, n the array's size); 'signbit' keeps u where u and g have the same sign
    bit (so a zero of either sign counts with its sign) and multiplies by n / max(k, 1)."""
    n = u.size
    if form == "product":
        keep = (u * g) > 0
        k = int(np.count_nonzero(keep))
        return u * (keep * u.dtype.type(n / (k + 1)))
    keep = np.signbit(u) == np.signbit(g)
    k = int(np.count_nonzero(keep))
    return np.where(keep, u, u.dtype.type(0)) * u.dtype.type(n / max(k, 1))


@dataclass(frozen=True)
class Cautious(DirectionWrapper):
    r"""The cautious mask around a base rule's direction (Liang et al. 2024, Algorithm 1). At step t
    (t = 1 first), lr_t = lr gamma_t, per array with u_t the base rule's direction and g_t the gradient:

    .. math::

        \phi_t &= \mathbb{1}[u_t \circ g_t > 0], \qquad
        \bar u_t = u_t \circ \phi_t\, \frac{n}{\|\phi_t\|_0 + 1} \\
        x_t &= (1 - \mathrm{lr}_t \lambda)\, x_{t-1} - \mathrm{lr}_t\, \bar u_t

    with n the array's size (``mask='product'``, the paper's code and pytorch_optimizer 4.1.0's
    ``apply_cautious``). ``mask='signbit'`` is heavyball 3.2.1's ``caution``: phi keeps the entries where u
    and g have the same sign bit (an exact zero counts by its sign, so u = g = +0 is kept) and the scale is
    n / max(||phi||_0, 1) (``like('heavyball.AdEMAMix', caution=True, ...)``). heavyball forms this factor
    and its step's scalars in torch's default dtype: refopt's cross-check sets it to the params' dtype; under
    torch's float32 default a float64 heavyball run carries float32 scalars (2e-8 relative after 8 steps,
    measured). The decay acts on the weights, as the packages' decoupled ``weight_decay`` (applied before the
    masked step, on x_{t-1}).

    The base contributes only its direction (its lr is ignored; a base ``schedule`` or decoupled decay is
    rejected: give them to Cautious). ``Cautious(Lion(...), lr, weight_decay)`` is pytorch_optimizer's
    ``Lion(cautious=True)``.

    Args:
      base: a refopt rule with a direction (Lion, Adam, SGD, ...).
      lr: >= 0 (1e-4), the step along the masked direction.
      weight_decay: lambda >= 0 (0), decoupled: x (1 - lr_t lambda).
      mask: 'product' (the paper's) or 'signbit' (heavyball's).
      schedule: t -> gamma_t.

    State: :class:`CautiousState` (the base's). Shapes/dtypes: any float32 / float64 array the base takes,
    computed in its dtype.

    Raises:
      ValueError: for a bad base (:meth:`~refopt.rules.base.DirectionWrapper.check_base`), lr < 0,
        weight_decay < 0, an unknown mask or a non-callable schedule.
    """

    lr: float = 1e-4
    weight_decay: float = 0.0
    mask: str = "product"
    schedule: Callable[[int], float] | None = None

    decay_advice = "pass weight_decay= to {owner}, which decays the weights"

    def __post_init__(self):
        self.check_base()
        _checks.nonnegative("lr", self.lr)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.one_of("mask", self.mask, MASKS)
        _checks.schedule(self.schedule)

    def decoupled_decay(self):
        return self.weight_decay > 0

    def init_leaf(self, x, path):
        return CautiousState(self.base.init_leaf(x, path))

    def leaf_spec(self, x, path):
        return CautiousState(self.base.leaf_spec(x, path))

    def update_leaf(self, ctx, s, x, g, path):
        u, sb = self.base_direction(ctx, s, x, g, path)
        d = x.dtype.type
        lr_t = float(ctx.lr_t)
        step = cautious_mask(u, g, self.mask)
        if self.weight_decay:
            x *= d(1.0 - lr_t * float(self.weight_decay))
        x -= d(lr_t) * step
        return x, rewrap(s, sb)

    def direction_leaf(self, ctx, s, x, g, path):
        """The masked direction (without the decay, which acts on the weights)."""
        u, sb = self.base_direction(ctx, s, x, g, path)
        return cautious_mask(u, g, self.mask), rewrap(s, sb)
