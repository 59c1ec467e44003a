r"""The plug-in cross-check: compare *your* optimizer with a refopt rule and name the convention it follows.

:func:`check_impl` runs the implementation (any :mod:`refopt.testing.adapters` kind: a torch optimizer,
an optax transformation, a numpy ``init``/``step`` pair) and the refopt rule from the same initial
params on the same gradient sequence (open loop, :mod:`refopt.crosscheck.problems`: the random
``stream`` with its 1e-8 leaf, the ``quadratic``, and the recorded ``mlp`` and ``gpt`` gradients), and
compares after every step:

* params: ``rel = max|impl - refopt| / max|refopt|`` per array (max-norm relative), and the per-step
  update ``||D_impl - D_refopt||_F / ||D_refopt||_F`` with ``D = x_t - x_{t-1}``;
* state: every refopt state field (Adam ``m``, ``v``, SGD ``b``, Muon ``m``, a wrapper's ``base.m``, ...)
  against the implementation's entry of the same name (torch ``exp_avg``, optax ``mu``, ...; a wrapped
  field by its last name), else the same-shaped entry closest to it; it is reported, and gated only where
  the implementation exposes same-shaped entries (an implementation may keep its state in another form:
  then the params decide).

Tolerance (documented policy, the tiers of :mod:`refopt.crosscheck.presets`): float64 params and state
within 1e-12 (float32 2e-5) -- "exact"; a rule with Newton-Schulz (Muon) 1e-10 (float32 2e-4), as BLAS
and XLA sum matmuls in different orders; for a torch implementation of such a rule also the bfloat16
tier of torch.optim.Muon (per-step update within 0.06, 0.25 on the MLP and GPT gradients, state
within 1e-12); for a JAX implementation of a Schedule-Free rule with warmup, optax's float32 warmup tier
(1e-6). The result names the tier that holds.

On a mismatch it names the first step and leaf that differ, states the **evidence**
(:mod:`refopt.crosscheck.evidence`: which state fields agree and from which step each differs, which
leaves differ, the shape of the difference of the updates) and runs the variants of the rule
(:mod:`refopt.crosscheck.variants`: the conventions file's and the generated ones) on the same inputs,
ranked on the earliest differing steps (:mod:`refopt.crosscheck.diagnosis`). The **DIAGNOSIS** line names
the variant that reproduces the implementation's numbers (within the tier's tolerance, at least 100 times
closer than the rule; 5 times for the bfloat16 tier); else the evidence's specific finding; else a
variant only when it is clearly closer than the rule (2x on every differing problem); else it says that
nothing explains the numbers. A variant that cannot run is counted in the report and listed with its
error by ``report(debug=True)`` (``--debug``).
"""
from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass, field

import numpy as np

from refopt.crosscheck.presets import (EXACT, MUON_OPTAX, MUON_TORCH_BF16, OPTAX_F32_WARMUP, SHAMPOO_ROUNDING,
                                      SOAP_ROUNDING, Tol)
from refopt.crosscheck.problems import PROBLEMS, closed_loop, lacks, make_problem
from refopt.crosscheck.diagnosis import Diagnosis
from refopt.crosscheck.run import Trajectory, entry_figures, figures, last_name, trajectory
from refopt.testing.adapters import Adapter, RuleAdapter, make_adapter, reads_names

__all__ = ["check_impl", "PluginResult", "ProblemResult", "Diagnosis", "tolerance_tiers", "bf16_newton_schulz",
           "DEFAULT_PROBLEMS", "select_names"]

DEFAULT_PROBLEMS = ("stream", "quadratic", "mlp", "gpt")
DTYPES = {"float64": np.float64, "float32": np.float32}


def dtype_name(dtype) -> str:
    """'float64' or 'float32' from that name, a NumPy scalar type or a dtype (np.float32, np.dtype('f4'));
    ValueError for anything else."""
    try:   # (np.dtype(None) would be float64: None is refused like any other non-dtype)
        name = dtype if isinstance(dtype, str) else (np.dtype(dtype).name if dtype is not None else None)
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ValueError(f"dtype must be float64 or float32 (a name, a NumPy type or dtype), got {dtype!r}")
    return name


