r"""What the measurements of a failed cross-check rule in and out, before any variant is tried.

:func:`gather` reads the trajectories the plug-in cross-check (:mod:`refopt.crosscheck.plugin`) recorded --
refopt's and the implementation's params and state after every step, on every problem -- and states:

* **state**: for each refopt state field (paired with the implementation's entry of the same name), the
  first step it differs beyond the tolerance, or that it agrees at every step. Moments that agree while
  the params differ rule out the moments' update (its betas, the gradient fed to it, an L2 term) and leave
  the lr, the schedule, the bias corrections, eps and the step's final formula;
* **first step**: step 1 differing points at a formula or a scale; step 1 agreeing at what a step carries
  to the next (momentum, a counter, the state's update);
* **leaves**: whether only some leaves differ, by ndim (vectors against matrices: a per-group option such
  as no decay on biases) or by :class:`~refopt.rules.partition.Partition` label;
* **a shape scale**: at step 1 (the same params, gradient and state on both sides) the ratio r_i of your
  update to refopt's per leaf (with a decay: of the updates without refopt's decay term), fitted to
  k f(shape) for a simple function f of fan_in, fan_out and the size (:func:`_shape_scale`);
* **the update's shape**: per step t and leaf i the least-squares ratio and the cosine of the
  implementation's update D' against refopt's D (both from their own previous params)::

      c_t = <D'_t, D_t> / <D_t, D_t>,      cos_t = <D'_t, D_t> / (||D'_t|| ||D_t||)

  and the pattern of c_t when the updates are parallel (cos = 1): a constant (the lr or a scale; -1: the
  sign), a ratio of bias corrections ((1 - b^t)/(1 - b^(t+1)), their square roots, a frozen counter: a
  step counter offset in one place), the schedule read at another step (gamma(t -+ 1)/gamma(t)), or an
  unexplained per-step scale; and, when they are not parallel, whether the signs still agree (a
  normalisation or a denominator) or not (a formula or the state).

:attr:`Evidence.lead` is the one finding specific enough to name a cause (a matched c_t pattern, a constant
scale, a sign, one group of leaves), used by the DIAGNOSIS line when no variant reproduces the numbers.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Evidence", "gather", "update_fit", "ratio_patterns"]

PARALLEL = 1e-9      # 1 - cos below which two updates are parallel
PATTERN = 1e-6       # relative deviation within which c_t follows a pattern at every step


@dataclass
class Evidence:
    """The findings (:func:`gather`): ``lines`` to print, ``lead`` the specific one (or None)."""

    lines: list = field(default_factory=list)
    lead: str | None = None


def _steps(ref, other, leaves0, n=None):
    """Per step t (the first ``n``, default all both recorded), per leaf: (x_{t-1}, D_t, x'_{t-1}, D'_t), float64,
    refopt's previous params and update and the implementation's, each from its own previous params; None
    for a leaf whose shapes differ."""
    prev_r = prev_o = [np.asarray(x, np.float64) for x in leaves0]
    for xr, xo in list(zip(ref.params, other.params))[:n]:
        xr, xo = [np.asarray(a, np.float64) for a in xr], [np.asarray(a, np.float64) for a in xo]
        yield [(pr, a - pr, po, b - po) if a.shape == b.shape == pr.shape == po.shape else None
               for a, b, pr, po in zip(xr, xo, prev_r, prev_o)]
        prev_r, prev_o = xr, xo


def update_fit(ref, other, leaves0) -> tuple[np.ndarray, np.ndarray]:
    """(c, cos), arrays (steps, leaves) of the module docstring (nan where refopt's update is 0 or either
    is not finite)."""
    n, k = min(len(ref.params), len(other.params)), len(leaves0)
    c, cos = np.full((n, k), np.nan), np.full((n, k), np.nan)
    for t, leaves in enumerate(_steps(ref, other, leaves0)):
        for i, leaf in enumerate(leaves):
            if leaf is None:
                continue
            dr, do = leaf[1].ravel(), leaf[3].ravel()
            nr, no = float(dr @ dr), float(np.linalg.norm(do))
            if nr > 0 and math.isfinite(no) and math.isfinite(nr):
                dot = float(do @ dr)
                c[t, i] = dot / nr
                cos[t, i] = dot / (no * math.sqrt(nr)) if no > 0 else 0.0
    return c, cos


def _betas(rule, prefix="") -> list:
    """(name, value) of every coefficient in (0, 1) of the rule and of its nested rules."""
    out = []
    for f in dataclasses.fields(rule) if dataclasses.is_dataclass(rule) else ():
        v = getattr(rule, f.name)
        if hasattr(v, "init_leaf"):
            out += _betas(v, f"{prefix}{f.name}.")
        elif isinstance(v, dict):
            for k, r in v.items():
                if hasattr(r, "init_leaf"):
                    out += _betas(r, f"{prefix}{k}.")
        elif isinstance(v, float) and 0 < v < 1 and f.name not in ("lr", "eps", "weight_decay"):
            out.append((prefix + f.name, v))
    return out


def _schedules(rule, prefix="") -> list:
    out = []
    for f in dataclasses.fields(rule) if dataclasses.is_dataclass(rule) else ():
        v = getattr(rule, f.name)
        if f.name == "schedule" and callable(v):
            out.append((prefix + "schedule", v))
        elif hasattr(v, "init_leaf"):
            out += _schedules(v, f"{prefix}{f.name}.")
    return out


def ratio_patterns(rule, steps: int) -> list[tuple[str, np.ndarray]]:
    """The named per-step ratios c_t (t = 1..steps) a step-counter or schedule offset produces in
    ``rule``: bias corrections of each coefficient b read at t + 1 or frozen at 1 or missing (b^t forms, and
    their square roots for a second moment), and each schedule read at t - 1, t + 1 or frozen."""
    t = np.arange(1, steps + 1, dtype=np.float64)
    out = []
    for name, b in _betas(rule):
        bc, nxt, one = 1 - b ** t, 1 - b ** (t + 1), 1 - b
        for what, r, extra in ((f"the bias correction of {name} reads t + 1", bc / nxt, ""),
                               (f"the bias correction of {name} is frozen at t = 1", bc / one, ""),
                               (f"the bias correction of {name} is missing", bc,
                                f"; or an extra 1 - {name}^t divides a term the rule leaves uncorrected")):
            out.append((f"c_t = {what} (1 - {name}^t form{extra})", r))
            out.append((f"c_t = {what} (sqrt(1 - {name}^t) form, a second moment)", 1 / np.sqrt(r)))
    for name, s in _schedules(rule):
        g = _read(s, 0, t)
        for what, how in (("t - 1 (counted from 0)", -1), ("t + 1", 1), ("t = 1 (frozen)", "frozen")):
            h = _read(s, how, t)
            with np.errstate(divide="ignore", invalid="ignore"):
                out.append((f"c_t = {name}(...) read at {what} over {name}(t): the schedule's index", h / g))
    return out


def _read(schedule, how, ts) -> np.ndarray:
    """The schedule read at t shifted by ``how`` for each t, nan where a user's schedule function refuses that
    step (a table that ends at the last step, a function defined from t = 1): the pattern is not compared
    there."""
    from refopt.conventions._generated import shifted_schedule

    at, out = shifted_schedule(schedule, how), []
    for k in ts:
        try:
            out.append(at(int(k)))
        except Exception:  # noqa: BLE001 - the user's function outside its range: no value, compared nowhere
            out.append(np.nan)
    return np.array(out, dtype=np.float64)


def _pattern(c_t: np.ndarray, rule) -> str | None:
    """The name of the ratio pattern c_t follows at every step (finite entries), or None."""
    ok = np.isfinite(c_t)
    if ok.sum() < 2:
        return None
    for name, r in ratio_patterns(rule, len(c_t)):
        both = ok & np.isfinite(r) & (r != 0)
        if both.sum() >= max(2, ok.sum() - 1) and np.ptp(r[both]) > 10 * PATTERN and \
                np.all(np.abs(c_t[both] / r[both] - 1) <= PATTERN):
            return name
    return None


def _named_constant(c: float, rule) -> str:
    """' (= 1/(1 - momentum): ...)' when c equals a simple function of one of the rule's coefficients."""
    names = [("lr", getattr(rule, "lr", None))] + _betas(rule)
    for name, v in names:
        if isinstance(v, float) and 0 < v:
            forms = [(name, v), (f"1/{name}", 1 / v)]
            if v < 1:
                forms += [(f"1 - {name}", 1 - v), (f"1/(1 - {name})", 1 / (1 - v)), (f"{name}/(1 - {name})", v / (1 - v)),
                          (f"(1 - {name})/{name}", (1 - v) / v)]
            for form, w in forms:
                if abs(c / w - 1) <= PATTERN:
                    return f" (= {form})"
    return ""


