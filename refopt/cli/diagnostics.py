"""``refopt train --diagnostics``: per-parameter-group ELR, AUS, weight RMS and update RMS of every step.

Columns added to metrics.csv (GROUP: the Partition label, e.g. ``hidden`` / ``other``, or ``all`` for a
rule that is not a Partition), computed by :func:`refopt.diagnostics.group_metrics` from the weights
before the step w_t and after it, over each group's arrays taken together:

    elr[GROUP]   = lr_t ||U||_F / ||W||_F        (U = (w_{t+1} - w_t) / lr_t: the whole step, decay included)
    aus[GROUP]   = || N(w_{t+1}) - N(w_t) ||_F   (angular update size, N(v) = v/||v||)
    w_rms[GROUP] = ||w_t||_RMS,  u_rms[GROUP] = ||U||_RMS

A Covariant group logs elr = its lr_t exactly. Cost: one copy of the params and a few passes over them per
step; nothing when the flag is off. :func:`plot` writes diagnostics.png.
"""
from __future__ import annotations

from refopt import diagnostics as D
from refopt import tree as T
from refopt.core import Rule

METRICS = ("elr", "aus", "w_rms", "u_rms")
#: the panel titles of diagnostics.png, spelled out for a reader without the code
TITLES = {"elr": "ELR: effective learning rate, lr ||U|| / ||w||", "aus": "AUS: angular update size of w / ||w||",
          "w_rms": "RMS of the weights w", "u_rms": "RMS of the update U"}


class Diagnostics:
    """Per-step group metrics for :func:`refopt.cli.train.fit`: ``snapshot(params)`` before the in-place
    update, ``row(step, before, params, state, lrs)`` after it, ``lrs`` the ``{group: lr_t}`` that
    ``refopt.update_`` reported in ``info["lr"]`` (a dict of the metrics.csv columns)."""

    def __init__(self, rule: Rule):
        self.rule = rule
        self.labels = None

    def snapshot(self, params):
        return T.copy(params)

    def row(self, step: int, before, params, state, lrs: dict) -> dict[str, float]:
        if self.labels is None:
            self.labels = D.group_labels(state, params)
        return D.group_metrics(before, params, lrs, self.labels)


def columns(rows) -> list[str]:
    """The diagnostics columns present in ``rows``, grouped by metric."""
    groups = sorted({k[k.index("[") + 1:-1] for r in rows for k in r if k.startswith("elr[")})
    return [f"{m}[{g}]" for m in METRICS for g in groups]


def plot(path: str, rows, title: str) -> None:
    """diagnostics.png: one panel per metric, one line per group, against the step (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = columns(rows)
    fig, axs = plt.subplots(1, 4, figsize=(16, 3.8), dpi=90)
    steps = [r["step"] for r in rows if "elr[" + cols[0][4:] in r] if cols else []
    for ax, m in zip(axs, METRICS):
        values = []
        for c in (c for c in cols if c.startswith(m + "[")):
            ys = [r[c] for r in rows if c in r]
            values += [y for y in ys if y > 0]
            ax.plot(steps, ys, lw=1.2, label=c)
        ax.set_title(TITLES[m], fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(m)
        if values and max(values) > 3 * min(values):   # a log axis only where the values span a range
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