def select_names(arg: str, value, known, noun: str) -> tuple:
    """The names selected by ``value`` (one name as a str, or an iterable of names), checked against the
    ``known`` ones, in the given order without repeats; shared by :func:`check_impl` (problems) and
    :func:`refopt.testing.invariants` (properties). Raises ValueError, before any work is done, for an
    empty selection (nothing would be compared, and all() over nothing would report agreement), an
    unknown name (listing the known ones) or an entry that is not a str; ``noun`` names one entry
    in the messages ('problem')."""
    known = list(known)
    names = (value,) if isinstance(value, str) else value
    try:
        names = tuple(names)
    except TypeError:
        raise ValueError(f"{arg} must be a name or a sequence of names from {known}, got {value!r}") from None
    if not names:
        raise ValueError(f"{arg} is empty: nothing would be checked; choose from {known}")
    for n in names:
        if not isinstance(n, str) or n not in known:
            raise ValueError(f"unknown {noun} {n!r} in {arg}; "
                             f"choose from {known}")
    return tuple(dict.fromkeys(names))


def _walk(rule):
    yield rule
    for f in ("base",):
        sub = getattr(rule, f, None)
        if sub is not None and hasattr(sub, "init_leaf"):
            yield from _walk(sub)
    rules = getattr(rule, "rules", None)
    if isinstance(rules, dict):
        for r in rules.values():
            yield from _walk(r)


def tolerance_tiers(rule, framework: str, bf16_ns: bool | None = None) -> list[tuple[str, Tol]]:
    """The acceptable tolerance tiers for ``rule`` checked against a ``framework`` implementation.
    ``bf16_ns``: the implementation runs Newton-Schulz in bfloat16 (torch.optim.Muon; see
    :func:`bf16_newton_schulz`), which adds the loose MUON_TORCH_BF16 tier (None: any torch one); a SOAP adds
    SOAP_ROUNDING and a Shampoo SHAMPOO_ROUNDING (their own sensitivity to rounding, measured:
    :mod:`refopt.conventions._spec`)."""
    from refopt.rules.muon import Muon
    from refopt.rules.normuon import NorMuon
    from refopt.rules.schedule_free import ScheduleFreeAdamW, ScheduleFreeSGD
    from refopt.rules.scion import Scion
    from refopt.rules.shampoo import Shampoo
    from refopt.rules.soap import SOAP

    ns = any(isinstance(r, Muon) and r.msign == "newton_schulz" for r in _walk(rule))
    nor = any(isinstance(r, (NorMuon, Scion)) and r.msign == "newton_schulz" for r in _walk(rule))
    tiers = [("reassociation (Newton-Schulz matmuls)", MUON_OPTAX)] if ns else [("exact", EXACT)]
    if (ns or nor) and (framework == "torch" if bf16_ns is None else bf16_ns):
        tiers.append(("bfloat16 Newton-Schulz", MUON_TORCH_BF16))
    if framework == "jax" and any(isinstance(r, (ScheduleFreeSGD, ScheduleFreeAdamW)) and r.warmup_steps
                                  for r in _walk(rule)):
        tiers.append(("optax float32 warmup", OPTAX_F32_WARMUP))
    if any(isinstance(r, SOAP) for r in _walk(rule)):
        tiers.append(("SOAP rounding", SOAP_ROUNDING))
    if any(isinstance(r, Shampoo) for r in _walk(rule)):
        tiers.append(("Shampoo rounding", SHAMPOO_ROUNDING))
    if closed_loop(rule):
        from refopt.conventions.lbfgs import CLOSED_LOOP
        tiers.append(("L-BFGS closed loop", CLOSED_LOOP))
    return tiers