def _steps_text(steps: dict) -> str:
    """'step 2 (stream, mlp), step 3 (quadratic)' from {problem: step}."""
    by: dict = {}
    for p, s in steps.items():
        by.setdefault(s, []).append(p)
    return ", ".join(f"step {s} ({', '.join(ps)})" for s, ps in sorted(by.items()))


def _texts(rule, attr: str) -> list:
    """The conventions' ``final`` or ``per_step`` texts of the rule and of its nested rules."""
    from refopt.conventions import for_rule

    out, conv = [], for_rule(rule)
    if conv is not None and getattr(conv, attr):
        out.append(getattr(conv, attr))
    base = getattr(rule, "base", None)
    if hasattr(base, "init_leaf"):
        out += [t for t in _texts(base, attr) if t not in out]
    for sub in (getattr(rule, "rules", None) or {}).values():
        out += [t for t in _texts(sub, attr) if t not in out]
    return out


def gather(rule, runs: list) -> Evidence:
    """The evidence from ``runs``: one dict per problem with keys problem, paths, leaves (initial params),
    ref and other (:class:`~refopt.crosscheck.run.Trajectory`, state recorded), prel (params rel, steps x
    leaves), state ({field: (entry, rel array (steps, leaves) or None)}), tol (the gate {figure: rel}),
    agree (bool), grads (the gradients of every step). The lead is the most specific finding, in this order:
    a decay term in the difference, a state field off by a constant factor (it says where a constant update
    ratio comes from), a scale that is a function of the shape, a constant
    or named pattern of the update ratio, one group of leaves, differences no larger than float32's rounding in a
    float64 run, the state fields that differ, the step's final formula (the state agrees, the direction does not),
    the rule's per-step factors (the ratio varies with t)."""
    ev = Evidence()
    bad = [r for r in runs if not r["agree"]]
    if not bad:
        return ev
    leads = {}
    ev.lines.append(_first_steps(bad))
    state_line, fields = _state(bad)
    if state_line:
        ev.lines.append(state_line)
    differ = [f for f, (_, s) in fields.items() if s != "agrees"]
    agree = [f for f, (_, s) in fields.items() if s == "agrees"]
    if fields and not differ:
        ev.lines.append("the state agrees at every step while the params differ: the state's update (its "
                        "coefficients, the gradient fed to it, an L2 term) is right; the difference is in the "
                        "lr, the schedule, a bias correction, eps, a decoupled decay or the step's final formula")
    first_diff = min((fields[f][1] for f in differ), default=None)
    firsts = [f for f in differ if fields[f][1] == first_diff]
    later = [f for f in fields if f not in firsts]
    if differ and later and first_diff == 1:
        leads["state"] = (f"the state {', '.join(firsts)} differs from step 1, where its update sees the same params "
                          f"and gradient on both sides, while {', '.join(later)} agree{'s' if len(later) == 1 else ''} "
                          f"at step 1: the update of {', '.join(firsts)} differs ({_INPUTS})")
    elif differ and not later and first_diff == 1:
        per = _texts(rule, "per_step")
        leads["state"] = (f"every state field ({', '.join(firsts)}) differs from step 1, where its update sees the same "
                          f"params and gradient on both sides: the input fed to the state (the gradient after "
                          f"clipping or a decay term) or its coefficients" + (f"; the rule's per-step factors: "
                                                                              f"{'; '.join(per)}" if per else ""))
    elif differ and agree:
        leads["state"] = (f"the update of the state {', '.join(differ)} differs ({'; '.join(f'{f} from step {fields[f][1]}' for f in differ)}) "
                          f"while {', '.join(agree)} agree{'s' if len(agree) == 1 else ''} at every step: "
                          f"{'its' if len(differ) == 1 else 'their'} update differs ({_INPUTS})")
    f32 = float32_rounding(bad)
    if f32:
        ev.lines.append(f32)
        leads["float32"] = f32
    ratio = _state_ratio(bad, differ, rule)
    if ratio:
        ev.lines.append(ratio)
        leads["state_ratio"] = ratio
    group = _leaf_groups(rule, bad)
    if group:
        ev.lines.append(group)
        leads["group"] = group
    decay = _decay(rule, bad)
    if decay:
        ev.lines.append(decay)
        leads["decay"] = decay
    scale = _shape_scale(rule, bad)
    if scale:
        ev.lines.append(scale)
        leads["shape_scale"] = scale
    shape = _shape(rule, bad)
    if shape:
        line, lead, kind = shape
        ev.lines.append(line)
        if lead:
            leads["shape"] = lead
        if kind == "not parallel" and fields and not differ:
            final = "; ".join(_texts(rule, "final")) or "the step's final formula"
            leads["final"] = (f"the state agrees at every step but the update's direction does not: the step computed "
                              f"from the state differs -- {final}")
        if kind == "varying":
            per = _texts(rule, "per_step") + (["the schedule gamma_t"] if _schedules(rule) else [])
            leads["per_step"] = ("your update is refopt's times a factor that changes from step to step (the updates "
                                 "are parallel): one of the rule's per-step factors differs -- "
                                 + ("; ".join(per) if per else "a per-step scale"))
    for key in ("decay", "state_ratio", "shape_scale", "shape", "group", "float32", "state", "final", "per_step"):
        if key in leads:
            ev.lead = leads[key]
            break
    return ev


