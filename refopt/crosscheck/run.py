r"""Trajectories of any optimizer on a gradient sequence, and their step-by-step differences.

One code runs every optimizer refopt compares (:func:`trajectory`): a refopt rule
(:class:`~refopt.testing.adapters.RuleAdapter`), a peer's call (:func:`refopt.crosscheck.peers.preset_adapter`),
a user's implementation (:func:`refopt.testing.adapters.make_adapter`) or a convention variant, each as a
pure-step :class:`~refopt.testing.adapters.Adapter`. Every side starts from the same initial arrays; the
gradients are a recorded sequence (open loop, see :mod:`refopt.crosscheck.problems`) or a function of the
params evaluated along the run (the reference side, whose recorded gradients are then fed to the others).

:func:`figures` compares a trajectory with a reference one after every step t = 1..N, per array
(b the reference, a the other side, both taken in float64):

* ``abs``: max |a - b| over the array;
* ``rel``: that divided by max |b| over the array (a max-norm relative difference; elementwise relative
  errors are meaningless for entries that pass through zero); 0 where a = b, inf where b = 0 and a != b
  or where a difference is not finite;
* ``update``: ||Delta_a - Delta_b||_F / ||Delta_b||_F with Delta = x_t - x_{t-1} (each side its own
  previous params), used where the step itself is approximate (torch Muon's bfloat16);
* ``step``: the same over the whole tree (all arrays together), per step;
* the state entries both trajectories record, as ``abs`` and ``rel``.

The consumers read the summaries they need: the maximum over steps and arrays (:func:`compare`, the
cross-check's figures: a preset passes when every gated figure is within its tolerance,
:class:`refopt.crosscheck.presets.Tol`), the first step and array beyond a tolerance and the per-entry
state matching (:mod:`refopt.crosscheck.plugin`), the difference after the last step and the median
per-step difference (:mod:`refopt.crosscheck.divergences`).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

import numpy as np

from refopt.crosscheck import peers
from refopt.crosscheck.presets import Preset
from refopt.crosscheck.problems import closed_loop, lacks, make_problem, step_inputs

DTYPES = {"float64": np.float64, "float32": np.float32}


@dataclass
class Trajectory:
    """Params (and recorded state) after every step: params[t][i] is array i after step t+1;
    state[t] = {entry: [one array per params leaf]} (empty when no state is recorded)."""

    params: list = field(default_factory=list)
    state: list = field(default_factory=list)


def trajectory(adapter, leaves0, grads_or_fn, steps: int | None = None, state=None,
               paths=None, inputs=None) -> tuple[Trajectory, list]:
    """Step ``adapter`` (any :class:`~refopt.testing.adapters.Adapter`) from ``leaves0`` (a list of arrays).
    ``paths`` (the problem's leaf names, given where the peer picks its rule by name, or None): an adapter that
    can read names (``adapter.named``: refopt rules, oracles, torch optimizers) runs on the tree they name
    (:class:`~refopt.testing.adapters.Named`); the others keep the documented lists.

    ``grads_or_fn``: a list of gradient lists (one per step) or a function (params, t) -> gradient list
    evaluated along this run's own params (t = 1 first); ``steps``: how many steps (default: one per
    gradient list). ``state``: None (record none), ``'all'`` (every entry of ``adapter.state_arrays``) or
    a map {name: entry} (:func:`state_entry` resolves each entry). Every step gets fresh copies of the
    gradients and of the params it returned, so an implementation that writes its inputs in place changes
    nothing recorded. ``inputs``: the names of the step's inputs beyond the gradients to hand the adapter
    (``('value',)`` for a rule that needs the loss; None: those the adapter declares, ``adapter.inputs``, a
    refopt rule's or an oracle's), read off each step's
    :class:`~refopt.crosscheck.problems.Gradients` (ValueError when a step has none). Returns (the trajectory,
    the gradients used). Raises KeyError for an entry the
    adapter's state does not have, and whatever the adapter raises
    (:class:`~refopt.testing.adapters.UserCodeError` for a user's code)."""
    if steps is None:
        steps = len(grads_or_fn)
    x = [np.array(a, copy=True) for a in leaves0]
    shapes = [a.shape for a in x]
    if paths is not None and getattr(adapter, "named", False):
        from refopt.testing.adapters import Named

        adapter = Named(adapter, paths)
    s = adapter.init(x)
    inputs = tuple(getattr(adapter, "inputs", ()) if inputs is None else inputs)
    traj, used = Trajectory(), []
    for t in range(1, steps + 1):
        g = grads_or_fn(x, t) if callable(grads_or_fn) else grads_or_fn[t - 1]
        used.append(g)
        extra = step_inputs(g, inputs) if inputs else {}
        x, s = adapter.step(s, x, [np.array(a, copy=True) for a in g], **extra)
        x = [np.asarray(a) for a in x]
        traj.params.append([np.array(a, copy=True) for a in x])
        if state == "all":     # the entries with one array shaped like each params leaf
            traj.state.append({k: v for k, v in adapter.state_arrays(s).items() if _fits(v, shapes)})
        elif state:
            arrays = adapter.state_arrays(s)
            traj.state.append({name: state_entry(arrays, key, shapes) for name, key in state.items()})
    return traj, used


def last_name(path: str) -> str:
    """The last name in a state entry's path ('[0].mu' -> 'mu', 'base.m' -> 'm'; '' if none)."""
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path)
    return names[-1] if names else ""


