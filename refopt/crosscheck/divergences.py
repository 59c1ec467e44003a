r"""The divergence atlas: where the major implementations of an optimizer disagree, measured live
(issue 15; docs/divergences.md).

Each :class:`~refopt.crosscheck.atlas.Entry` is one known disagreement between implementations
(torch.optim, optax, facebookresearch/schedulefree, and a few codes that are not installable here,
restated by refopt and marked as such). :func:`run_entry` runs every side on one gradient stream (the
seeded ``stream`` problem of :mod:`refopt.crosscheck.problems`, float64, 50 steps, open loop: every side
gets the same gradients) and reports

* the **differences** between the sides (:class:`~refopt.crosscheck.atlas.Figure`): each is measured in
  that run and checked against a bound that says the divergence still exists (``kind='min'``: at least
  this large) or that two sides still agree (``kind='max'``);
* for each **side** (:class:`~refopt.crosscheck.atlas.Side`), the refopt configuration that reproduces
  it and the measured reproduction error, gated at the tolerance of the existing presets
  (:mod:`refopt.crosscheck.presets`: ``EXACT`` 1e-12 in float64 where the side computes in float64,
  ``OPTAX_F32_WARMUP`` 1e-6 where optax computes a schedule in float32, ``MUON_TORCH_BF16`` where torch
  runs Newton-Schulz in bfloat16). A side without an installable peer is *restated*: refopt's
  configuration stands in for it (checked, where one exists, against an independent restatement written
  from the other code's equations).

Figures (:func:`refopt.crosscheck.run.figures`, maximum over the arrays):

* ``final``: max |a - b| / max |b| over each array after the last step (b the second side);
* ``params``: the same, maximum over all steps;
* ``update``: max over steps of ||Delta_a - Delta_b||_F / ||Delta_b||_F, Delta = x_t - x_{t-1};
* ``step``: the median over steps of ||Delta_a - Delta_b||_F / ||Delta_b||_F over the whole tree (all arrays
  together): the steady per-step relative difference of the update;
* ``abs``: max |a - b| over all steps and arrays (where the reference side is exactly zero).

An entry's status is ``reproduced`` (every side reproduced and every figure within its bound),
``changed`` (a figure or a side is out of bounds: a peer changed, update the atlas) or ``skipped`` (a
peer is missing; the reason names the install command). Nothing is hard-coded: every printed figure
comes from the run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import metadata
from typing import Callable

import numpy as np

from refopt.crosscheck import peers
from refopt.crosscheck.atlas import (SEED, STEPS, Entry, Figure, Pair, Side, _expr, _p, _preset, _rules,
                                     _torch_averaged, _torch_clipped, _torch_lambda_lr, _torch_subclass, peer_side,
                                     restated_side)
from refopt.crosscheck.presets import ALL_PEERS, EXACT, PRESETS, Preset
from refopt.crosscheck.problems import make_problem
from refopt.crosscheck.run import Trajectory, figures, trajectory

#: the distributions whose versions are recorded (the ``peers`` extra pins them)
VERSIONED = ("torch", "jax", "jaxlib", "optax", "schedulefree", "prodigyopt", "dadaptation", "pytorch-optimizer",
             "heavyball", "kron-torch", "momo-opt")


def versions() -> dict:
    """{peer (the distribution's name with '_' for '-'): installed version or None} for the peers (and their
    jax/jaxlib)."""
    out = {}
    for name in VERSIONED:
        try:
            out[name.replace("-", "_")] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name.replace("-", "_")] = None
    return out


# ---------------------------------------------------------------------------------------------------
@dataclass
class SideResult:
    label: str
    impl: str
    peer: str | None
    restated: bool
    refopt: str
    tolerance: dict
    tolerance_name: str
    measured: dict
    ok: bool
    source: str = ""
    checked_against: str = ""


@dataclass
class EntryResult:
    name: str
    title: str
    status: str                     # reproduced | changed | skipped
    peers: dict                     # {peer: version}
    reason: str = ""
    differences: list = field(default_factory=list)
    sides: list = field(default_factory=list)
    follows: str = ""
    reference: str = ""
    problem: str = ""

    def to_dict(self) -> dict:
        """A JSON-safe dict (a non-finite figure, e.g. a relative difference to an all-zero array, becomes
        the string 'inf' or 'nan')."""
        from dataclasses import asdict

        def safe(o):
            if isinstance(o, float) and not math.isfinite(o):
                return str(o)
            if isinstance(o, dict):
                return {k: safe(v) for k, v in o.items()}
            if isinstance(o, (list, tuple)):
                return [safe(v) for v in o]
            return o
        return safe(asdict(self))


# ---------------------------------------------------------------------------------------------------
def _run(obj, leaves0, grads, observe: str = "params", key: str | None = None, paths=None) -> Trajectory:
    """The trajectory of ``obj`` (a refopt rule or an Adapter) on ``grads``: its params, or (``observe``) its
    state entry ``key`` (default: ``observe``) as the params; ``paths``: the leaf names where the sides pick
    their rule by name (:func:`refopt.crosscheck.run.trajectory`)."""
    from refopt.core import Rule
    from refopt.testing.adapters import RuleAdapter

    adapter = RuleAdapter(obj) if isinstance(obj, Rule) else obj
    if observe == "params":
        return trajectory(adapter, leaves0, grads, paths=paths)[0]
    traj, _ = trajectory(adapter, leaves0, grads, state={observe: key or observe}, paths=paths)
    return Trajectory(params=[s[observe] for s in traj.state])


def _run_peer(side: Side, leaves0, grads, paths=None) -> Trajectory:
    adapter = side.make_peer() if side.make_peer is not None else peers.preset_adapter(side.preset)
    return _run(adapter, leaves0, grads, side.observe, side.preset.state.get(side.observe), paths)


def _figures(a: Trajectory, b: Trajectory, leaves0, paths) -> dict:
    """The module docstring's figures of ``a`` against ``b`` (``paths``: the arrays' names)."""
    f = figures(b, a, leaves0)
    return {"final": f.final, "params": f.max("params_rel"), "update": f.max("update_rel"), "step": f.step,
            "abs": f.max("params_abs")}


def _gate(figs: dict, tol: dict) -> bool:
    return all(figs.get(k, 0.0) <= v for k, v in tol.items() if k in ("params", "update", "final", "abs"))


def _problem(entry: Entry):
    if entry.leaves is not None:
        return entry.leaves()
    prob = make_problem(entry.problem, np.float64, SEED, matrix_only=entry.matrix_only)
    x = [a.copy() for a in prob.leaves]
    grads = [prob.grad(x, t) for t in range(1, STEPS + 1)]      # the stream ignores x: one stream for all
    return prob.paths, prob.leaves, grads


def run_entry(entry: Entry) -> EntryResult:
    """Run every side of ``entry`` on its gradient stream; measure its pairs and the reproductions."""
    vers = versions()
    res = EntryResult(entry.name, entry.title, "reproduced", {p: vers.get(p) for p in entry.peers},
                      follows=entry.follows, reference=entry.reference,
                      problem=f"{entry.problem if entry.leaves is None else 'own'} float64, {STEPS} steps, "
                              f"seed {SEED}")
    missing = []
    for p in entry.peers:
        ok, why = peers.available(p)
        if not ok:
            missing.append(why)
    if missing:
        res.status, res.reason = "skipped", "; ".join(missing)
        return res
    paths, leaves0, grads = _problem(entry)
    names = paths if entry.named else None
    trajs, ok_all = {}, True
    for side in entry.sides:
        ref = _run(side.make_refopt(), leaves0, grads, side.observe, paths=names)
        if side.restated:
            other = _run(side.oracle(), leaves0, grads, paths=names) if side.oracle else None
            checked = "an independent restatement of its equations" if side.oracle else ""
        else:
            other = _run_peer(side, leaves0, grads, names)
            checked = f"{side.peer} {vers.get(side.peer)}"
        if other is not None:
            figs = _figures(other, ref, leaves0, paths)
            ok = _gate(figs, side.tol)
        else:
            figs, ok = {}, True
        ok_all &= ok
        trajs[side.label] = other if (other is not None and not side.restated) else ref
        res.sides.append(SideResult(side.label, side.impl, side.peer, side.restated, side.refopt, dict(side.tol),
                                    side.tol_name, figs, ok, side.source, checked))
    for pair in entry.pairs:
        figs = _figures(trajs[pair.a], trajs[pair.b], leaves0, paths)
        v = figs[pair.figure]
        ok = v >= pair.bound if pair.kind == "min" else v <= pair.bound
        ok_all &= ok
        res.differences.append(Figure(f"{pair.a} vs {pair.b}", pair.figure, v, pair.bound, pair.kind, ok, pair.what))
    if entry.extra is not None:
        for f in entry.extra():
            ok_all &= f.ok
            res.differences.append(f)
    res.status = "reproduced" if ok_all else "changed"
    return res


# ---------------------------------------------------------------------------------------------------
# the entries
def _registered() -> tuple:
    """The entry builders of every conventions file (:mod:`refopt.conventions`, ``atlas=``), in file order."""
    from refopt.conventions import registry
    return tuple(make for c in registry().values() for make in c.atlas)


#: the atlas's entry builders, () -> Entry, gathered from the conventions files
ENTRIES: tuple[Callable[[], Entry], ...] = _registered()


def entries() -> list[Entry]:
    """All the atlas's entries, in order."""
    return [make() for make in ENTRIES]