_INPUTS = ("its coefficient: a beta, an averaging weight, a counter; or its input: the gradient with or without "
           "a decay term or clipping, the iterate it averages")


def _first_steps(bad) -> str:
    first = {}
    for r in bad:
        over = np.nonzero((r["prel"] > r["tol"].get("params", 0.0)).any(axis=1))[0]
        if over.size:
            first[r["problem"]] = int(over[0]) + 1
    if not first:
        return ("the params agree at every step on every problem; only the state differs: a state the step does "
                "not feed back into the params (an average or EMA of the iterates, a statistic), or one kept in "
                "another form")
    if min(first.values()) > 1:
        return (f"step 1 agrees; the params first differ at {_steps_text(first)}: the first step's formula is "
                f"right, the difference enters with what a step carries to the next (the state's update, momentum, "
                f"a step counter)")
    return (f"the params differ from {_steps_text(first)}: a formula, a scale, the lr or schedule at t = 1, "
            f"or the state's first update")


def _state(bad) -> tuple[str, dict]:
    """('state: ...' line, {field: (entry, first differing step or 'agrees')}) over the differing problems."""
    tol_s = bad[0]["tol"].get("state", bad[0]["tol"].get("params", 1e-12))
    fields = {}
    for r in bad:
        for f, (key, rel) in r["state"].items():
            if key is None or rel is None:
                continue
            over = np.nonzero((rel > tol_s).any(axis=1))[0]
            s = int(over[0]) + 1 if over.size else "agrees"
            prev = fields.get(f, (key, "agrees"))[1]
            fields[f] = (key, s if prev == "agrees" else (prev if s == "agrees" else min(prev, s)))
    if not fields:
        return "", fields
    parts = [f"{f} (~{k}) " + ("agrees at every step" if s == "agrees" else f"differs from step {s}")
             for f, (k, s) in fields.items()]
    return "state: " + "; ".join(parts), fields