def _fits(arrs, shapes, any_shape: bool = False, partial: bool = False) -> bool:
    if partial:      # an array for some leaves only (torch's Adafactor: row_var for matrices, variance for vectors)
        return len(arrs) == len(shapes) and any(a is not None for a in arrs)
    return len(arrs) == len(shapes) and all(a is not None and (any_shape or a.shape == s)
                                            for a, s in zip(arrs, shapes))


def state_entry(arrays: dict, key: str, shapes) -> list:
    """Entry ``key`` of an adapter's ``state_arrays`` holding one array per params leaf (refopt's layout):
    the entry of that name, else the first whose path ends in it (optax's ``[0].mu`` for ``mu``), preferring
    arrays shaped like the leaves; a named entry of other shapes (NovoGrad's 0-d ``v``, a factored moment)
    is taken when no leaf-shaped one has the name, and, last, one with arrays for some leaves only (None for
    the others: torch's Adafactor keeps ``row_var`` for its matrices only). Raises KeyError naming the
    entries there are."""
    for any_shape, partial in ((False, False), (True, False), (True, True)):
        if key in arrays and _fits(arrays[key], shapes, any_shape, partial):
            return arrays[key]
        for name, arrs in arrays.items():
            if last_name(name) == key and _fits(arrs, shapes, any_shape, partial):
                return arrs
    raise KeyError(f"the state has no entry {key!r} with one array per params leaf (entries: {sorted(arrays)})")


def refopt_trajectory(rule, leaves0, grads_or_fn, steps: int, fields=(), paths=None) -> tuple[Trajectory, list]:
    """Run the refopt ``rule`` from ``leaves0`` (a list of arrays) for ``steps`` steps (:func:`trajectory`),
    recording the state ``fields`` (refopt's names, e.g. ``'m'``, ``'base.v'``). Returns (trajectory,
    the gradients used)."""
    from refopt.testing.adapters import RuleAdapter

    return trajectory(RuleAdapter(rule), leaves0, grads_or_fn, steps, {f: f for f in fields} or None, paths)


def peer_trajectory(preset: Preset, leaves0, grads, dtype=None, paths=None, inputs=(),
                    steps: int | None = None) -> Trajectory:
    """Run the preset's peer (:func:`refopt.crosscheck.peers.preset_adapter`) from ``leaves0`` on the gradient
    lists ``grads`` or, closed loop, a gradient function run for ``steps`` steps (and the ``inputs`` the refopt
    rule takes, read off them), recording its state entries
    under refopt's names (``preset.state``). The arrays' dtype is the run's (``dtype`` is accepted for the
    callers that name it)."""
    return trajectory(peers.preset_adapter(preset), leaves0, grads, steps, state=preset.state or None, paths=paths,
                      inputs=inputs)[0]


def _rel(diff: float, scale: float) -> float:
    if diff == 0:
        return 0.0
    return diff / scale if scale > 0 else math.inf


