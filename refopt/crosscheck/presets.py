r"""The convention presets: for each peer optimizer, the refopt configuration that reproduces it.

One table, :data:`PRESETS` (and :data:`MISCONFIGURED`, presets that are wrong on purpose and must be
caught). Each :class:`Preset` names the peer call (library, constructor, keyword arguments), the refopt
rule that reproduces it, the array layout, which refopt state fields correspond to which peer state
entries, the tolerances, and the reason (the convention facts of CONVENTIONS.md it relies on).

Layouts: refopt's matrices are (fan_in, fan_out) (``x @ W``), as optax's; torch's ``nn.Linear`` weight is
(out, in). ``layout='transpose'`` hands the peer the transpose of every matrix (and transposes its params
and state back before comparing). For the elementwise rules the layout does not matter.

Tolerances (:class:`Tol`, see docs/crosscheck.md for the derivations):

* ``EXACT`` -- float64: the max-norm relative difference of params and state, per array and step, at most
  1e-12 (refopt follows the peers' operation order; what remains is a few ulps of reassociation, e.g.
  ``sqrt(v)/sqrt(bc2)`` vs ``sqrt(v/bc2)``, accumulated over 50 steps). float32: 2e-5, about 50 steps x a
  few float32 ulps (2^-24 = 6e-8) of per-step relative error in the step, rounding order differing.
* ``OPTAX_F32_WARMUP`` -- optax's Schedule-Free wrappers with ``warmup_steps``: optax evaluates the
  warmup schedule count/W in float32 even for float64 params (int32 count; 0.5*1/5 = 0.099999994), so
  the early z steps and averaging weights carry a relative error up to the float32 unit 6e-8 (2^-24);
  it stays in z and x (measured <= 1.1e-7 over 50 steps, the quadratic). float64 1e-6; float32 2e-5 as
  EXACT; the lag itself (warmup_lag=False) differs by >= 0.26. The same
  pairing with the warmup evaluated in float64 (adapter ``float64_warmup``) is EXACT.
* ``MUON_OPTAX`` -- float64 1e-10: Newton-Schulz in float64 on both sides, but BLAS (refopt) and XLA
  (optax) sum the matmuls in a different order and the quintic amplifies rounding (slope a = 3.4 at 0).
  float32: 2e-4.
* ``MUON_TORCH_BF16`` -- torch.optim.Muon casts the Newton-Schulz input to bfloat16 (8 significant
  bits: unit roundoff u = 2^-8 = 3.9e-3) whatever the param dtype, so its orthogonalised update carries
  ~1e-2 relative error per step. The params are therefore gated on the **per-step update**: max over steps of
  ||Delta_peer - Delta_refopt||_F / ||Delta_refopt||_F <= 0.06 on the full-rank random problems
  (stream, quadratic; measured <= 0.043), where Delta = x_t - x_{t-1}. On the real gradients of the MLP
  and the GPT the momentum is ill-conditioned and Jordan's quintic multiplies small singular values by up
  to a^5 = 3.4445^5 = 486, so bfloat16 rounding noise in weak directions is amplified: there the gate is
  0.25 (measured <= 0.145). The momentum buffer is computed in the param dtype by both, so the **state
  stays gated at EXACT**. The errors that must be caught are larger (measured, :data:`MISCONFIGURED`):
  on the stream a wrong scale or an untransposed layout (2:1 matrices: sqrt(2) - 1 = 0.41) gives
  >= 0.40, a sign error 2.1, dropping Nesterov 0.99; on the MLP / GPT the smallest is 0.37 (Nesterov).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from refopt.rules.adam import Adam, AdamW
from refopt.rules.clip import ClipByGlobalNorm
from refopt.rules.lion import Lion
from refopt.rules.sgd import SGD

PEERS = ("torch", "optax", "schedulefree")


@dataclass(frozen=True)
class Tol:
    """Pass criteria, by dtype name. ``params`` / ``state``: max-norm relative difference (None = not
    gated); ``update``: relative Frobenius difference of the per-step update Delta = x_t - x_{t-1}."""

    float64: dict
    float32: dict
    by_problem: dict = field(default_factory=dict)   # problem -> entries overriding both dtypes

    def for_dtype(self, dtype: str, problem: str | None = None) -> dict:
        return {**getattr(self, dtype), **self.by_problem.get(problem, {})}


EXACT = Tol({"params": 1e-12, "state": 1e-12}, {"params": 2e-5, "state": 2e-5})
OPTAX_F32_WARMUP = Tol({"params": 1e-6, "state": 1e-6}, {"params": 2e-5, "state": 2e-5})
MUON_OPTAX = Tol({"params": 1e-10, "state": 1e-12}, {"params": 2e-4, "state": 2e-5})
MUON_TORCH_BF16 = Tol({"update": 0.06, "state": 1e-12}, {"update": 0.06, "state": 2e-5},
                      by_problem={"mlp": {"update": 0.25}, "gpt": {"update": 0.25}})


@dataclass(frozen=True)
class Preset:
    """One row of the table.

    name: unique id ``<peer>.<what>``; peer: 'torch' | 'optax' | 'schedulefree'; family: the refopt rule
    family (the ``--rules`` filter: sgd, adam, adamw, nadam, muon, sf_sgd, sf_adamw, ema);
    peer_call: (constructor, kwargs) as the adapter builds it (torch: a ``torch.optim`` class name;
    optax: an ``optax`` attribute path such as ``'contrib.muon'``; schedulefree: a class name);
    make_rule: () -> the refopt rule (None for a known gap); layout: 'same' or 'transpose';
    matrix_only: the rule takes matrices only (problems keep their 2-D leaves);
    state: {refopt state field: peer state key} (the peer's key names, see the adapters);
    tol: the pass criteria; gap: why refopt cannot reproduce the peer (the row is reported, never
    failed); expect_fail: a deliberately wrong preset (:data:`MISCONFIGURED`) that must fail;
    negate_peer_grads: feed the peer -g (only for the sign negative control);
    problems: the problems on which the row is meaningful (None = all), and ``problems_why`` the reason
    (e.g. a wrong preset that coincides with the right one on some shapes);
    why: the convention facts the preset relies on.
    """

    name: str
    peer: str
    family: str
    peer_call: tuple[str, dict]
    make_rule: Callable[[], Any] | None
    why: str
    layout: str = "same"
    matrix_only: bool = False
    state: dict = field(default_factory=dict)
    tol: Tol = EXACT
    gap: str | None = None
    expect_fail: bool = False
    negate_peer_grads: bool = False
    problems: tuple[str, ...] | None = None
    problems_why: str = ""

    def describe_peer(self) -> str:
        ctor, kw = self.peer_call
        if self.peer == "optax" and ctor == "ema":      # the adapter's special pairing (peers/optax.py)
            kw = dict(kw)
            decay = kw.pop("decay")
            base = ", ".join(f"{k}={v!r}" for k, v in kw.items())
            return f"optax.ema(decay={decay!r}, debias=True) of the iterates of optax.sgd({base})"
        if self.peer == "optax" and kw.get("float64_warmup"):   # the adapter's float64 warmup (peers/optax.py)
            kw = dict(kw)
            del kw["float64_warmup"]
            lr, w = kw.pop("learning_rate"), kw.pop("warmup_steps")
            kw = {"learning_rate": _Raw(f"<float64 schedule {lr!r}*min(count/{w}, 1)>"), **kw}
        args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
        prefix = {"torch": "torch.optim.", "optax": "optax.", "schedulefree": "schedulefree."}[self.peer]
        return f"{prefix}{ctor}({args})"


class _Raw(str):
    """A string that ``repr`` prints bare (for :meth:`Preset.describe_peer`)."""

    def __repr__(self):
        return str(self)


def _muon():
    from refopt.rules.muon import Muon
    return Muon


def _sf():
    from refopt.rules import schedule_free
    return schedule_free


def _ema():
    from refopt.rules.averaging import EMA
    return EMA


def _cov():
    from refopt.rules.covariant import Covariant
    return Covariant


_SGD_STATE = {"b": "momentum_buffer"}
_ADAM_TORCH_STATE = {"m": "exp_avg", "v": "exp_avg_sq"}
_ADAM_OPTAX_STATE = {"m": "mu", "v": "nu"}

# ------------------------------------------------------------------------------------------------------
# torch.optim (CONVENTIONS.md 1)
_TORCH = [
    Preset("torch.SGD", "torch", "sgd", ("SGD", dict(lr=0.1)), lambda: SGD(lr=0.1),
           "plain SGD: x <- x - lr*g"),
    Preset("torch.SGD(momentum,dampening,wd)", "torch", "sgd",
           ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=1e-2)),
           lambda: SGD(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=1e-2),
           "L2 decay added to g before the buffer; b_1 = g_1 undampened, then b = mu*b + (1-tau)*g (1.1)",
           state=_SGD_STATE),
    Preset("torch.SGD(nesterov,wd)", "torch", "sgd",
           ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
           lambda: SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
           "Nesterov: u = g + mu*b with the updated buffer (1.1)", state=_SGD_STATE),
    Preset("torch.Adam", "torch", "adam", ("Adam", dict(lr=1e-2)), lambda: Adam(lr=1e-2),
           "E1 eps after sqrt of the bias-corrected v; t from 1 (1.2)", state=_ADAM_TORCH_STATE),
    Preset("torch.Adam(wd)", "torch", "adam",
           ("Adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=1e-2)),
           lambda: Adam(lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=1e-2),
           "Adam's weight_decay is L2 (added to g before the moments) (1.2)", state=_ADAM_TORCH_STATE),
    Preset("torch.AdamW", "torch", "adamw", ("AdamW", dict(lr=1e-2)), lambda: AdamW(lr=1e-2),
           "torch AdamW default weight_decay 1e-2, decoupled and lr-coupled: x <- x(1 - lr*wd) first "
           "(1.2; refopt AdamW's default is torch's)", state=_ADAM_TORCH_STATE),
    Preset("torch.AdamW(wd=0.1)", "torch", "adamw",
           ("AdamW", dict(lr=3e-2, betas=(0.9, 0.95), weight_decay=0.1)),
           lambda: AdamW(lr=3e-2, beta1=0.9, beta2=0.95, weight_decay=0.1),
           "decoupled decay uses the pre-update x (PITFALLS B05)", state=_ADAM_TORCH_STATE),
    Preset("torch.Muon", "torch", "muon", ("Muon", dict(lr=0.02)),
           lambda: _muon().like_torch(lr=0.02),
           "torch (out, in) layout -> transpose; 'original' scale sqrt(max(1, A/B)) on (out, in) = refopt "
           "'jordan' on (in, out); EMA momentum + standard Nesterov (1-mu)g + mu*m; X/max(||X||, 1e-7); "
           "decoupled wd 0.1 with the unadjusted lr; Newton-Schulz in bfloat16 (1.3)",
           layout="transpose", matrix_only=True, state={"m": "momentum_buffer"}, tol=MUON_TORCH_BF16),
    Preset("torch.Muon(match_rms_adamw)", "torch", "muon",
           ("Muon", dict(lr=0.02, weight_decay=0.05, adjust_lr_fn="match_rms_adamw")),
           lambda: _muon().like_torch(lr=0.02, weight_decay=0.05, adjust_lr_fn="match_rms_adamw"),
           "'match_rms_adamw' = 0.2*sqrt(max(A, B)) = refopt 'rms_match' (symmetric, layout-free) (1.3)",
           layout="transpose", matrix_only=True, state={"m": "momentum_buffer"}, tol=MUON_TORCH_BF16),
    Preset("torch.Muon(nesterov=False)", "torch", "muon",
           ("Muon", dict(lr=0.02, momentum=0.9, nesterov=False, weight_decay=0.0)),
           lambda: _muon().like_torch(lr=0.02, momentum=0.9, nesterov=False, weight_decay=0.0),
           "plain EMA momentum into Newton-Schulz (1.3)",
           layout="transpose", matrix_only=True, state={"m": "momentum_buffer"}, tol=MUON_TORCH_BF16),
    # the conventions added with the one-definition rules layer
    Preset("torch.Adam(amsgrad)", "torch", "amsgrad", ("Adam", dict(lr=1e-2, amsgrad=True)),
           lambda: Adam(lr=1e-2, amsgrad=True),
           "AMSGrad: max of the raw v, then its bias correction: sqrt(v_max)/sqrt(1-b2^t) + eps (1.2)",
           state={**_ADAM_TORCH_STATE, "v_max": "max_exp_avg_sq"}),
    Preset("torch.AdamW(amsgrad,wd=0.1)", "torch", "amsgrad",
           ("AdamW", dict(lr=3e-2, betas=(0.9, 0.95), weight_decay=0.1, amsgrad=True)),
           lambda: AdamW(lr=3e-2, beta1=0.9, beta2=0.95, weight_decay=0.1, amsgrad=True),
           "AMSGrad with decoupled decay", state={**_ADAM_TORCH_STATE, "v_max": "max_exp_avg_sq"}),
    Preset("torch.NAdam", "torch", "nadam", ("NAdam", dict(lr=1e-2)),
           lambda: Adam(lr=1e-2, nesterov=True, momentum_decay=4e-3),
           "Dozat's momentum schedule mu_t = b1 (1 - 0.96^(t psi)/2), psi = 4e-3, products kept; denominator "
           "sqrt(v/bc2) + eps; mu_product in torch's default dtype (float64 while the float64 run steps)",
           state=_ADAM_TORCH_STATE),
    Preset("torch.NAdam(decoupled,wd=0.1)", "torch", "nadam",
           ("NAdam", dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)),
           lambda: AdamW(lr=1e-2, weight_decay=0.1, nesterov=True, momentum_decay=4e-3),
           "decoupled_weight_decay=True: x(1 - lr wd) first, as AdamW", state=_ADAM_TORCH_STATE),
]

# ------------------------------------------------------------------------------------------------------
# optax (CONVENTIONS.md 2)
_OPTAX = [
    Preset("optax.sgd", "optax", "sgd", ("sgd", dict(learning_rate=0.1)), lambda: SGD(lr=0.1),
           "momentum=None: identity then -lr (2.2)"),
    Preset("optax.sgd(momentum)", "optax", "sgd", ("sgd", dict(learning_rate=0.05, momentum=0.9)),
           lambda: SGD(lr=0.05, momentum=0.9),
           "trace b = g + mu*b from zeros, so b_1 = g_1 = torch's undampened first buffer (2.2, 1.1)",
           state={"b": "trace"}),
    Preset("optax.sgd(nesterov)", "optax", "sgd",
           ("sgd", dict(learning_rate=0.05, momentum=0.9, nesterov=True)),
           lambda: SGD(lr=0.05, momentum=0.9, nesterov=True),
           "nesterov output g + mu*b (2.2)", state={"b": "trace"}),
    Preset("optax.adam", "optax", "adam", ("adam", dict(learning_rate=1e-2)), lambda: Adam(lr=1e-2),
           "scale_by_adam: E1 eps, eps_root 0, t = count + 1 (2.3)", state=_ADAM_OPTAX_STATE),
    Preset("optax.adamw", "optax", "adamw", ("adamw", dict(learning_rate=1e-2)),
           lambda: AdamW(lr=1e-2, weight_decay=1e-4),
           "optax adamw default weight_decay 1e-4 (torch: 1e-2), lr-coupled: -lr*(u + wd*x) (2.3)",
           state=_ADAM_OPTAX_STATE),
    Preset("optax.adamw(wd=0.1)", "optax", "adamw",
           ("adamw", dict(learning_rate=3e-2, b1=0.9, b2=0.95, weight_decay=0.1)),
           lambda: AdamW(lr=3e-2, beta1=0.9, beta2=0.95, weight_decay=0.1),
           "add_decayed_weights before scale_by_learning_rate = torch AdamW (2.3)", state=_ADAM_OPTAX_STATE),
    Preset("optax.nadam", "optax", "nadam", ("nadam", dict(learning_rate=1e-2)),
           lambda: Adam(lr=1e-2, nesterov=True),
           "scale_by_adam(nesterov=True): mhat = b1*m/(1-b1^(t+1)) + (1-b1)*g/(1-b1^t), no Dozat beta2 "
           "factor on vhat; E1 eps (2.3)", state=_ADAM_OPTAX_STATE),
    Preset("optax.nadamw(wd=0.1)", "optax", "nadam",
           ("nadamw", dict(learning_rate=3e-2, b1=0.8, b2=0.95, weight_decay=0.1)),
           lambda: AdamW(lr=3e-2, beta1=0.8, beta2=0.95, weight_decay=0.1, nesterov=True),
           "NAdam first moment + add_decayed_weights before scale_by_learning_rate = lr-coupled "
           "decoupled decay (2.3)", state=_ADAM_OPTAX_STATE),
    Preset("optax.contrib.muon", "optax", "muon", ("contrib.muon", dict(learning_rate=0.02)),
           lambda: _muon().like_optax(0.02),
           "(in, out) layout = refopt's; EMA + bias-corrected (NAdam) Nesterov; X/(||X||_F + 1e-8); "
           "scale_by_shape sqrt(max(1, fan_out/fan_in)) = refopt 'jordan'; native dtype (2.4)",
           matrix_only=True, state={"m": "mu"}, tol=MUON_OPTAX),
    Preset("optax.contrib.muon(wd,consistent_rms)", "optax", "muon",
           ("contrib.muon", dict(learning_rate=0.02, beta=0.9, weight_decay=0.1, consistent_rms=0.2)),
           lambda: _muon().like_optax(0.02, beta=0.9, weight_decay=0.1, consistent_rms=0.2),
           "consistent_rms=0.2 = refopt 'rms_match'; weight decay lr-coupled, not shape-scaled (2.4)",
           matrix_only=True, state={"m": "mu"}, tol=MUON_OPTAX),
    Preset("optax.contrib.muon(nesterov=False,dion)", "optax", "muon",
           ("contrib.muon", dict(learning_rate=0.02, nesterov=False, ns_coeffs="dion")),
           lambda: _muon().like_optax(0.02, nesterov=False, ns_coeffs="dion"),
           "non-Nesterov input m/(1-beta^t); optax 'dion' = You's five quintics = refopt 'you' (2.4, 4)",
           matrix_only=True, state={"m": "mu"}, tol=MUON_OPTAX),
    Preset("optax.contrib.schedule_free_sgd", "optax", "sf_sgd",
           ("contrib.schedule_free_sgd", dict(learning_rate=0.5, b1=0.9)),
           lambda: _sf().ScheduleFreeSGD(lr=0.5, beta=0.9),
           "constant lr: identical to the FB reference; params = y, z stored, x recomputed (2.5)",
           state={"z": "z"}),
    Preset("optax.contrib.schedule_free_sgd(wd)", "optax", "sf_sgd",
           ("contrib.schedule_free_sgd", dict(learning_rate=0.5, b1=0.8, weight_decay=1e-2)),
           lambda: _sf().ScheduleFreeSGD(lr=0.5, beta=0.8, weight_decay=1e-2),
           "L2 add_decayed_weights before sgd, evaluated at y (2.5)", state={"z": "z"}),
    Preset("optax.contrib.schedule_free_adamw", "optax", "sf_adamw",
           ("contrib.schedule_free_adamw", dict(learning_rate=0.05, weight_decay=1e-2)),
           lambda: _sf().ScheduleFreeAdamW(lr=0.05, weight_decay=1e-2),
           "scale_by_rms(bias_correction, eps outside) = sqrt(v/bc2) + eps; wd lr-coupled at y (2.5)",
           state={"z": "z"}),
    Preset("optax.contrib.schedule_free_sgd(warmup)", "optax", "sf_sgd",
           ("contrib.schedule_free_sgd", dict(learning_rate=0.5, warmup_steps=5)),
           lambda: _sf().ScheduleFreeSGD(lr=0.5, warmup_steps=5, warmup_lag=True),
           "warmup: optax's inner scale_by_learning_rate counts from 0 (z step lr*(t-1)/W) while its "
           "averaging weights count from 1 (lr*t/W) = refopt warmup_lag=True (CONVENTIONS 2.5, optax#1744); "
           "optax computes the warmup in float32 (OPTAX_F32_WARMUP)", state={"z": "z"}, tol=OPTAX_F32_WARMUP),
    Preset("optax.contrib.schedule_free_sgd(warmup64,wd)", "optax", "sf_sgd",
           ("contrib.schedule_free_sgd", dict(learning_rate=0.5, warmup_steps=5, b1=0.8, weight_decay=1e-2,
                                              float64_warmup=True)),
           lambda: _sf().ScheduleFreeSGD(lr=0.5, beta=0.8, weight_decay=1e-2, warmup_steps=5, warmup_lag=True),
           "the lagged warmup (warmup_lag=True, 2.5) with the schedule evaluated in float64; L2 at y rides on "
           "the lagged z step", state={"z": "z"}),
    Preset("optax.contrib.schedule_free_adamw(warmup)", "optax", "sf_adamw",
           ("contrib.schedule_free_adamw", dict(learning_rate=0.05, warmup_steps=5, weight_decay=1e-2)),
           lambda: _sf().ScheduleFreeAdamW(lr=0.05, weight_decay=1e-2, warmup_steps=5, warmup_lag=True),
           "lagged z-step warmup (warmup_lag=True, 2.5, optax#1744); the decoupled decay is scaled by the "
           "lagged lr; float32 warmup (OPTAX_F32_WARMUP)", state={"z": "z"}, tol=OPTAX_F32_WARMUP),
    Preset("optax.contrib.schedule_free_adamw(warmup64,wd)", "optax", "sf_adamw",
           ("contrib.schedule_free_adamw", dict(learning_rate=0.05, warmup_steps=4, b1=0.8, b2=0.99,
                                                weight_decay=0.05, float64_warmup=True)),
           lambda: _sf().ScheduleFreeAdamW(lr=0.05, beta1=0.8, beta2=0.99, weight_decay=0.05, warmup_steps=4,
                                           warmup_lag=True),
           "the lagged warmup with the schedule evaluated in float64 (2.5)", state={"z": "z"}),
    Preset("optax.lamb(weight_decay=0)", "optax", "covariant",
           ("lamb", dict(learning_rate=1e-2, weight_decay=0.0)),
           lambda: _cov()(Adam(eps=1e-6), lr=1e-2),
           "LAMB = scale_by_adam (eps 1e-6, optax.lamb's default) then the trust ratio ||x||/||u|| then -lr: "
           "refopt Covariant(Adam) (post 000, eq. elr-u). Known gap at a zero norm: optax's ratio is 1 "
           "(step -lr*u), refopt makes no step; the problems have no zero arrays",
           state={"base.m": "mu", "base.v": "nu"}, problems=("stream", "quadratic"),
           problems_why="the MLP and GPT have zero-initialised biases: at a zero norm optax's trust ratio is 1 "
                        "(step -lr*u) while refopt's Covariant makes no step (the known gap, preset "
                        "'optax.lamb/lars at a zero norm')"),
    Preset("optax.lars(momentum=0,trust_coefficient=1)", "optax", "covariant",
           ("lars", dict(learning_rate=1e-2, momentum=0.0, trust_coefficient=1.0, weight_decay=1e-3)),
           lambda: _cov()(SGD(weight_decay=1e-3), lr=1e-2),
           "LARS without momentum: g + wd*x (L2, as SGD's), trust ratio ||x||/||g + wd x||, -lr: refopt "
           "Covariant(SGD) (eq. elr-g); same zero-norm gap as LAMB", problems=("stream", "quadratic"),
           problems_why="the MLP and GPT have zero-initialised biases: at a zero norm optax's trust ratio is 1 "
                        "(step -lr*u) while refopt's Covariant makes no step (the known gap, preset "
                        "'optax.lamb/lars at a zero norm')"),
    Preset("optax.ema", "optax", "ema", ("ema", dict(learning_rate=0.05, momentum=0.9, decay=0.9)),
           lambda: _ema()(SGD(lr=0.05, momentum=0.9), decay=0.9, debias=True),
           "optax.ema averages *updates*; refopt.EMA averages iterates. Comparable: optax.ema(decay, "
           "debias=True) fed the iterates x_t of optax.sgd equals refopt EMA's mu (2.6, PITFALLS B16)",
           state={"mu": "ema"}),
    Preset("optax.amsgrad", "optax", "amsgrad", ("amsgrad", dict(learning_rate=1e-2)),
           lambda: Adam(lr=1e-2, amsgrad="bias_corrected"),
           "scale_by_amsgrad: max of the bias-corrected v/(1-b2^t), then sqrt(v_max) + eps (2.3)",
           state={**_ADAM_OPTAX_STATE, "v_max": "nu_max"}),
    Preset("optax.lion", "optax", "lion", ("lion", dict(learning_rate=1e-2)),
           lambda: Lion(lr=1e-2, weight_decay=1e-3),
           "sign((1-b1) g + b1 m), then m = (1-b2) g + b2 m; optax's default weight_decay 1e-3 (refopt's "
           "Lion defaults to 0), decoupled and lr-coupled", state={"m": "mu"}),
    Preset("optax.clip_by_global_norm+adam", "optax", "clip", ("chain:clip_by_global_norm+adam",
                                                              dict(max_norm=0.5, learning_rate=1e-2)),
           lambda: ClipByGlobalNorm(Adam(lr=1e-2), max_norm=0.5),
           "g <- g when ||g|| < max_norm, else (g/||g||) max_norm (no eps), over the whole tree, then Adam"),
]

# ------------------------------------------------------------------------------------------------------
# schedulefree (CONVENTIONS.md 5)
_SF = [
    Preset("schedulefree.SGDScheduleFreeReference", "schedulefree", "sf_sgd",
           ("SGDScheduleFreeReference", dict(lr=0.5, momentum=0.9)),
           lambda: _sf().ScheduleFreeSGD(lr=0.5, beta=0.9), "5.1, constant lr", state={"z": "z", "x": "x"}),
    Preset("schedulefree.SGDScheduleFreeReference(warmup,r,wd)", "schedulefree", "sf_sgd",
           ("SGDScheduleFreeReference", dict(lr=0.5, momentum=0.8, weight_decay=1e-2, warmup_steps=5, r=0.5,
                                              weight_lr_power=1.0)),
           lambda: _sf().ScheduleFreeSGD(lr=0.5, beta=0.8, weight_decay=1e-2, warmup_steps=5, r=0.5,
                                         weight_lr_power=1.0),
           "warmup (k+1)/W for the z step and the weights alike; L2 at y (5.1)", state={"z": "z", "x": "x"}),
    Preset("schedulefree.AdamWScheduleFreeReference", "schedulefree", "sf_adamw",
           ("AdamWScheduleFreeReference", dict(lr=0.05)),
           lambda: _sf().ScheduleFreeAdamW(lr=0.05), "5.2 (HEAD: no sqrt(bc2) in the lr)",
           state={"z": "z", "x": "x", "v": "exp_avg_sq"}),
    Preset("schedulefree.AdamWScheduleFreeReference(warmup,wd,decay_at_z)", "schedulefree", "sf_adamw",
           ("AdamWScheduleFreeReference", dict(lr=0.05, betas=(0.8, 0.99), weight_decay=0.05, warmup_steps=4,
                                                decay_at_z=True, r=1.0)),
           lambda: _sf().ScheduleFreeAdamW(lr=0.05, beta1=0.8, beta2=0.99, weight_decay=0.05, warmup_steps=4,
                                           decay_at_z=True, r=1.0),
           "decoupled decay z <- z - lr*wd*z before the moment update (5.2)",
           state={"z": "z", "x": "x", "v": "exp_avg_sq"}),
]

PRESETS: list[Preset] = _TORCH + _OPTAX + _SF

#: Known gaps of the presets above that refopt does not reproduce by design (reported, never run): kept
#: out of PRESETS, whose optax rows are all reproduced. The plug-in cross-check names this one as the
#: convention variant "trust ratio 1 at a zero norm" (refopt.crosscheck.variants).
KNOWN_GAPS: list[Preset] = [
    Preset("optax.lamb/lars at a zero norm", "optax", "covariant", ("lamb", dict(learning_rate=1e-2)), None,
           "trust ratio at ||x|| = 0 or ||u|| = 0",
           gap="optax's scale_by_trust_ratio uses ratio 1 when either norm is 0, so a zero array (e.g. a "
               "zero-initialised bias) moves by -lr*u; refopt's Covariant makes no step there (PITFALLS B11: "
               "a zero weight has ELR 0). Give such arrays another rule with refopt.Partition."),
]

# ------------------------------------------------------------------------------------------------------
# Deliberately wrong presets: each must FAIL (they prove the tolerances catch real convention errors).
MISCONFIGURED: list[Preset] = [
    Preset("WRONG eps placement: optax.adam(eps inside sqrt) vs refopt E1", "optax", "adam",
           ("adam", dict(learning_rate=1e-2, eps=0.0, eps_root=1e-16)), lambda: Adam(lr=1e-2, eps=1e-8),
           "E3 sqrt(vhat + eps_root) vs E1 sqrt(vhat) + eps: differs where |g| ~ eps (PITFALLS B02)",
           expect_fail=True, problems=("stream", "mlp", "gpt"),
           problems_why="the quadratic's gradients are O(1): the eps placement changes the step by ~1e-8 "
                        "relative, invisible in float32 (float64 catches it)"),
    Preset("WRONG wd kind: torch.AdamW vs refopt Adam (L2)", "torch", "adamw",
           ("AdamW", dict(lr=1e-2, weight_decay=0.1)), lambda: Adam(lr=1e-2, weight_decay=0.1),
           "decoupled decay vs L2 decay through the moments (PITFALLS B05)", expect_fail=True),
    Preset("WRONG wd kind: torch.AdamW vs refopt AdamW(independent)", "torch", "adamw",
           ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
           lambda: AdamW(lr=1e-2, weight_decay=0.1, wd_mode="independent"),
           "lr-coupled decay x(1 - lr*wd) vs lr-free x(1 - wd) (PITFALLS B05)", expect_fail=True),
    Preset("WRONG default wd: optax.adamw vs refopt AdamW() (torch's 1e-2)", "optax", "adamw",
           ("adamw", dict(learning_rate=1e-2)), lambda: AdamW(lr=1e-2),
           "optax's default weight_decay is 1e-4, torch's 1e-2 (CONVENTIONS 10.5)", expect_fail=True),
    Preset("WRONG layout: torch.Muon fed refopt's (in, out) arrays untransposed", "torch", "muon",
           ("Muon", dict(lr=0.02)), lambda: _muon().like_torch(lr=0.02),
           "torch reads shape[:2] as (out, in): the 'original' scale flips on non-square matrices",
           matrix_only=True, state={"m": "momentum_buffer"}, tol=MUON_TORCH_BF16, expect_fail=True),
    Preset("WRONG scale: torch.Muon vs refopt Muon scale='spectral'", "torch", "muon",
           ("Muon", dict(lr=0.02)), lambda: replace(_muon().like_torch(lr=0.02), scale="spectral"),
           "sqrt(fan_out/fan_in) vs sqrt(max(1, A/B))", layout="transpose", matrix_only=True,
           state={"m": "momentum_buffer"}, tol=MUON_TORCH_BF16, expect_fail=True,
           problems=("stream", "mlp", "gpt"),
           problems_why="the quadratic's only matrix is wide (5, 8) (fan_out > fan_in), where 'spectral' and "
                        "'jordan' are the same number sqrt(8/5): nothing is wrong there"),
    Preset("WRONG sign: torch.Muon fed -g", "torch", "muon",
           ("Muon", dict(lr=0.02)), lambda: _muon().like_torch(lr=0.02),
           "a sign error in the gradient convention (the peer is fed -g)", layout="transpose",
           matrix_only=True, state={}, tol=MUON_TORCH_BF16, expect_fail=True, negate_peer_grads=True),
    Preset("WRONG momentum: torch.Muon vs refopt Muon(nesterov=False)", "torch", "muon",
           ("Muon", dict(lr=0.02)), lambda: _muon().like_torch(lr=0.02, nesterov=False),
           "standard Nesterov input (1-mu)g + mu*m vs m", layout="transpose", matrix_only=True,
           state={"m": "momentum_buffer"}, tol=MUON_TORCH_BF16, expect_fail=True,
           problems=("stream", "mlp", "gpt"),
           problems_why="on the deterministic quadratic the gradient turns slowly, so m and (1-mu)g + mu*m "
                        "point alike (measured 0.052 < 0.06): below torch's bf16 resolution"),
    Preset("WRONG Nesterov mix: optax.contrib.muon vs refopt nesterov_mode='standard'", "optax", "muon",
           ("contrib.muon", dict(learning_rate=0.02)),
           lambda: replace(_muon().like_optax(0.02), nesterov_mode="standard"),
           "optax's bias-corrected NAdam mix vs KJ/torch (1-mu)g + mu*m (CONVENTIONS 10.2)",
           matrix_only=True, state={"m": "mu"}, tol=MUON_OPTAX, expect_fail=True,
           problems=("stream", "mlp", "gpt"),
           problems_why="on the deterministic quadratic the gradient turns slowly, so both mixes point alike "
                        "after msign (float32: 1.3e-4 < 2e-4; float64 catches it)"),
    Preset("WRONG momentum order: optax.lars(momentum=0.9) vs refopt Covariant(SGD(momentum=0.9))", "optax",
           "covariant", ("lars", dict(learning_rate=1e-2, momentum=0.9, trust_coefficient=1.0)),
           lambda: _cov()(SGD(momentum=0.9), lr=1e-2),
           "optax.lars applies momentum to the trust-ratio-scaled steps; Covariant normalises the momentum "
           "direction (LARS with momentum is not Covariant(SGD(momentum)))", expect_fail=True),
    Preset("WRONG warmup offset: optax schedule_free_sgd(warmup) vs refopt", "optax", "sf_sgd",
           ("contrib.schedule_free_sgd", dict(learning_rate=0.5, warmup_steps=5)),
           lambda: _sf().ScheduleFreeSGD(lr=0.5, warmup_steps=5),
           "the one-step warmup offset of the released optax (CONVENTIONS 2.5)", state={"z": "z"},
           expect_fail=True),
]

FAMILIES = sorted({p.family for p in PRESETS})


def select(against: str = "all", families: list[str] | None = None, misconfigured: bool = False) -> list[Preset]:
    """The presets for ``against`` ('all' or a peer) and the rule ``families`` (None = all; in any case, as
    the reports print them: ``Adam`` is ``adam``).

    Raises: ValueError for an unknown peer or family."""
    if against != "all" and against not in PEERS:
        raise ValueError(f"--against must be one of {['all', *PEERS]}, got {against!r}")
    known = set(FAMILIES)
    families = [f.lower() if isinstance(f, str) else f for f in families] if families else families  # Adam = adam
    for f in families or []:
        if f not in known:
            raise ValueError(f"unknown rule family {f!r}; choose from {sorted(known)}")
    pool = PRESETS + (MISCONFIGURED if misconfigured else [])
    return [p for p in pool if (against == "all" or p.peer == against) and (not families or p.family in families)]