#: the float32 cross-check's own bound (EXACT's float32 params): differences of float32 rounding over 50 steps
FLOAT32_ROUNDING = 2e-5


def float32_rounding(bad) -> str | None:
    """float64 runs whose params differ at every problem by more than float64's rounding but no more than
    float32's: the implementation may round to float32 somewhere (a cast of the gradient, a float32 state), or
    a small term differs."""
    worst = []
    for r in bad:
        if not all(np.asarray(x).dtype == np.float64 for x in r["leaves"]):
            return None
        worst.append(float(np.max(r["prel"], initial=0.0)))
    if worst and max(worst) <= FLOAT32_ROUNDING and min(worst) > 1e-10:
        return (f"the params differ by {min(worst):.2g} to {max(worst):.2g} (relative) in a float64 run, no more than "
                f"float32's rounding (2^-24 = 6e-8 per operation): if the implementation computes or keeps anything "
                f"in float32 (a cast of the gradient, a float32 state or scalar), that is the difference; else look "
                f"for a small term (eps, a tiny decay)")
    return None


def _state_ratio(bad, differ, rule) -> str | None:
    """A differing state field that is a constant multiple of refopt's at every step and leaf."""
    for f in differ:
        cs = []
        for r in bad:
            key = r["state"].get(f, (None, None))[0]
            for sr, so in zip(r["ref"].state, r["other"].state):
                for a, b in zip(sr.get(f) or (), so.get(key) or ()):
                    if a is None or b is None or np.shape(a) != np.shape(b):
                        continue
                    a64, b64 = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
                    na, nb = float(a64 @ a64), float(np.linalg.norm(b64))
                    if na > 0 and nb > 0:
                        dot = float(b64 @ a64)
                        if dot / (nb * math.sqrt(na)) < 1 - PARALLEL:
                            cs = None
                            break
                        cs.append(dot / na)
                if cs is None:
                    break
            if cs is None:
                break
        if cs:
            c0 = float(np.median(cs))
            if f"{c0:.6g}" == "1":      # equal to rounding: not a scale (float32_rounding names it)
                continue
            if c0 != 0 and np.all(np.abs(np.array(cs) / c0 - 1) <= PATTERN):
                return (f"the state {f} is {c0:.6g} x refopt's at every step and leaf{_named_constant(c0, rule)}: "
                        f"the same recursion with its input or its coefficient scaled by that factor")
    return None


