r"""Run refopt and a peer on identical inputs and compare them step by step.

Both sides start from the same initial arrays and receive the same gradient sequence (open loop, see
:mod:`refopt.crosscheck.problems`). After every step t = 1..N the params (and the state entries the
preset maps) are compared array by array:

* ``abs``: max |peer - refopt| over the array;
* ``rel``: that divided by max |refopt| over the array (a max-norm relative difference; elementwise
  relative errors are meaningless for entries that pass through zero);
* ``update``: ||Delta_peer - Delta_refopt||_F / ||Delta_refopt||_F with Delta = x_t - x_{t-1} (each side
  its own previous params), used where the step itself is approximate (torch Muon's bfloat16).

Each figure is the maximum over steps and arrays. A preset passes when every gated figure is within its
tolerance (:class:`refopt.crosscheck.presets.Tol`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from refopt.crosscheck import peers
from refopt.crosscheck.presets import Preset
from refopt.crosscheck.problems import make_problem

DTYPES = {"float64": np.float64, "float32": np.float32}


@dataclass
class Trajectory:
    """Params (and mapped state) after every step: params[t][i] is array i after step t+1."""

    params: list = field(default_factory=list)
    state: list = field(default_factory=list)      # state[t] = {field: [arrays]}


def refopt_trajectory(rule, leaves0, grads_or_fn, steps: int, fields=()) -> tuple[Trajectory, list]:
    """Run ``rule`` from ``leaves0`` (a list of arrays, a refopt pytree) for ``steps`` steps.

    ``grads_or_fn``: a list of gradient lists (one per step) or a function (leaves, t) -> gradient list
    evaluated along refopt's own trajectory. Returns (trajectory, the gradients used)."""
    import refopt
    from refopt import tree as T

    x = [np.array(a, copy=True) for a in leaves0]
    state = refopt.init(rule, x)
    traj, used = Trajectory(), []
    for t in range(1, steps + 1):
        g = grads_or_fn(x, t) if callable(grads_or_fn) else grads_or_fn[t - 1]
        used.append(g)
        x, state = refopt.update(rule, state, x, g)
        traj.params.append([a.copy() for a in x])
        if fields:
            leaf_states = T.flatten_up_to(T.structure(x), state.leaves)
            traj.state.append({f: [np.array(_field(s, f)) for s in leaf_states] for f in fields})
    return traj, used


def _field(s, name: str):
    for part in name.split("."):
        s = getattr(s, part)
    return s


def peer_trajectory(preset: Preset, leaves0, grads, dtype) -> Trajectory:
    """Run the preset's peer from ``leaves0`` on the gradient lists ``grads`` (one list per step)."""
    runner = peers.adapter(preset.peer).make(preset, [np.array(a, copy=True) for a in leaves0], dtype)
    traj = Trajectory()
    for g in grads:
        runner.step([np.array(a, copy=True) for a in g])
        traj.params.append(runner.get_params())
        if preset.state:
            traj.state.append(runner.get_state())
    return traj


def _rel(diff: float, scale: float) -> float:
    if diff == 0:
        return 0.0
    return diff / scale if scale > 0 else math.inf


def compare(ref: Trajectory, peer: Trajectory, leaves0, paths) -> dict:
    """The figures of the module docstring (and where the worst params difference was)."""
    out = {"params_abs": 0.0, "params_rel": 0.0, "update_rel": 0.0, "state_abs": None, "state_rel": None,
           "worst": ""}
    prev_r = list(leaves0)
    prev_p = list(leaves0)
    for t, (xr, xp) in enumerate(zip(ref.params, peer.params), start=1):
        for i, (a, b) in enumerate(zip(xp, xr)):
            if a.shape != b.shape:
                raise ValueError(f"peer returned shape {a.shape} for {paths[i]}, refopt has {b.shape}")
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            d = float(np.max(np.abs(a64 - b64))) if a.size else 0.0
            r = _rel(d, float(np.max(np.abs(b64))) if b.size else 0.0)
            if r > out["params_rel"]:
                out["worst"] = f"{paths[i]} @ step {t}"
            out["params_abs"] = max(out["params_abs"], d)
            out["params_rel"] = max(out["params_rel"], r)
            du_r = b64 - prev_r[i].astype(np.float64)
            du_p = a64 - prev_p[i].astype(np.float64)
            out["update_rel"] = max(out["update_rel"],
                                    _rel(float(np.linalg.norm(du_p - du_r)), float(np.linalg.norm(du_r))))
        prev_r, prev_p = xr, xp
    for sr, sp in zip(ref.state, peer.state):
        for f in sr:
            for i, (a, b) in enumerate(zip(sp[f], sr[f])):
                a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
                d = float(np.max(np.abs(a64 - b64))) if a64.size else 0.0
                r = _rel(d, float(np.max(np.abs(b64))) if b64.size else 0.0)
                out["state_abs"] = max(out["state_abs"] or 0.0, d)
                out["state_rel"] = max(out["state_rel"] or 0.0, r)
    return out


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
    ok, why = peers.available(preset.peer)
    if not ok:
        return Result(**base, status="skip", message=why)
    prob = make_problem(problem, DTYPES[dtype], seed, matrix_only=preset.matrix_only)
    rule = preset.make_rule()
    base["rule"] = type(rule).__name__
    ref, grads = refopt_trajectory(rule, prob.leaves, prob.grad, steps, tuple(preset.state))
    peer = peer_trajectory(preset, prob.leaves, grads, DTYPES[dtype])
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
