r"""Which variant of the rule explains an implementation's numbers, judged on the earliest differing steps.

:func:`rank` runs every diagnosis variant of the rule (:func:`refopt.crosscheck.variants.variants`: the
conventions file's named ones and the generated ones) on the same gradients as the implementation and
measures, per problem p, its distance to the implementation (the max over leaves of the params rel, or of
the update rel for the bfloat16 tier; on a problem where the params agree and only the state differs, an
average or an EMA kept beside the iterate, the max of the state rel of the paired fields):

* over the whole run, ``full_p``: the variant **reproduces** the numbers when ``full_p`` is within the
  tier's tolerance on every problem and, on the problems where the rule differs, at least ``factor`` times
  (100; 5 for the bfloat16 tier) below the rule's own distance;
* over the **window** of the earliest differing steps, steps 1 .. t0_p + 2 where t0_p is the first step the
  rule differs on p: the ratio ``q_p = d_p(variant) / d_p(rule)``. The variant's **closeness** is the worst
  (largest) q_p over the problems where the rule differs, and it is **clearly closer** than the rule when
  that is at most 1/2 and it agrees (within the tolerance) on every problem where the rule agrees.

Windows keep a difference's amplification over 50 steps out of the ranking, and taking the worst problem,
not the maximum of the raw distances, keeps one problem's scale from choosing the lead: a variant is a lead
only when it is closer on every differing problem. A variant that cannot run on a problem (it raises) is
reported in :attr:`Ranking.not_run` with the error, never dropped silently.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from refopt.crosscheck.run import entry_figures, figures, trajectory

__all__ = ["Diagnosis", "Ranking", "rank", "state_distance", "CLEARLY", "WINDOW"]

CLEARLY = 0.5   # a lead's distance on the window is at most this fraction of the rule's on every differing problem
WINDOW = 2      # steps after the first differing one in the window


@dataclass
class Diagnosis:
    name: str
    detail: str
    distance: float          # the worst over problems of the full-run distance
    reproduces: bool
    closeness: float = math.inf   # the worst over differing problems of (window distance / the rule's)

    @property
    def clearly_closer(self) -> bool:
        return self.closeness <= CLEARLY


@dataclass
class Ranking:
    diagnosis: list = field(default_factory=list)     # Diagnosis, reproducing first, then by closeness
    not_run: list = field(default_factory=list)       # (variant name, problem, error text)


def _window(first: int | None, n: int) -> int:
    return n if first is None else min(n, first + WINDOW)


def rank(rule, runs: list, metric: str, limit: float, factor: float) -> Ranking:
    """Run and rank the variants of ``rule``. ``runs``: per problem a dict with prob (the problem), grads,
    other (the implementation's trajectory), dist (the rule's per-step distance, (steps,)), first (the
    rule's first differing step or None) and agree, and on a problem where only the state differs
    state_only (the distances are then of the paired state fields, :func:`state_distance`, and limit
    that tier's state tolerance); ``metric``: 'params_rel' or 'update_rel'; ``limit``: the tier's
    tolerance of that figure."""
    from refopt.crosscheck.variants import variants

    out = Ranking()
    for v in variants(rule):
        full, close, agree_ok, factor_ok = 0.0, 0.0, True, True
        try:
            dists = [_distance(v, r, metric) for r in runs]
        except _NotRun as e:
            out.not_run.append((v.name, e.problem, e.text))
            continue
        within = True
        for r, d in zip(runs, dists):
            worst = float(d.max(initial=0.0))
            full = max(full, worst)
            within = within and worst <= r.get("limit", limit)
            if r["agree"]:
                agree_ok = agree_ok and worst <= limit
                continue
            w = _window(r["first"], len(d))
            mine, ref = float(d[:w].max(initial=0.0)), float(r["dist"][:w].max(initial=0.0))
            close = max(close, mine / ref if ref > 0 else (0.0 if mine == 0 else math.inf))
            factor_ok = factor_ok and worst * factor <= float(r["dist"].max(initial=0.0))
        out.diagnosis.append(Diagnosis(v.name, v.detail, full, agree_ok and factor_ok and within,
                                       close if agree_ok else math.inf))
    out.diagnosis.sort(key=lambda d: (not d.reproduces, d.closeness, d.distance))
    return out


class _NotRun(Exception):
    def __init__(self, problem: str, text: str):
        super().__init__(text)
        self.problem, self.text = problem, text


def state_distance(traj, other, pairs: dict) -> np.ndarray:
    """Per step, the max over leaves and over the paired state fields (``pairs`` {field: (the
    implementation's entry or None, ...)}) of the state rel of ``traj`` against the implementation's
    trajectory ``other``; inf at every step when ``traj`` has no comparable field of that name."""
    n = min(len(traj.state), len(other.state))
    d = np.zeros(n)
    for f, (key, *_) in pairs.items():
        if key is None:
            continue
        fig = entry_figures(traj.state, other.state, f, key)
        if fig is None:
            return np.full(n, math.inf)
        d = np.maximum(d, fig[1].max(axis=1, initial=0.0))
    return d


def _distance(v, r, metric: str) -> np.ndarray:
    """The variant's per-step distance to the implementation on one problem (max over leaves): of the
    params (``metric``), or of the state on a problem where only the state differs."""
    try:
        with warnings.catch_warnings():   # e.g. a Partition variant with one group empty on a problem
            warnings.simplefilter("ignore")
            vr, _ = trajectory(v.make(), r["prob"].leaves, r["grads"], state="all" if r.get("state_only") else None,
                               paths=r.get("names"))
    except Exception as e:  # noqa: BLE001 - reported in Ranking.not_run (and by --debug), not swallowed
        raise _NotRun(r["prob"].name, f"{type(e).__name__}: {e}") from None
    with np.errstate(all="ignore"):     # a variant that runs into a NaN or inf is far (inf), not a warning
        if r.get("state_only"):
            return state_distance(vr, r["other"], r["state"])
        return getattr(figures(vr, r["other"], r["prob"].leaves), metric).max(axis=1, initial=0.0)