def _leaf_groups(rule, bad) -> str | None:
    for r in bad:
        tol = r["tol"].get("params", 0.0)
        diff = [bool((r["prel"][:, i] > tol).any()) for i in range(len(r["paths"]))]
        if all(diff) or not any(diff):
            continue
        nd = [np.ndim(x) for x in r["leaves"]]
        dpaths = [p for p, d in zip(r["paths"], diff) if d]
        groups = _groups(rule, r["paths"], r["leaves"])
        labels = {lab for lab, d in zip(groups, diff) if d} if groups else set()
        if groups and all((lab in labels) == d for lab, d in zip(groups, diff)):
            subs = [rule.rules[lab] for lab in sorted(labels)]
            steps = "; ".join(t for sub in subs for t in _texts(sub, "final"))
            return (f"only the leaves of Partition group(s) {sorted(labels)} differ [{r['problem']}]: the rule of "
                    f"that group ({', '.join(type(sub).__name__ for sub in subs)}) or one of its options"
                    + (f" -- its step: {steps}" if steps else ""))
        steps = "; ".join(_texts(rule, "final"))
        if all((n <= 1) == d for n, d in zip(nd, diff)):
            return (f"only the vectors (ndim <= 1: {', '.join(dpaths)}) differ, the matrices agree [{r['problem']}]: "
                    f"an option applied per group of leaves (a decay or a rule on biases and gains)")
        if all((n >= 2) == d for n, d in zip(nd, diff)):
            return (f"only the matrices (ndim >= 2) differ, the vectors agree [{r['problem']}]: an option applied "
                    f"per group of leaves, or a formula that acts on matrices only" + (f" -- the step: {steps}" if steps
                                                                                       else ""))
        return (f"only some leaves differ [{r['problem']}]: {', '.join(dpaths)}"
                + (f" -- the step: {steps}" if steps else ""))
    return None


def _decay(rule, bad) -> str | None:
    """The updates' difference e = D' - D proportional to the params at every step of the first
    :data:`WINDOW_DECAY` (|cos(e, x)| >= 1 - :data:`DECAY_FIT`, one rate k_t for every leaf, x the midpoint
    of the two sides' previous params): a decay term differs. Where the rule has a decoupled decay (lr_t wd
    per step, lr_t = lr gamma_t), each named form of your decay rate rho_t is tested exactly against the
    two sides' own params, e_t = -rho_t x'_{t-1} + lr_t wd x_{t-1}: the opposite sign, missing, twice, the
    peak lr in place of the scheduled one, not multiplied by the lr (AdamW's lr-independent decay, gamma_t wd:
    not scheduled, multiplied by the lr). In a Partition whose leaves of one group differ, that group's rule
    is the reference, and the other groups' lr in place of its own is one more form."""
    r, steps = bad[0], []
    for t, leaves in enumerate(_steps(r["ref"], r["other"], r["leaves"], WINDOW_DECAY)):
        if any(leaf is None for leaf in leaves):
            return None
        steps.append((t + 1, [((do - dr).ravel(), po.ravel(), pr.ravel()) for pr, dr, po, do in leaves]))
    big = max((float(np.linalg.norm(e)) for _, ls in steps for e, _, _ in ls), default=0.0)
    ks = []
    for t, ls in steps:
        fit = []
        for e, xo, xr in ls:
            x, ne = 0.5 * (xo + xr), float(np.linalg.norm(e))
            if ne <= 0.05 * big:     # no decay difference at this step (only the params' drift is left)
                continue
            nx = float(np.linalg.norm(x))
            if nx == 0 or abs(float(e @ x)) / (ne * nx) < 1 - DECAY_FIT:
                return None
            fit.append(float(e @ x) / nx ** 2)
        if fit:
            if max(fit) - min(fit) > DECAY_FIT * max(abs(v) for v in fit):
                return None     # one decay rate for every leaf
            ks.append((t, float(np.median(fit))))
    if len(ks) < 2:
        return None
    head = ("the difference of the updates is proportional to the params at every step (e_t = k_t x_{t-1}, "
            f"k = {', '.join(f'{k:.4g}' for _, k in ks[:3])}{' ...' if len(ks) > 3 else ''}): a decay term differs")
    sub, where, others = rule, "", {}
    labels = _groups(rule, r["paths"], r["leaves"])
    if labels is not None:       # a Partition: the decay of the one group whose leaves differ, against its own rule
        moved = {labels[i] for _, ls in steps for i, (e, _, _) in enumerate(ls) if float(np.linalg.norm(e)) > 0.05 * big}
        if len(moved) != 1:
            return head + f" (in the groups {', '.join(sorted(moved))})"
        (label,) = moved
        sub, where = rule.rules[label], f" (group {label!r})"
        others = {h: getattr(o, "lr", None) for h, o in rule.rules.items() if h != label}
        steps = [(t, [leaf for i, leaf in enumerate(ls) if labels[i] == label]) for t, ls in steps]
        head += where
    lr, wd, sched = getattr(sub, "lr", None), getattr(sub, "weight_decay", None), getattr(sub, "schedule", None)
    if not (isinstance(lr, float) and isinstance(wd, float)) or wd == 0 or lr == 0:
        return head + " (your step multiplies the params by 1 + k_t more than refopt's)"
    def lr_at(t):
        return lr * (1.0 if sched is None else float(sched(t)))

    independent = getattr(rule, "wd_mode", None) == "independent"    # AdamW's: gamma_t wd per step, not lr_t wd

    def ref_rate(t):
        return lr_at(t) / lr * wd if independent else lr_at(t) * wd

    forms = [("the decay has the opposite sign: x (1 + rho_t) in place of x (1 - rho_t)", lambda t: -ref_rate(t)),
             ("the decay is missing", lambda t: 0.0),
             ("the decay is applied twice", lambda t: 2 * ref_rate(t))]
    if independent:
        forms += [("the lr-independent decay is not scheduled: x (1 - wd) in place of x (1 - gamma_t wd)",
                   lambda t: wd),
                  ("the decay is multiplied by the lr (decoupled, lr_t wd) in place of the lr-independent gamma_t wd",
                   lambda t: lr_at(t) * wd)]
    else:
        forms += [("the decay uses the peak lr, not the scheduled lr_t = lr gamma_t", lambda t: lr * wd),
                  ("the decay is not multiplied by the lr: x (1 - wd)", lambda t: wd)]
        forms += [(f"the decay uses the lr of group {h!r} ({lr_h:g}) in place of its own group's ({lr:g})",
                   lambda t, lr_h=lr_h: lr_at(t) / lr * lr_h * wd)
                  for h, lr_h in others.items() if isinstance(lr_h, float) and lr_h != lr]
    for what, rho in forms:
        ok = True
        for t, ls in steps:
            for e, xo, xr in ls:
                want = -rho(t) * xo + ref_rate(t) * xr
                if float(np.linalg.norm(e - want)) > DECAY_FIT * max(float(np.linalg.norm(e)), 1e-300):
                    ok = False
        if ok:
            return f"{head}: {what}"
    ratio = np.array([k / ref_rate(t) for t, k in ks])
    if np.all(np.abs(ratio - 1) <= 10 * DECAY_FIT):
        return (f"{head}: refopt's decay term lr_t wd x is missing from your step at every step (with L2 decay in the "
                f"gradient: the term left out of one of the places your step uses the gradient, e.g. a look-ahead)")
    return head + f" ({ks[0][1] / ref_rate(ks[0][0]):.4g} x refopt's decay rate at step {ks[0][0]})"