def leaf_diff(a, b) -> tuple[float, float]:
    """(max |a - b|, that / max |b|) in float64, ``b`` the reference (same shapes); relative: 0 where a = b,
    inf where b = 0 and a != b or where the difference is not finite."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not b64.size:
        return 0.0, 0.0
    d = float(np.max(np.abs(a64 - b64)))
    if not math.isfinite(d):
        return d, math.inf
    return d, _rel(d, float(np.max(np.abs(b64))))


def entry_figures(ref_states: list, other_states: list, name: str, key: str):
    """(abs, rel), arrays of shape (steps, leaves), of the other side's state entry ``key`` against the
    reference's entry ``name`` (:func:`leaf_diff`; 0 where the reference has no array for a leaf, None or an
    empty one: Adafactor's unused factors, whatever the other side keeps there), or None when they cannot be
    compared (an entry missing, another number of leaves, another shape)."""
    n = min(len(ref_states), len(other_states))
    if not n:
        return None
    k = len(ref_states[0].get(name) or ())
    dabs, drel = np.zeros((n, k)), np.zeros((n, k))
    for t in range(n):
        ra, oa = ref_states[t].get(name), other_states[t].get(key)
        if ra is None or oa is None or len(ra) != len(oa) or len(ra) != k:
            return None
        for i, (a, b) in enumerate(zip(oa, ra)):
            if b is None or np.size(b) == 0:
                continue
            if a is None or np.shape(a) != np.shape(b):
                return None
            dabs[t, i], drel[t, i] = leaf_diff(a, b)
    return dabs, drel


@dataclass
class Figures:
    """The differences of a trajectory from a reference one (:func:`figures`): rows are steps, columns
    params leaves; ``step_rel`` (steps,) is the whole tree's update difference (nan where the reference
    did not move); ``state_abs`` / ``state_rel``: {entry: (steps, leaves)} for the entries both record."""

    params_abs: np.ndarray
    params_rel: np.ndarray
    update_rel: np.ndarray
    step_rel: np.ndarray
    state_abs: dict
    state_rel: dict

    def max(self, name: str) -> float:
        """The maximum over steps and leaves of ``params_abs``, ``params_rel`` or ``update_rel`` (0 if empty)."""
        return float(getattr(self, name).max(initial=0.0))

    def state_max(self, which: str = "rel") -> float | None:
        """The maximum over entries, steps and leaves of the state figures ('abs' or 'rel'); None if none."""
        arrs = [a for a in getattr(self, f"state_{which}").values() if a.size]
        return max(float(a.max()) for a in arrs) if arrs else None

    @property
    def final(self) -> float:
        """max over leaves of params rel after the last step."""
        return float(self.params_rel[-1].max(initial=0.0)) if len(self.params_rel) else 0.0

    @property
    def step(self) -> float:
        """The median over steps of ``step_rel`` (the steps where the reference moved; 0 if none)."""
        v = self.step_rel[~np.isnan(self.step_rel)]
        return float(np.median(v)) if v.size else 0.0

    def worst(self, paths) -> str:
        """'<path> @ step <t>' of the (first) largest params rel; '' when every one is 0."""
        if not self.params_rel.size or not self.params_rel.max() > 0:
            return ""
        t, i = np.unravel_index(int(np.argmax(self.params_rel)), self.params_rel.shape)
        return f"{paths[i]} @ step {t + 1}"

    def first(self, paths, tol: dict) -> tuple | None:
        """(step, leaf path, figure, value, tolerance) of the first step and leaf where params or update rel
        exceeds ``tol`` ({figure: rel}); None if none does."""
        keys = [(name, getattr(self, f"{name}_rel")) for name in ("params", "update")]
        for t in range(self.params_rel.shape[0]):
            for i in range(self.params_rel.shape[1]):
                for name, arr in keys:
                    if name in tol and not arr[t, i] <= tol[name]:
                        return (t + 1, paths[i], name, float(arr[t, i]), tol[name])
        return None


def figures(ref: Trajectory, other: Trajectory, leaves0) -> Figures:
    """The figures of the module docstring of ``other`` against ``ref``, both started from ``leaves0``, for
    the steps both have. An array whose shape differs from the reference's counts as inf."""
    n, k = min(len(ref.params), len(other.params)), len(leaves0)
    pabs, prel, urel, srel = np.zeros((n, k)), np.zeros((n, k)), np.zeros((n, k)), np.full(n, np.nan)
    prev_r, prev_o = list(leaves0), list(leaves0)
    for t in range(n):
        dus, drs = [], []
        for i in range(k):
            a = np.asarray(other.params[t][i], np.float64)
            b = np.asarray(ref.params[t][i], np.float64)
            if a.shape != b.shape:
                pabs[t, i] = prel[t, i] = urel[t, i] = math.inf
                continue
            pabs[t, i], prel[t, i] = leaf_diff(a, b)
            dr = b - np.asarray(prev_r[i], np.float64)
            du = (a - np.asarray(prev_o[i], np.float64)) - dr
            nd = float(np.linalg.norm(du))
            urel[t, i] = _rel(nd, float(np.linalg.norm(dr))) if math.isfinite(nd) else math.inf
            dus.append(du.ravel())
            drs.append(dr.ravel())
        if drs:
            nb = float(np.linalg.norm(np.concatenate(drs)))
            if nb > 0:
                srel[t] = float(np.linalg.norm(np.concatenate(dus))) / nb
        prev_r, prev_o = ref.params[t], other.params[t]
    sabs, sre = {}, {}
    if ref.state and other.state:
        for name in ref.state[0]:
            fig = entry_figures(ref.state, other.state, name, name) if name in other.state[0] else None
            if fig is not None:
                sabs[name], sre[name] = fig
    return Figures(pabs, prel, urel, srel, sabs, sre)


