"""The vocabulary of the divergence atlas's entries (:mod:`refopt.crosscheck.divergences` runs them).

A conventions file (:mod:`refopt.conventions`, ``atlas=``) builds its entries from these: an
:class:`Entry` is one known disagreement; its sides (:class:`Side`, built by :func:`peer_side` and
:func:`restated_side`) are the implementations, its pairs (:class:`Pair`) the differences measured
between two sides, each reported as a :class:`Figure`; :func:`_p` and :func:`_preset` are the atlas's own
peer calls, and the ``_torch_*`` adapters step what a preset's call does not (a scheduler, clipping, an
averaged model). The module imports neither the conventions files nor the atlas's runner, so that both
can import it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from refopt.crosscheck import peers
from refopt.crosscheck.presets import EXACT, PRESETS, Preset

#: every entry runs STEPS steps of its problem, seeded with SEED
STEPS = 50
SEED = 0


# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Side:
    """One implementation in an entry.

    label: short name used in the figures; impl: what runs (the peer call, or the code restated);
    peer: the library ('torch' | 'optax' | 'schedulefree'), None when refopt's restatement stands in;
    refopt: the refopt configuration (an expression) and ``make_refopt`` () -> a refopt rule or an
    :class:`~refopt.testing.adapters.Adapter`; preset: the peer call (a :class:`Preset`, run by its adapter,
    :func:`refopt.crosscheck.peers.preset_adapter`) unless ``make_peer`` () -> an Adapter is given;
    observe: 'params' or the refopt state field (e.g. 'mu', EMA's average) whose trajectory is compared (the
    peer's entry named by ``preset.state``, else of the same name);
    tol / tol_name: the reproduction tolerance (:class:`~refopt.crosscheck.presets.Tol` figures);
    oracle: for a restated side, () -> an Adapter written independently from the restated code's
    equations, compared with ``make_refopt`` at ``tol``; source: whose code or paper this side follows.
    """

    label: str
    impl: str
    refopt: str
    make_refopt: Callable[[], Any]
    peer: str | None = None
    preset: Preset | None = None
    make_peer: Callable | None = None
    observe: str = "params"
    tol: dict = field(default_factory=lambda: dict(EXACT.float64))
    tol_name: str = "EXACT"
    oracle: Callable[[], Any] | None = None
    source: str = ""

    @property
    def restated(self) -> bool:
        return self.peer is None


@dataclass(frozen=True)
class Pair:
    """A measured difference between two sides: ``figure`` in ('final', 'params', 'update', 'abs',
    'state'); kind 'min' (the divergence: value >= bound) or 'max' (agreement: value <= bound)."""

    a: str
    b: str
    figure: str
    bound: float
    kind: str = "min"
    what: str = ""


@dataclass
class Figure:
    between: str
    figure: str
    value: float
    bound: float
    kind: str
    ok: bool
    what: str = ""


@dataclass(frozen=True)
class Entry:
    """One divergence: name (the CLI's id), title, sides, pairs (the figures), ``follows`` (one line:
    which side follows the paper or the original author's code), reference, problem options, and
    ``extra`` (ctx -> list of Figure) for measurements that are not trajectories (e.g. a schedule's
    values); ``named``: the sides pick their rule by parameter name, so every side runs on the problem's named
    tree."""

    name: str
    title: str
    sides: tuple
    pairs: tuple
    follows: str
    reference: str
    problem: str = "stream"
    matrix_only: bool = False
    leaves: Callable | None = None            # () -> (paths, leaves0, grads) replacing the problem
    extra: Callable | None = None             # () -> list[Figure]
    extra_peers: tuple = ()
    named: bool = False

    @property
    def peers(self) -> tuple:
        return tuple(sorted({s.peer for s in self.sides if s.peer} | set(self.extra_peers)))


# ---------------------------------------------------------------------------------------------------
# helpers building sides
def _preset(name: str) -> Preset:
    for p in PRESETS:
        if p.name == name:
            return p
    raise KeyError(name)


def _expr(rule) -> str:
    from refopt.crosscheck.expr import ExprError, to_expr
    try:
        return to_expr(rule)
    except ExprError:
        return repr(rule)


def peer_side(label: str, preset: Preset, observe="params", tol=EXACT, tol_name="EXACT", source="",
              refopt: str | None = None, make_refopt=None, impl: str | None = None, make_peer=None) -> Side:
    """A side run by a peer (the preset's call) and reproduced by the preset's refopt rule."""
    make = make_refopt or preset.make_rule
    return Side(label, impl or preset.describe_peer(), refopt or _expr(make()), make, peer=preset.peer,
                preset=preset, make_peer=make_peer, observe=observe, tol=dict(tol.float64), tol_name=tol_name,
                source=source)


def restated_side(label: str, impl: str, make_refopt, refopt: str | None = None, observe="params", oracle=None,
                  source="") -> Side:
    """A side whose code is not an installable peer: refopt's configuration stands in for it."""
    return Side(label, impl + " [restated by refopt]", refopt or _expr(make_refopt()), make_refopt, peer=None,
                observe=observe, oracle=oracle, source=source)


def _p(name, peer, ctor, kw, make_rule, **extra) -> Preset:
    return Preset(name, peer, "atlas", (ctor, kw), make_rule, "divergence atlas", **extra)


# ---------------------------------------------------------------------------------------------------
# custom peer adapters (the parts a preset's call does not step: a scheduler, clipping, an averaged model): the
# preset's torch optimizer replaced by a subclass, run by the same TorchAdapter
def _torch_subclass(preset: Preset, subclass):
    """() -> the preset's adapter with torch.optim.<ctor> replaced by ``subclass(torch, base class)``."""
    def make():
        torch = peers.require("torch", "torch")
        return peers.preset_adapter(preset, factory=subclass(torch, getattr(torch.optim, preset.peer_call[0])))
    return make


def _torch_lambda_lr(preset: Preset, lam):
    """torch.optim.<ctor> stepped with ``LambdaLR(opt, lam)`` (scheduler.step() after every opt.step())."""
    def subclass(torch, base):
        class WithLambdaLR(base):
            def __init__(self, params, **kwargs):
                super().__init__(params, **kwargs)
                self.scheduler = torch.optim.lr_scheduler.LambdaLR(self, lam)

            def step(self, closure=None):
                loss = super().step(closure)
                self.scheduler.step()
                return loss
        return WithLambdaLR
    return _torch_subclass(preset, subclass)


def _torch_clipped(preset: Preset, max_norm: float):
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)`` before every step of the preset's optimizer."""
    def subclass(torch, base):
        class Clipped(base):
            def step(self, closure=None):
                torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], max_norm)
                return super().step(closure)
        return Clipped
    return _torch_subclass(preset, subclass)


def _torch_averaged(preset: Preset, decay: float):
    """torch.optim.swa_utils.AveragedModel(multi_avg_fn=get_ema_multi_avg_fn(decay)) of the params, updated
    after every step of the preset's optimizer; the averaged weights are the state entry 'mu'."""
    def subclass(torch, base):
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        class Averaged(base):
            def __init__(self, params, **kwargs):
                super().__init__(params, **kwargs)
                self.model = torch.nn.ParameterList([p for g in self.param_groups for p in g["params"]])
                self.averaged = AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(decay))

            def step(self, closure=None):
                loss = super().step(closure)
                self.averaged.update_parameters(self.model)
                for p, mu in zip(self.model, self.averaged.module):
                    self.state[p]["mu"] = mu.detach().clone()
                return loss
        return Averaged
    return _torch_subclass(preset, subclass)


def _rules():
    import refopt
    return refopt