WINDOW_DECAY = 5   # steps the decay fit reads (the two sides' params drift apart later)
DECAY_FIT = 1e-3   # relative: the fit is against the midpoint of params that drift apart by O(lr wd) a step


def _groups(rule, paths, leaves):
    from refopt.rules.partition import Partition
    if not isinstance(rule, Partition):
        return None
    try:
        return [rule.label_of(p, x) for p, x in zip(paths, leaves)]
    except (TypeError, ValueError, KeyError):
        return None


def _shape(rule, bad) -> tuple[str, str | None, str] | None:
    """(line, lead or None, kind) describing c_t and the cosines over the differing problems (kind:
    'constant', 'pattern', 'varying' or 'not parallel'). The updates are
    parallel on a leaf when its cosine is 1 at every step; the ratio is analysed on the parallel leaves
    when they are at least half (eps can bend the update of a leaf whose gradients are near eps)."""
    series = []     # (c over steps, cos over steps) per problem and leaf refopt moves
    for r in bad:
        c, cos = update_fit(r["ref"], r["other"], r["leaves"])
        for i in range(c.shape[1]):
            ok = np.isfinite(cos[:, i])
            same = np.all(np.abs(c[ok, i] - 1) <= 1e-12) and np.all(cos[ok, i] >= 1 - PARALLEL)
            if ok.any() and not same:      # a leaf whose updates agree says nothing about the difference
                series.append((c[:, i], cos[:, i]))
    if not series:
        return None
    par = [sc for sc in series if np.all(sc[1][np.isfinite(sc[1])] >= 1 - PARALLEL)]
    where = "" if len(par) == len(series) else f" on {len(par)} of {len(series)} leaves"
    if 2 * len(par) >= len(series):
        cs = np.concatenate([c[np.isfinite(c)] for c, _ in par])
        c0 = float(np.median(cs))
        if f"{c0:.6g}" == "1":      # parallel and equal to rounding: no scale to name (float32_rounding may)
            return (f"the updates are parallel (cosine 1){where} and equal to 6 digits (c_t = 1): no lr or scale "
                    f"differs", None, "constant")
        if c0 != 0 and np.all(np.abs(cs / c0 - 1) <= PATTERN):
            if abs(c0 + 1) <= PATTERN:
                return (f"the updates are parallel{where} with c_t = -1 at every step: the opposite sign",
                        "your update is refopt's with the opposite sign at every step (c_t = -1)", "constant")
            lr = getattr(rule, "lr", None)
            as_lr = f": an lr of {c0 * lr:.6g} in place of {lr:g}, or a constant factor" if isinstance(lr, float) \
                else ": a constant factor"
            return (f"the updates are parallel (cosine 1){where} with a constant ratio c_t = {c0:.6g}: an lr or a "
                    f"constant scale", f"your update is {c0:.6g} x refopt's at every step{where}{as_lr}"
                    f"{_named_constant(c0, rule)}", "constant")
        with np.errstate(all="ignore"):
            c_t = np.nanmedian(np.array([c for c, _ in par]), axis=0)
        head = (f"the updates are parallel (cosine 1){where} with a ratio c_t that varies with t: "
                + ", ".join(f"{v:.4g}" for v in c_t[:5]) + (" ..." if len(c_t) > 5 else ""))
        name = _pattern(c_t, rule)
        if name:
            return (f"{head}; {name}", f"{name} (the updates are parallel{where}; their ratio follows it at every step)",
                    "pattern")
        return f"{head}: a per-step scale (a schedule, a step counter, a norm)", None, "varying"
    lo = float(min(np.nanmin(cos) for _, cos in series))
    if _same_signs(bad):
        return (f"the updates are not parallel (cosine down to {lo:.6f}) but every entry moves with refopt's sign: "
                f"other magnitudes per entry (a normalisation, the denominator, eps, a sign-based step's scale)",
                None, "not parallel")
    return (f"the updates are not parallel (cosine down to {lo:.6f}) and some entries move against refopt's sign: "
            f"the direction differs (a formula or the state), not only a scale", None, "not parallel")