def select(against: str = "all") -> list[Entry]:
    """The entries involving the peer ``against`` ('all': every entry, the restated-only ones included).

    Raises: ValueError for an unknown peer."""
    if against != "all" and against not in ALL_PEERS:
        raise ValueError(f"--against must be one of {['all', *ALL_PEERS]}, got {against!r}")
    return [e for e in entries() if against == "all" or against in e.peers]


def run_all(against: str = "all") -> list[EntryResult]:
    """:func:`run_entry` for every entry of :func:`select` (``against``). Raises: ValueError for an unknown
    peer. The peers' jit compilations dominate: about 40 s of CPU for all entries."""
    return [run_entry(e) for e in select(against)]


# ---------------------------------------------------------------------------------------------------
def _fmt_tol(tol: dict) -> str:
    return ", ".join(f"{k} <= {v:g}" for k, v in tol.items())


def report(results: list[EntryResult]) -> str:
    """The atlas as plain text: per entry, the measured differences and each side's refopt preset."""
    vers = versions()
    lines = ["refopt divergence atlas: float64, 50 steps, the seeded gradient stream; peers: "
             + ", ".join(f"{k} {v or 'not installed'}" for k, v in vers.items()), ""]
    for r in results:
        lines.append(f"[{r.status}] {r.name}: {r.title}")
        if r.status == "skipped":
            lines += [f"    skipped: {r.reason}", ""]
            continue
        lines.append(f"    peers: {', '.join(f'{k} {v}' for k, v in r.peers.items()) or 'none (restated only)'}; "
                     f"problem: {r.problem}")
        lines.append("    measured differences:")
        for f in r.differences:
            rel = ">=" if f.kind == "min" else "<="
            mark = "ok" if f.ok else "NO LONGER"
            lines.append(f"      {f.between}: {f.figure} {f.value:.3g}  (expected {rel} {f.bound:g}: {mark})"
                         + (f"  -- {f.what}" if f.what else ""))
        lines.append("    sides (each reproduced by its refopt preset):")
        for s in r.sides:
            tag = "restated, refopt stands in" if s.restated else s.peer
            lines.append(f"      {s.label} [{tag}]: {s.impl}")
            lines.append(f"          refopt: {s.refopt}")
            if s.measured:
                fig = ", ".join(f"{k} {v:.2e}" for k, v in s.measured.items() if k in s.tolerance)
                lines.append(f"          vs {s.checked_against}: {fig} ({s.tolerance_name}: {_fmt_tol(s.tolerance)})"
                             f" -> {'reproduced' if s.ok else 'NOT REPRODUCED'}")
            elif s.restated:
                lines.append("          (refopt's restatement stands in for this side; no peer to check it against)")
            if s.source:
                lines.append(f"          follows: {s.source}")
        lines.append(f"    which side: {r.follows}")
        lines.append(f"    reference: {r.reference}")
        lines.append("")
    counts = {s: sum(r.status == s for r in results) for s in ("reproduced", "changed", "skipped")}
    lines.append(", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return "\n".join(lines)
