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
#: the four panels of diagnostics.png: ELR, the ratio AUS / ELR, the weights' RMS, the update's RMS
PANELS = ("elr", "aus/elr", "w_rms", "u_rms")
#: the panel titles of diagnostics.png (matplotlib mathtext), spelled out for a reader without the code
TITLES = {"elr": "effective learning rate\n" r"$\mathrm{ELR} = \mathrm{lr}_t\,\|U\| / \|w\|$",
          "aus/elr": "angular update size over ELR\n" r"$\mathrm{AUS}/\mathrm{ELR} \approx |\sin\angle(\Delta, w)|$",
          "w_rms": "size of the weights\n" r"$\mathrm{RMS}(w)$",
          "u_rms": "size of the update\n" r"$\mathrm{RMS}(U)$, $U = \Delta / \mathrm{lr}_t$"}
#: the footnote of diagnostics.png: every symbol of the titles, and what is not plotted
LEGEND_TEXT = (
    r"$w$: a group's weights before the step (its arrays as one vector); $\Delta = w_{t+1} - w_t$: the whole "
    r"step (weight decay included); $\mathrm{lr}_t$: the group's learning rate at step $t$; "
    r"$\|\cdot\|$: Frobenius norm; $\mathrm{RMS}(x) = \|x\| / \sqrt{n}$." "\n"
    r"$\mathrm{AUS} = \|\,w_{t+1}/\|w_{t+1}\| - w_t/\|w_t\|\,\|$ (angular update size, post 000). "
    r"AUS $\approx$ ELR when the step is orthogonal to $w$ (then AUS / ELR $\approx 1$, and the two curves "
    r"would coincide); AUS / ELR < 1 when part of the step scales $w$ (weight decay, a growing $\|w\|$)." "\n")


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


def series(rows) -> tuple[dict[str, dict[str, tuple[list, list]]], list[int]]:
    """The curves of diagnostics.png: ``({panel: {group: (steps, values)}}, the steps left out)``.

    panels: :data:`PANELS`; ``aus/elr`` is ``aus[G] / elr[G]`` (NaN where elr[G] = 0). A step whose
    ``lr[G]`` is 0 (a schedule's last step, e.g. cosine or WSD decayed to 0) moves nothing: elr, aus and
    u_rms are 0 there by definition (U = Δ / lr_t is undefined), so every panel but w_rms shows NaN (a gap)
    at that step, and the step is listed. Groups come from the ``elr[G]`` columns."""
    groups = sorted({c[4:-1] for c in columns(rows) if c.startswith("elr[")})
    data = {p: {} for p in PANELS}
    skipped = set()
    nan = float("nan")
    for g in groups:
        rs = [r for r in rows if f"elr[{g}]" in r]
        steps = [r["step"] for r in rs]
        still = [r.get(f"lr[{g}]", nan) == 0 for r in rs]
        skipped.update(s for s, z in zip(steps, still) if z)
        for p in PANELS:
            ys = []
            for r, z in zip(rs, still):
                if p == "w_rms":
                    ys.append(r[f"w_rms[{g}]"])
                elif z:
                    ys.append(nan)
                elif p == "aus/elr":
                    e = r[f"elr[{g}]"]
                    ys.append(r[f"aus[{g}]"] / e if e > 0 else nan)
                else:
                    ys.append(r[f"{p}[{g}]"])
            data[p][g] = (steps, ys)
    return data, sorted(skipped)


def plot(path: str, rows, title: str) -> None:
    """diagnostics.png: the panels of :data:`PANELS` (curves from :func:`series`), one line per group
    against the step; one legend of the groups below the panels and a footnote defining every symbol."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data, skipped = series(rows)
    fig, axs = plt.subplots(1, 4, figsize=(17, 5.2), dpi=90)
    for ax, p in zip(axs, PANELS):
        values = []
        for i, (g, (steps, ys)) in enumerate(data[p].items()):
            values += [y for y in ys if np.isfinite(y) and y > 0]
            ax.plot(steps, ys, lw=1.2, color=f"C{i}", label=f"group {g}")
        if p == "aus/elr":
            ax.axhline(1.0, color="0.4", lw=0.8, ls="--")
            ax.annotate(r"1: step $\perp$ $w$", (0.02, 1.0), xycoords=("axes fraction", "data"),
                        xytext=(0, 3), textcoords="offset points", va="bottom", fontsize=8, color="0.3")
            top = max([1.2] + [v * 1.2 for v in values])
            ax.set_ylim(0, top)
        elif values and max(values) > 3 * min(values):   # a log axis only where the values span a range
            ax.set_yscale("log")
        ax.set_title(TITLES[p], fontsize=9)
        ax.set_xlabel("step $t$")
        ax.grid(alpha=0.3)
    handles, labels = axs[0].get_legend_handles_labels()
    note = LEGEND_TEXT
    if skipped:
        shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        note += (rf"Not plotted (lr$_t$ = 0, nothing moves and $U = \Delta/\mathrm{{lr}}_t$ is undefined): "
                 f"step {shown}.")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.13), ncol=max(1, len(labels)),
               fontsize=8, frameon=False)
    fig.text(0.01, 0.01, note, fontsize=8, va="bottom", ha="left", wrap=False)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