def _same_signs(bad) -> bool:
    """Every entry of every update moves with the sign of refopt's (where refopt's moves)."""
    for r in bad:
        for leaves in _steps(r["ref"], r["other"], r["leaves"]):
            for leaf in leaves:
                if leaf is None or not np.all(np.sign(leaf[3][leaf[1] != 0]) == np.sign(leaf[1][leaf[1] != 0])):
                    return False
    return True


SHAPE_FIT = 1e-9    # relative residual within which your step-1 update is a multiple of refopt's on a leaf


def _shape_functions(fi: int, fo: int, n: int) -> list[tuple[str, float]]:
    """(name, value) of the simple functions of a leaf's shape a scale is made of: fan_in, fan_out (refopt's
    ``x @ W`` layout, :func:`~refopt.rules.muon_shape.matrix_shape`), their max, min, ratios and the size,
    each to the powers 1/2, 1, -1/2 and -1, and the max(1, .) forms of the ratios."""
    mm = (max(fi, fo), min(fi, fo))
    out = []
    for name, q in (("fan_in", fi), ("fan_out", fo), ("max(fan_in, fan_out)", mm[0]), ("min(fan_in, fan_out)", mm[1]),
                    ("size", n)):
        out += [(f"sqrt({name})", math.sqrt(q)), (name, float(q)), (f"1/sqrt({name})", 1 / math.sqrt(q)),
                (f"1/{name}", 1 / q)]
    for name, q in (("fan_out/fan_in", fo / fi), ("fan_in/fan_out", fi / fo),
                    ("min(fan_in, fan_out)/max(fan_in, fan_out)", mm[1] / mm[0]),
                    ("max(1, fan_out/fan_in)", max(1.0, fo / fi)), ("max(1, fan_in/fan_out)", max(1.0, fi / fo))):
        out += [(f"sqrt({name})", math.sqrt(q)), (name, float(q))]
    return out


def _without_decay(rule):
    """The rule (or its base) with weight_decay 0, or None when it has no decay."""
    if isinstance(getattr(rule, "weight_decay", None), float) and rule.weight_decay > 0:
        return dataclasses.replace(rule, weight_decay=0.0)
    base = getattr(rule, "base", None)
    if hasattr(base, "init_leaf") and isinstance(getattr(base, "weight_decay", None), float) and base.weight_decay > 0:
        return dataclasses.replace(rule, base=dataclasses.replace(base, weight_decay=0.0))
    return None


def _rule_scale(rule):
    """The rule's own shape scale s(shape) where it has one (Muon's ``scale``), else None."""
    from refopt.rules.muon_shape import _SCALES, muon_scale

    scale = getattr(rule, "scale", None)
    if isinstance(scale, str) and scale in _SCALES:
        return lambda shape: muon_scale(shape, scale)
    return None


def _step1_ratios(rule, r) -> list | None:
    """Per leaf of one problem, at step 1 (the same params, gradient and initial state on both sides):
    (shape, r) with your update D'_1 = r D_1 (or, where the rule has a decay, your update less refopt's
    decay term = r (refopt's update without its decay)), or None when a differing leaf fits neither."""
    from refopt.crosscheck.run import trajectory
    from refopt.testing.adapters import RuleAdapter

    leaves = next(_steps(r["ref"], r["other"], r["leaves"], 1), None)
    if leaves is None or any(leaf is None for leaf in leaves):
        return None
    bare = _without_decay(rule)
    try:
        d0 = None if bare is None else [np.asarray(a, np.float64) - np.asarray(x, np.float64) for a, x in
                                        zip(trajectory(RuleAdapter(bare), r["leaves"], r["grads"][:1])[0].params[0],
                                            r["leaves"])]
    except (ValueError, TypeError):     # a rule that refuses weight_decay=0: no decay-free fit
        d0 = None
    out = []
    for i, (_, dr, _, do) in enumerate(leaves):
        fits = [(dr, np.zeros_like(dr))] + ([] if d0 is None else [(d0[i], dr - d0[i])])
        hit = None
        for j, (direction, decay) in enumerate(fits):
            u, v = (do - decay).ravel(), direction.ravel()
            nv = float(v @ v)
            if nv == 0 or not np.all(np.isfinite(u)):
                continue
            k = float(u @ v) / nv
            if float(np.linalg.norm(u - k * v)) <= SHAPE_FIT * max(float(np.linalg.norm(u)), 1e-300):
                hit = (k, j == 1)
                break
        if hit is None:
            if np.array_equal(do, dr):
                continue
            return None
        out.append((r["leaves"][i].shape, *hit))
    return out