def compare(ref: Trajectory, peer: Trajectory, leaves0, paths) -> dict:
    """The cross-check's figures (the maxima over steps and arrays of the module docstring's figures, and
    where the worst params difference was). Raises ValueError when the peer returned another shape."""
    for xr, xp in zip(ref.params, peer.params):
        for i, (a, b) in enumerate(zip(xp, xr)):
            if a.shape != b.shape:
                raise ValueError(f"peer returned shape {a.shape} for {paths[i]}, refopt has {b.shape}")
    f = figures(ref, peer, leaves0)
    return {"params_abs": f.max("params_abs"), "params_rel": f.max("params_rel"), "update_rel": f.max("update_rel"),
            "state_abs": f.state_max("abs"), "state_rel": f.state_max("rel"), "worst": f.worst(paths)}


@dataclass
class Result:
    preset: str
    peer: str
    family: str
    problem: str
    steps: int
    dtype: str
    status: str                   # pass | fail | gap | caught | MISSED | skip
    params_abs: float | None = None
    params_rel: float | None = None
    update_rel: float | None = None
    state_abs: float | None = None
    state_rel: float | None = None
    tol: dict | None = None
    worst: str = ""
    message: str = ""
    rule: str = ""                # the refopt rule's class name

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "MISSED")

    def to_dict(self) -> dict:
        return asdict(self)


def check(figures: dict, tol: dict) -> list[str]:
    """The gated figures that exceed their tolerance, as messages (empty: pass)."""
    bad = []
    for key, limit in tol.items():
        v = figures.get(f"{key}_rel")
        if v is None:
            continue
        if not v <= limit:
            bad.append(f"{key} {v:.3g} > {limit:g}")
    return bad


def run_preset(preset: Preset, problem: str = "stream", steps: int = 50, dtype: str = "float64",
               seed: int = 0) -> Result:
    """Cross-check one preset on one problem. A missing peer gives status 'skip' with the reason."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    base = dict(preset=preset.name, peer=preset.peer, family=preset.family, problem=problem, steps=steps,
                dtype=dtype)
    tol = preset.tol.for_dtype(dtype, problem)
    if preset.make_rule is None:
        return Result(**base, status="gap", message=preset.gap or "")
    if preset.problems is not None and problem not in preset.problems:
        return Result(**base, status="skip", message=f"not meaningful on {problem}: {preset.problems_why}")
    if preset.dtypes is not None and dtype not in preset.dtypes:
        return Result(**base, status="skip", message=f"not meaningful in {dtype}: {preset.dtypes_why}")
    ok, why = peers.available(preset.peer)
    if not ok:
        return Result(**base, status="skip", message=why)
    rule = preset.make_rule()
    prob = make_problem(problem, DTYPES[dtype], seed, matrix_only=preset.matrix_only, full_batch=closed_loop(rule))
    base["rule"] = type(rule).__name__
    why = lacks(rule, problem)
    if why:
        return Result(**base, status="skip", message=why)
    from refopt.testing.adapters import reads_names

    names = prob.paths if reads_names(preset.factory) else None     # a peer that picks its rule by name
    ref, grads = refopt_trajectory(rule, prob.leaves, prob.grad, steps, tuple(preset.state), names)
    peer = peer_trajectory(preset, prob.leaves, prob.grad if closed_loop(rule) else grads, DTYPES[dtype], names,
                           tuple(rule.inputs), steps)
    fig = compare(ref, peer, prob.leaves, prob.paths)
    bad = check(fig, tol)
    if preset.gap:
        status, msg = "gap", preset.gap
    elif preset.expect_fail:
        status, msg = ("caught", "; ".join(bad)) if bad else ("MISSED", "a wrong preset passed: tolerance too loose")
    else:
        status, msg = ("fail", "; ".join(bad)) if bad else ("pass", "")
    return Result(**base, status=status, tol=tol, message=msg, **fig)


def run_all(presets, problems=("stream",), steps: int = 50, dtype: str = "float64", seed: int = 0) -> list[Result]:
    return [run_preset(p, prob, steps, dtype, seed) for p in presets for prob in problems]


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.2e}"


def table(results: list[Result]) -> str:
    """A plain-text table of the results."""
    head = ["rule", "peer", "preset", "problem", "steps", "dtype", "params abs", "params rel", "update rel",
            "state rel", "tolerance", "status"]
    rows = []
    for r in results:
        tol = ", ".join(f"{k}<={v:g}" for k, v in (r.tol or {}).items())
        rows.append([r.rule or r.family, r.peer, r.preset, r.problem, str(r.steps), r.dtype, _fmt(r.params_abs), _fmt(r.params_rel),
                     _fmt(r.update_rel), _fmt(r.state_rel), tol or "-", r.status])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    notes = [f"  {r.preset} [{r.problem}]: {r.status}: {r.message}" for r in results if r.message]
    if notes:
        lines += ["", "notes:"] + notes
    return "\n".join(lines)