#: the tiers that are a rule's own sensitivity to rounding (refopt against itself, one ulp of the gradients changed;
#: L-BFGS: one rounding of a dot product changed)
_OWN_ROUNDING = ("SOAP rounding", "Shampoo rounding", "L-BFGS closed loop")


def _float64_only(rule, dtype: str) -> None:
    """SOAP and Shampoo are cross-checked in float64 only: in float32 refopt parts from itself by up to 1.6e-2
    (SOAP) and 0.15 (Shampoo with momentum) in 50 steps when one ulp of the gradients changes (SOAP_ROUNDING,
    SHAMPOO_ROUNDING), so a float32 comparison cannot tell a convention error from rounding. Raises ValueError."""
    from refopt.rules.shampoo import Shampoo
    from refopt.rules.soap import SOAP

    hit = [type(r).__name__ for r in _walk(rule) if isinstance(r, (SOAP, Shampoo))]
    if dtype == "float32" and closed_loop(rule):
        raise ValueError(f"{type(rule).__name__} is cross-checked in float64 only: in float32 the loss it drives to "
                         f"~1e-8 on the MLP and the GPT is rounding noise for its line search and stopping tests "
                         f"(params rel 0.02 to 1.5 measured against torch.optim.LBFGS); use --dtype float64")
    if dtype == "float32" and hit:
        raise ValueError(f"{hit[0]} is cross-checked in float64 only: in float32 it parts from itself by up to 1.6e-2 "
                         f"(SOAP) or 0.15 (Shampoo with momentum) in 50 steps when one ulp of the gradients changes, "
                         f"so no float32 tolerance separates a convention error from rounding; use --dtype float64")