def _fans(shape) -> tuple[int, int, int]:
    """(fan_in, fan_out, size) of a shape (:func:`~refopt.rules.muon_shape.matrix_shape`; a vector: (1, n, n))."""
    n = int(math.prod(shape))
    return (int(math.prod(shape[:-1])), int(shape[-1]), n) if len(shape) >= 2 else (1, n, n)


def _fit_shape_function(rows, names, any_constant: bool):
    """(name, k) of the first function f in ``names`` with v_i = k f(shape_i) for every (shape_i, v_i) of
    ``rows``, preferring k = 1 (any k only with ``any_constant``); None when none fits."""
    fans = [_fans(s) for s, _ in rows]
    if any(fi == 0 or fo == 0 for fi, fo, _ in fans):
        return None
    tables = [dict(_shape_functions(*f)) for f in fans]     # each row's f(shape), once
    best = None
    for name in names:
        vals = [v / table[name] for (_, v), table in zip(rows, tables)]
        c = float(np.median(vals))
        if np.all(np.abs(np.array(vals) / c - 1) <= PATTERN) and (abs(c - 1) <= PATTERN or any_constant):
            if abs(c - 1) <= PATTERN:
                return name, c
            best = best or (name, c)
    return best


def _shape_scale(rule, bad) -> str | None:
    """Your step-1 update a multiple r_i of refopt's on every leaf that differs (after removing refopt's own
    decay term where the rule has one), with r_i differing between leaves of different shapes and equal to
    k f(shape_i) for one simple function f of the shape (:func:`_shape_functions`): a scale that is another
    function of the shape. Needs leaves of at least two shapes that differ (three when k is not 1)."""
    rows = []
    for r in bad:
        got = _step1_ratios(rule, r)
        if got is None:
            return None
        rows += got
    rows = [(s, k, d) for s, k, d in rows if abs(k - 1) > 1e-12 and k > 0]
    shapes = {s for s, _, _ in rows}
    if len(shapes) < 2:
        return None
    ks = np.array([k for _, k, _ in rows])
    decayed = any(d for _, _, d in rows)
    what = "your update's direction (your update less refopt's decay term)" if decayed else "your update"
    if np.ptp(ks) <= PATTERN * float(np.max(ks)):
        return None if not decayed else (
            f"at step 1 {what} is {float(np.median(ks)):.6g} x refopt's on every leaf that differs, while the decay "
            f"term is the same: a constant scale of the direction only (an lr would scale the decay too)")
    names = [name for name, _ in _shape_functions(2, 3, 6)]
    if not all(len(s) >= 2 for s in shapes):       # vectors: no fan_in, fan_out; the size only
        names = [name for name in names if "fan" not in name]
    best = _fit_shape_function([(s, k) for s, k, _ in rows], names, len(shapes) >= 3)
    if best is None:
        return None
    name, c = best
    factor = name if abs(c - 1) <= PATTERN else f"{c:.6g} {name}"
    seen = sorted({(s, float(f"{k:.6g}")) for s, k, _ in rows})
    out = (f"at step 1 {what} is refopt's times {factor} on each leaf that differs ("
           f"{', '.join(f'{s}: {k:.6g}' for s, k in seen[:4])}{' ...' if len(seen) > 4 else ''}): a scale that is "
           f"another function of the shape")
    if "fan" in name:
        out += " (fan_in, fan_out: the (fan_in, fan_out) view of refopt's x @ W layout)"
    elif name in ("sqrt(size)", "1/sqrt(size)"):
        out += (" (sqrt(size) = ||a||_F / ||a||_rms: an RMS norm in one place and a Frobenius norm in another, or a "
                "mean in place of a sum)")
    own = _rule_scale(rule)
    if own is not None:
        implied = _fit_shape_function([(s, k * own(s)) for s, k, _ in rows], names, True)
        if implied is not None:
            fname, c2 = implied
            out += (f"; with the rule's scale {rule.scale!r} this makes your scale "
                    f"{fname if abs(c2 - 1) <= PATTERN else f'{c2:.6g} {fname}'}")
    return out
