r"""Learning-rate schedules: pure functions t -> gamma_t, the multiplier of a rule's peak ``lr``.

Every schedule is a small frozen dataclass; calling it with the 1-indexed step t (t = 1 during the first
update, the ``t`` of :class:`refopt.OptState`) returns a Python float gamma_t >= 0. Because a schedule is
a plain record of numbers it prints in ``config.json`` and checkpoints as ``{"name": ..., fields}``
(:func:`to_config` / :func:`from_config`), and two equal records are the same schedule.

Conventions (PITFALLS B17; one documented convention, the numbers are tested):

* **No step with lr = 0 at the start.** Linear warmup over W steps gives gamma_t = t/W for t <= W:
  gamma_1 = 1/W > 0 and the peak gamma_W = 1 is reached *exactly* at the last warmup step (not 0-based
  ``(t-1)/W``, which starts at 0 and peaks one step late; torchtitan PR #1261, torchtune #2010).
* **The end value is reached exactly at the last step.** A decay over D steps that starts after step s0
  uses the progress p = (t - s0)/D, so p = 1 (the floor, or 0) at t = s0 + D = T. The last real step
  therefore has gamma_T = floor (0 for a decay to zero), like optax and unlike torchtitan PR #1284, which
  appends a virtual step T+1 so that the last real step is non-zero.
* **Cosine floors** are part of the curve: gamma = floor + (1 - floor) * (1 + cos(pi p))/2, never a clamp
  ``max(gamma, floor)`` (gpt-neox PR #1008).
* **Zero-length phases are allowed and take no steps**: W = 0 gives gamma_1 = 1 (the next phase's first
  value; for WSD the peak); a decay of length 0 leaves the schedule constant after warmup; W = T is a pure
  warmup ending at the peak at step T (no division by zero; no step reaches the floor then).
* **After the horizon** (t > T) the schedule holds its value at T (clamp), so training a few steps past
  T never extrapolates (a linear decay never goes negative).
* **t < 1, or a non-integer t, raises ValueError** (steps are counted from 1).

Worked examples (B17): ``warmup_cosine(4, 10, floor=0.1)`` gives
[0.25, 0.5, 0.75, 1.0, 0.939711431703, 0.775, 0.55, 0.325, 0.160288568297, 0.1] and
``WSD(warmup_steps=2, decay_steps=8, total_steps=10)`` gives
[0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0].

Building blocks (each counts its own steps from 1): :class:`Constant`, :class:`LinearWarmup`,
:class:`LinearDecay`, :class:`CosineDecay`, :class:`ELR` (post 000), combined by :class:`Join` (phases one
after another) and :class:`Product` (pointwise product). Ready-made: :class:`WSD` and :func:`warmup_cosine`.
Constructors validate their fields and raise ``ValueError`` naming the field.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

__all__ = ["Schedule", "Constant", "LinearWarmup", "LinearDecay", "CosineDecay", "ELR", "Join", "Product",
           "WSD", "warmup_cosine", "to_config", "from_config"]


def _step(t) -> int:
    if isinstance(t, bool) or not isinstance(t, numbers.Integral):
        raise ValueError(f"a schedule takes an integer step t >= 1, got {t!r}")
    t = int(t)
    if t < 1:
        raise ValueError(f"steps are counted from 1 (t = 1 is the first update); got t = {t}")
    return t


def _steps(name: str, value, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _number(name: str, value, lo: float = -math.inf, hi: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not lo <= float(value) <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value!r}")


@dataclass(frozen=True)
class Schedule:
    """Base class: ``sched(t)`` validates t (integer >= 1) and returns the float ``sched._at(t)``."""

    def __call__(self, t) -> float:
        return float(self._at(_step(t)))

    def _at(self, t: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class Constant(Schedule):
    """gamma_t = value for every t (value >= 0; default 1: the rule's lr unchanged)."""

    value: float = 1.0

    def __post_init__(self):
        _number("value", self.value, 0.0)

    def _at(self, t):
        return float(self.value)


@dataclass(frozen=True)
class LinearWarmup(Schedule):
    """Linear warmup from ``start`` to 1 over ``steps`` steps, then 1::

        gamma_t = start + (1 - start) * min(t, W)/W         (W = steps; gamma_t = 1 for W = 0)

    With the default start = 0: gamma_1 = 1/W > 0 and gamma_W = 1 exactly (B17). ``start`` in [0, 1] is the
    value at the virtual step 0 (never taken).
    """

    steps: int
    start: float = 0.0

    def __post_init__(self):
        _steps("steps", self.steps)
        _number("start", self.start, 0.0, 1.0)

    def _at(self, t):
        if self.steps == 0 or t >= self.steps:
            return 1.0
        return self.start + (1.0 - self.start) * (t / self.steps)


@dataclass(frozen=True)
class LinearDecay(Schedule):
    """Linear decay from 1 (at the virtual step 0) to ``final`` at step D = ``steps``, then ``final``::

        gamma_t = 1 - (1 - final) * min(t, D)/D              (gamma_t = final for D = 0)

    gamma_D = final exactly. ``final`` in [0, 1]; 0 decays to zero at the last step.
    """

    steps: int
    final: float = 0.0

    def __post_init__(self):
        _steps("steps", self.steps)
        _number("final", self.final, 0.0, 1.0)

    def _at(self, t):
        if t >= self.steps:
            return float(self.final)
        return 1.0 - (1.0 - self.final) * (t / self.steps)


@dataclass(frozen=True)
class CosineDecay(Schedule):
    """Cosine decay from 1 (virtual step 0) to ``floor`` at step D = ``steps``, then ``floor``::

        gamma_t = floor + (1 - floor) * (1 + cos(pi * min(t, D)/D)) / 2      (gamma_t = floor for D = 0)

    The floor is part of the curve (never a clamp) and is reached exactly at t = D (B17). floor in [0, 1].
    """

    steps: int
    floor: float = 0.0

    def __post_init__(self):
        _steps("steps", self.steps)
        _number("floor", self.floor, 0.0, 1.0)

    def _at(self, t):
        if t >= self.steps:
            return float(self.floor)
        return self.floor + (1.0 - self.floor) * (0.5 * (1.0 + math.cos(math.pi * (t / self.steps))))


@dataclass(frozen=True)
class ELR(Schedule):
    r"""The effective-learning-rate curve of AdamW under linear lr decay (post 000, "ELR schedule")::

        gamma_t = (1 - t/T) * sqrt((1 - c0) / (1 - c0 * exp(-c1 * t)))       for 1 <= t <= T, then 0

    Post 000 derives ELR_t = eta_t ||u_t||_RMS / ||w_t||_RMS proportional to (1 - t/T)/sqrt(1 - c0 e^{-c1 t})
    for AdamW with eta_t = eta0 (1 - t/T) and decoupled decay lambda; the factor sqrt(1 - c0) normalises
    the curve to 1 at the virtual step t = 0 (the start of the linear decay), so gamma_T = 0 exactly and,
    for c0 > 0 (small init), gamma_t < 1 - t/T: a high start, a fast early drop, then nearly linear. For
    c0 < 0 (large init) the curve lies above 1 - t/T and may exceed 1 early on. Use it as the schedule of
    a rule whose ``lr`` *is* the effective learning rate (the covariant rule of post 000, eq. (elr-u), or
    Hyperball) to follow AdamW's implied ELR trajectory.

    Args:
      total_steps: T >= 1.
      c0: < 1 (so the square root is real for every t >= 0). From post 000's weight-norm model
        ||w_t||^2 = e^{-lambda eta0 t} ||w0||^2 + (1 - e^{-lambda eta0 t}) eta0/(3 lambda):
        c0 = 1 - 3 lambda ||w0||_RMS^2 / eta0 (> 0 for a small init); see :meth:`from_adamw`.
      c1: >= 0, the rate c1 = lambda * eta0 (per step). c0 = 0 or c1 = 0 gives the plain linear decay.
    Raises: ValueError for T < 1, c0 >= 1, c1 < 0 or non-finite values.
    """

    total_steps: int
    c0: float = 0.0
    c1: float = 0.0

    def __post_init__(self):
        _steps("total_steps", self.total_steps, 1)
        _number("c0", self.c0)
        if self.c0 >= 1:
            raise ValueError(f"c0 must be < 1 (1 - c0 exp(-c1 t) > 0 for all t >= 0), got {self.c0!r}")
        _number("c1", self.c1, 0.0)

    @classmethod
    def from_adamw(cls, total_steps: int, lr: float, weight_decay: float, init_rms: float) -> "ELR":
        """c0 = 1 - 3 lambda rms0^2 / eta0 and c1 = lambda eta0 from AdamW's peak lr eta0 > 0, decoupled
        decay lambda > 0 and the initial weight RMS rms0 >= 0 (post 000's weight-norm model)."""
        _number("lr", lr, 0.0)
        _number("weight_decay", weight_decay, 0.0)
        _number("init_rms", init_rms, 0.0)
        if lr <= 0 or weight_decay <= 0:
            raise ValueError("from_adamw needs lr > 0 and weight_decay > 0")
        return cls(total_steps, 1.0 - 3.0 * weight_decay * init_rms ** 2 / lr, weight_decay * lr)

    def _at(self, t):
        if t >= self.total_steps:
            return 0.0
        return (1.0 - t / self.total_steps) * math.sqrt((1.0 - self.c0) / (1.0 - self.c0 * math.exp(-self.c1 * t)))


@dataclass(frozen=True)
class Join(Schedule):
    """Phases one after another: ``phases = ((n1, s1), (n2, s2), ...)`` runs s1 for n1 steps (its own
    t = 1..n1), then s2 for n2 steps, ...; phases with n = 0 take no steps. Past the end (t > sum n) the
    last phase with n > 0 is held at its final value s_last(n_last) (the clamp convention)."""

    phases: tuple

    def __post_init__(self):
        phases = tuple((n, s) for n, s in self.phases) if isinstance(self.phases, (list, tuple)) else None
        if not phases:
            raise ValueError("phases must be a non-empty sequence of (steps, schedule) pairs")
        for i, (n, s) in enumerate(phases):
            _steps(f"phases[{i}] steps", n)
            if not isinstance(s, Schedule):
                raise ValueError(f"phases[{i}] schedule must be a refopt.schedules.Schedule, got {s!r}")
        if all(n == 0 for n, _ in phases):
            raise ValueError("at least one phase must have steps > 0")
        object.__setattr__(self, "phases", phases)

    @property
    def total_steps(self) -> int:
        return sum(n for n, _ in self.phases)

    def _at(self, t):
        start = 0
        for n, s in self.phases:
            if t <= start + n:
                return s._at(t - start)
            start += n
        n, s = [p for p in self.phases if p[0] > 0][-1]
        return s._at(n)


@dataclass(frozen=True)
class Product(Schedule):
    """Pointwise product of schedules: gamma_t = prod_i s_i(t) (e.g. a warmup times an ELR curve)."""

    factors: tuple

    def __post_init__(self):
        factors = tuple(self.factors) if isinstance(self.factors, (list, tuple)) else ()
        if not factors or not all(isinstance(f, Schedule) for f in factors):
            raise ValueError("factors must be a non-empty sequence of refopt.schedules.Schedule")
        object.__setattr__(self, "factors", factors)

    def _at(self, t):
        out = 1.0
        for f in self.factors:
            out *= f._at(t)
        return out


@dataclass(frozen=True)
class WSD(Schedule):
    """Warmup-stable-decay over T = ``total_steps``: linear warmup for W steps, 1 until step T - D, then a
    decay over the last D steps to ``final`` at step T exactly, held after T::

        gamma_t = t/W                                  for t <= W
                = 1                                    for W < t <= T - D
                = 1 - (1 - final) (t - (T-D))/D        for T - D < t <= T        ('linear')
                = final + (1 - final)(1 + cos(pi (t - (T-D))/D))/2                ('cosine')

    W = 0 (gamma_1 = 1), D = 0 (constant after warmup) and W + D = T (no stable phase) are allowed.
    B17: WSD(2, 8, 10) = [0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0].
    Raises: ValueError unless 0 <= W, 0 <= D, W + D <= T, T >= 1, final in [0, 1], decay known.
    """

    warmup_steps: int
    decay_steps: int
    total_steps: int
    final: float = 0.0
    decay: str = "linear"

    def __post_init__(self):
        _steps("warmup_steps", self.warmup_steps)
        _steps("decay_steps", self.decay_steps)
        _steps("total_steps", self.total_steps, 1)
        if self.warmup_steps + self.decay_steps > self.total_steps:
            raise ValueError(f"warmup_steps + decay_steps = {self.warmup_steps + self.decay_steps} "
                             f"exceeds total_steps = {self.total_steps}")
        _number("final", self.final, 0.0, 1.0)
        if self.decay not in ("linear", "cosine"):
            raise ValueError(f"decay must be 'linear' or 'cosine', got {self.decay!r}")
        object.__setattr__(self, "_joined", self._join())  # built once, not on every call

    def _join(self) -> Join:
        w, d, tot = self.warmup_steps, self.decay_steps, self.total_steps
        dec = LinearDecay(d, self.final) if self.decay == "linear" else CosineDecay(d, self.final)
        return Join(((w, LinearWarmup(w)), (tot - w - d, Constant()), (d, dec)))

    def _at(self, t):
        return self._joined._at(t)


def warmup_cosine(warmup_steps: int, total_steps: int, floor: float = 0.0) -> Join:
    """Linear warmup for W steps to 1, then cosine decay to ``floor`` at step T exactly (held after T).

    B17: warmup_cosine(4, 10, 0.1) = [0.25, 0.5, 0.75, 1.0, 0.939711431703, 0.775, 0.55, 0.325,
    0.160288568297, 0.1]. W = 0 starts the cosine at t = 1 (gamma_1 = floor + (1-floor)(1+cos(pi/T))/2);
    W = T is a pure warmup. Raises ValueError unless 0 <= W <= T, T >= 1, floor in [0, 1].
    """
    _steps("warmup_steps", warmup_steps)
    _steps("total_steps", total_steps, 1)
    if warmup_steps > total_steps:
        raise ValueError(f"warmup_steps = {warmup_steps} exceeds total_steps = {total_steps}")
    return Join(((warmup_steps, LinearWarmup(warmup_steps)),
                 (total_steps - warmup_steps, CosineDecay(total_steps - warmup_steps, floor))))


_KINDS = {c.__name__: c for c in (Constant, LinearWarmup, LinearDecay, CosineDecay, ELR, Join, Product, WSD)}


def to_config(s: Schedule) -> dict:
    """A JSON-ready dict ``{"name": class name, field: value, ...}`` (nested schedules as dicts;
    :func:`refopt.serialize.describe`)."""
    if not isinstance(s, Schedule) or type(s).__name__ not in _KINDS:
        raise ValueError(f"not a refopt schedule: {s!r}")
    from refopt.serialize import describe
    return describe(s)


def from_config(d: dict) -> Schedule:
    """Inverse of :func:`to_config`. Raises ValueError for an unknown name or bad fields."""
    from refopt.serialize import from_description
    if not isinstance(d, dict) or d.get("name") not in _KINDS:
        raise ValueError(f"not a schedule config: {d!r}")
    return from_description(d, _KINDS)