def bf16_newton_schulz(adapter) -> bool:
    """True when ``adapter`` builds a torch.optim.Muon (or a subclass; through a factory or a partial too), a
    pytorch_optimizer.NorMuon whose ``_orthogonalize`` is the package's or a pytorch_optimizer.SCION itself (not a
    subclass), whose Newton-Schulz is bfloat16: only
    then is the 6 % update tolerance of MUON_TORCH_BF16 acceptable (a user's own torch Muon is judged as any
    implementation, so that a 2.5 % lr error cannot pass). Decided on an optimizer the adapter builds for a
    probe matrix."""
    if getattr(adapter, "framework", None) != "torch":
        return False
    try:
        import torch
    except ImportError:   # pragma: no cover - a torch adapter without torch cannot run
        return False
    muon = getattr(torch.optim, "Muon", None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt = getattr(adapter.init([np.ones((4, 3))]), "opt", None)
    except Exception:   # noqa: BLE001 - a factory that refuses the probe: judged as any implementation
        return False
    if muon is not None and isinstance(opt, muon):
        return True
    normuon = getattr(sys.modules.get("pytorch_optimizer"), "NorMuon", None)   # imported by the factory if used
    if normuon is not None and isinstance(opt, normuon) and type(opt)._orthogonalize is normuon._orthogonalize:
        return True
    scion = getattr(sys.modules.get("pytorch_optimizer"), "SCION", None)
    return scion is not None and type(opt) is scion     # the package's own step (not a subclass's)


def _matrix_only(rule) -> bool:
    """True when the rule refuses 1-D arrays (Muon): the problems then keep their matrices only."""
    import refopt
    try:
        with warnings.catch_warnings():   # about refopt's own probe tree, not the user's params
            warnings.simplefilter("ignore")
            refopt.init(rule, [np.ones(3)])
    except ValueError:
        return True
    return False


#: the names peers give refopt's state fields (torch, optax, common hand-written ones)
_STATE_NAMES = {"m": ("m", "exp_avg", "mu", "momentum_buffer", "exp_avg_m"), "v": ("v", "exp_avg_sq", "nu"),
                "b": ("b", "momentum_buffer", "trace", "buf"), "vmax": ("vmax", "max_exp_avg_sq", "nu_max")}


def _named(field: str, key: str) -> bool:
    """True when the implementation's state entry ``key`` (a path such as ``[0].mu`` or ``exp_avg``) names
    refopt's field ``field``."""
    name, own = last_name(key), last_name(field)
    return bool(name) and name in _STATE_NAMES.get(own, (own,))


def _state_match(ref: Trajectory, other: Trajectory, peer_names: dict | None = None) -> dict:
    """{refopt field: (the implementation's entry of that name if it has one, else the closest by value, or
    None; max rel difference)}: a wrong first moment is reported as m against m, not paired by value with
    another entry it happens to be closer to. ``peer_names`` ({refopt field: peer state name}, from the
    ``like(PEER, ...)`` mapping the rule was written with) names the pairs instead: a field it leaves out is
    kept by the peer in another form (optax.rmsprop's trace holds -lr b) and is not compared."""
    out = {}
    if not ref.state:
        return out
    for f in ref.state[0]:
        if peer_names is not None and last_name(f) not in peer_names and f not in peer_names:
            out[f] = (None, math.inf)
            continue
        want = None if peer_names is None else peer_names.get(f, peer_names.get(last_name(f)))
        best, named = (None, math.inf), None
        for key in (other.state[0] if other.state else {}):
            fig = entry_figures(ref.state, other.state, f, key)
            if fig is None:
                continue
            worst = float(fig[1].max(initial=0.0))
            if worst < best[1]:
                best = (key, worst)
            if named is None and (last_name(key) == want if want is not None else _named(f, key)):
                named = (key, worst)
        out[f] = named if named is not None else best
    return out


@dataclass
class ProblemResult:
    problem: str
    paths: list
    params_rel: float
    update_rel: float
    state: dict                        # refopt field -> (impl entry, rel)
    tier: str | None                   # the tolerance tier that holds, None if none
    first: tuple | None                # (step, leaf path, figure, value, tolerance) of the first difference
    error: str | None = None
    gate: dict | None = None           # the tier's tolerances for this dtype and problem {figure: rel}
    nonfinite: tuple | None = None     # (step, leaf path, 'NaN' or 'inf') of the first non-finite param it returned

    def tier_text(self) -> str:
        """The tier with the tolerance it applied: 'exact (1e-12)', 'float32 rounding (2e-05)'."""
        if self.tier is None:
            return "-"
        if not self.gate:
            return self.tier
        vals = set(self.gate.values())
        tol = f"{vals.pop():g}" if len(vals) == 1 else ", ".join(f"{k} {v:g}" for k, v in self.gate.items())
        return f"{self.tier} ({tol})"

    @property
    def agree(self) -> bool:
        return self.tier is not None


@dataclass
class PluginResult:
    impl: str
    rule: str
    framework: str
    layout: str
    dtype: str
    steps: int
    problems: list
    diagnosis: list = field(default_factory=list)      # Diagnosis, reproducing first, then by closeness
    rule_distance: float = 0.0
    metric: str = "params"
    evidence: list = field(default_factory=list)       # the findings (refopt.crosscheck.evidence), as lines
    lead: str | None = None                            # the finding specific enough to name a cause
    not_run: list = field(default_factory=list)        # (variant, problem, error) of variants that raised
    skipped: list = field(default_factory=list)        # (problem, reason) of the problems not compared
    closed: bool = False                               # closed loop (a rule with a closure)

    @property
    def agree(self) -> bool:
        """Every problem agrees; a result with no problem compared does not agree."""
        return bool(self.problems) and all(p.agree for p in self.problems)

    @property
    def exit_code(self) -> int:
        return 0 if self.agree else 1

    @property
    def best(self) -> Diagnosis | None:
        return self.diagnosis[0] if self.diagnosis else None

    def diagnosis_line(self) -> str:
        """The DIAGNOSIS line: a variant that reproduces the numbers; else the evidence's specific finding
        (:mod:`refopt.crosscheck.evidence`); else a variant only when it is clearly closer than the rule
        (:mod:`refopt.crosscheck.diagnosis`)."""
        bad = [p for p in self.problems if p.nonfinite]
        if bad:
            t, path, kind = bad[0].nonfinite
            return (f"DIAGNOSIS: your implementation returned {kind} params at step {t}, leaf {path} "
                    f"[{bad[0].problem}] (refopt's are finite there): look for a division by zero, a sqrt or "
                    f"log of a negative number, or an overflow; no convention variant explains a non-finite result.")
        b = self.best
        if b is not None and b.reproduces:
            return (f"DIAGNOSIS: {b.name} -- {b.detail}. This variant reproduces your numbers "
                    f"({self.metric} rel {b.distance:.2e}; the rule itself: {self.rule_distance:.2e}).")
        lead = b if b is not None and b.clearly_closer and not self.lead else None
        parts = []
        if self.lead:
            parts.append(f"{self.lead}.")
        if lead is not None:
            parts.append(f"No variant reproduces your numbers; the closest, {1 / max(lead.closeness, 1e-300):.3g}x "
                         f"closer than the rule on the earliest differing steps of every differing problem, is "
                         f"{lead.name} -- {lead.detail}.")
        if not parts:
            parts.append("no variant reproduces your numbers or comes clearly closer to them than the rule "
                         "(at least 2x on the earliest differing steps): read the evidence above, then look at "
                         "the first difference for a plain error (a constant, a missing or extra term).")
        return "DIAGNOSIS: " + " ".join(parts)

    def report(self, debug: bool = False) -> str:
        """The table, the first differences, the evidence, the DIAGNOSIS line and the closest variants;
        ``debug`` adds the variants that could not run, with their errors."""
        lines = [f"implementation: {self.impl} ({self.framework}, layout {self.layout})",
                 f"refopt rule:    {self.rule}",
                 f"{self.steps} steps, {self.dtype}, " + (
                     "closed loop (each side evaluates refopt's model at its own points, one batch)" if self.closed
                     else "open loop (the same gradients for both)"), ""]
        lines[-1:-1] = [f"skipped [{prob}]: {why}" for prob, why in self.skipped]
        head = ["problem", "params rel", "update rel", "state", "tolerance tier", "status"]
        rows = []
        for p in self.problems:
            st = ", ".join(f"{f}~{k}:{v:.1e}" if k else f"{f}:-" for f, (k, v) in p.state.items()) or "-"
            rows.append([p.problem, f"{p.params_rel:.2e}", f"{p.update_rel:.2e}", st, p.tier_text(),
                         "agree" if p.agree else ("ERROR" if p.error else "DIFFER")])
        w = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
        if not rows:
            lines.append("no problem was compared")
        lines += ["  ".join(h.ljust(x) for h, x in zip(head, w)), "  ".join("-" * x for x in w)]
        lines += ["  ".join(c.ljust(x) for c, x in zip(r, w)) for r in rows]
        lines.append("")
        if self.agree:
            lines.append("AGREE: the implementation reproduces the refopt rule within the documented tolerance.")
            return "\n".join(lines)
        for p in self.problems:
            if p.first and not p.agree:
                t, path, fig, v, tol = p.first
                lines.append(f"first difference [{p.problem}]: step {t}, leaf {path}: {fig} rel {v:.3g} > {tol:g}")
        if self.evidence:
            lines.append("evidence:")
            lines += [f"  - {e}" for e in self.evidence]
        lines.append(self.diagnosis_line())
        if self.diagnosis and not any(p.nonfinite for p in self.problems):
            lines.append("closest variants (window distance / the rule's): " + "; ".join(
                f"{d.name} {d.closeness:.2g}" for d in self.diagnosis[:4]))
        if self.not_run:
            lines.append(f"{len(self.not_run)} variant(s) could not run" + (":" if debug else " (--debug lists them)"))
            if debug:
                lines += [f"  - {n} [{prob}]: {err}" for n, prob, err in self.not_run]
        return "\n".join(lines)


def _nonfinite(run: Trajectory, paths) -> tuple | None:
    """(step, leaf path, 'NaN' or 'inf') of the first non-finite parameter the implementation returned."""
    for t, xs in enumerate(run.params):
        for path, x in zip(paths, xs):
            a = np.asarray(x)
            if a.dtype.kind in "fc" and not np.isfinite(a).all():
                return t + 1, path, "NaN" if np.isnan(a).any() else "inf"
    return None


def _gated_ok(prel, urel, state, tol: dict) -> bool:
    if "params" in tol and not float(prel.max(initial=0.0)) <= tol["params"]:
        return False
    if "update" in tol and not float(urel.max(initial=0.0)) <= tol["update"]:
        return False
    if "state" in tol:
        for key, v in state.values():
            if key is not None and not v <= tol["state"]:
                return False
    return True


def _first_state(srel: dict, paths, tol: float) -> tuple | None:
    """(step, leaf path, 'state FIELD (~ENTRY)', rel, tol) of the first step and leaf where a paired state
    field differs beyond ``tol`` (the params agree), from ``srel`` {field: (entry, rel (steps, leaves))}."""
    best = None
    for f, (k, rel) in srel.items():
        over = np.argwhere(~(rel <= tol)) if rel is not None else ()
        if len(over) and (best is None or over[0][0] + 1 < best[0]):
            t, i = over[0]
            best = (int(t) + 1, paths[i], f"state {f} (~{k})", float(rel[t, i]), tol)
    return best


def check_impl(impl, rule, kwargs: dict | None = None, framework: str | None = None, layout: str | None = None,
               steps: int = 50, dtype: str = "float64", problems=DEFAULT_PROBLEMS, seed: int = 0,
               diagnose: bool = True, name: str | None = None) -> PluginResult:
    """Cross-check an implementation against the refopt ``rule`` (see the module docstring).

    Args:
      impl: a torch optimizer class or factory, an optax factory, a numpy object with init/step, or an
        :class:`~refopt.testing.adapters.Adapter` (then kwargs/framework/layout are ignored).
      rule: a refopt rule, or a rule expression string (``"AdamW(lr=1e-3, weight_decay=0.1)"``).
      kwargs, framework, layout: as :func:`refopt.testing.adapters.make_adapter`.
      steps: >= 1; dtype: 'float64' | 'float32' (or np.float64, np.float32, a dtype); problems: a non-empty sequence of names from
        :data:`PROBLEMS`, or one name as a str (``problems="stream"``).
    Returns a :class:`PluginResult` (``.agree``, ``.exit_code``, ``.report()``, ``.diagnosis``).
    Raises: ValueError for bad arguments or a bad rule expression; UserCodeError when the implementation
      raises; PeerNotInstalled when its framework is missing.
    """
    from refopt.crosscheck.expr import parse_rule, peer_call, to_expr

    peer_names = None
    if isinstance(rule, str):
        call, rule = peer_call(rule), parse_rule(rule)
        if call is not None:
            from refopt.conventions import peers
            peer_names = peers()[call[0]].state_map(call[1])
    dtype = dtype_name(dtype)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    _float64_only(rule, dtype)
    problems = select_names("problems", problems, PROBLEMS, "problem")
    skipped = [(p, lacks(rule, p)) for p in problems if lacks(rule, p)]
    problems = [p for p in problems if p not in dict(skipped)]
    if not problems:
        raise ValueError(f"{type(rule).__name__} needs {', '.join(rule.inputs)}: choose problems with a loss "
                         f"(quadratic, mlp, gpt), not only the stream")
    adapter = impl if isinstance(impl, Adapter) else make_adapter(impl, kwargs, framework, layout, name)
    try:
        rule_text = to_expr(rule)
    except ValueError:
        rule_text = repr(rule)
    tiers = tolerance_tiers(rule, adapter.framework, bf16_newton_schulz(adapter))
    matrix_only = _matrix_only(rule)
    ref_adapter = RuleAdapter(rule)
    results, runs = [], []
    for prob_name in problems:
        prob = make_problem(prob_name, DTYPES[dtype], seed, matrix_only=matrix_only, full_batch=closed_loop(rule))
        names = prob.paths if reads_names(adapter) else None     # an optimizer that picks its rule by name
        ref, grads = trajectory(ref_adapter, prob.leaves, prob.grad, steps, state="all", paths=names,
                                inputs=tuple(rule.inputs))
        other, _ = trajectory(adapter, prob.leaves, prob.grad if closed_loop(rule) else grads, steps, state="all",
                              paths=names, inputs=tuple(rule.inputs))
        fig = figures(ref, other, prob.leaves)
        prel, urel = fig.params_rel, fig.update_rel
        state = _state_match(ref, other, peer_names)
        tier, first, gate = None, None, None
        for tname, tol in tiers:
            tt = tol.for_dtype(dtype, prob_name)
            if _gated_ok(prel, urel, state, tt):
                # EXACT's float32 entries (2e-5) are float32 rounding over the steps, not bitwise agreement
                tier, gate = ("float32 rounding" if tname == "exact" and dtype == "float32" else tname), tt
                break
        # the first difference is reported above the rule's own rounding where a tier measures it (SOAP, Shampoo)
        tol0 = next((t for n, t in tiers if n in _OWN_ROUNDING), tiers[0][1]).for_dtype(dtype, prob_name)
        srel = {f: (k, None if k is None else entry_figures(ref.state, other.state, f, k)[1])
                for f, (k, _) in state.items()}
        state_only = False
        if tier is None:
            first = fig.first(prob.paths, tol0)
            if first is None:     # only the state differs
                state_only, first = True, _first_state(srel, prob.paths, tol0.get("state", tol0.get("params")))
        results.append(ProblemResult(prob_name, prob.paths, float(prel.max(initial=0.0)), float(urel.max(initial=0.0)),
                                     state, tier, first, gate=gate,
                                     nonfinite=None if tier is not None else _nonfinite(other, prob.paths)))
        runs.append(dict(prob=prob, problem=prob_name, grads=grads, ref=ref, other=other, prel=prel, urel=urel,
                         paths=prob.paths, names=names, leaves=prob.leaves, tol=tol0, agree=tier is not None,
                         first=first[0] if first else None, state=srel, state_only=state_only))
    res = PluginResult(adapter.name, rule_text, adapter.framework, adapter.layout, dtype, steps, results,
                       skipped=skipped, closed=closed_loop(rule))
    if res.agree or not diagnose or any(r.nonfinite for r in results):   # no variant explains a NaN
        return res
    from refopt.crosscheck.diagnosis import rank, state_distance
    from refopt.crosscheck.evidence import gather

    ev = gather(rule, runs)
    res.evidence, res.lead = ev.lines, ev.lead
    bf16 = any("bfloat16" in n for n, _ in tiers)
    metric = "update" if bf16 else "params"
    res.metric = metric
    limit = max(t.for_dtype(dtype)[metric] for _, t in tiers if metric in t.for_dtype(dtype))
    for r in runs:
        if r["state_only"]:     # the params agree: the variants are judged on the state that differs
            r["dist"], r["limit"] = state_distance(r["ref"], r["other"], r["state"]), r["tol"]["state"]
        else:
            r["dist"] = (r["urel"] if bf16 else r["prel"]).max(axis=1, initial=0.0)
    if all(r["state_only"] for r in runs if not r["agree"]):
        res.metric = "state"
    res.rule_distance = max(float(r["dist"].max(initial=0.0)) for r in runs)
    ranking = rank(rule, runs, f"{metric}_rel", limit, 5.0 if bf16 else 100.0)
    res.diagnosis, res.not_run = ranking.diagnosis, ranking.not_run
    return res
