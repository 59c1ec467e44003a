"""Run outputs shared by the commands: the out directory, metrics.csv, config.json, plots."""
from __future__ import annotations

import csv
import json
import os
import platform
import sys
from importlib import metadata

import numpy as np


#: the files refopt train and refopt compare write into --out (a directory holding one holds a run); the
#: per-rule files of compare are named after refopt's optimizers only, so a user's own files are never taken
def run_outputs() -> tuple:
    from refopt.cli import optimizers

    return ("metrics.csv", "config.json", "loss.png", "sample.txt", "checkpoint.npz", "diagnostics.png",
            "summary.csv", "compare.png", *(f"metrics_{n}.csv" for n in optimizers.OPTIMIZERS))


def previous_run(path: str) -> list[str]:
    """The outputs of a previous refopt train / compare run found in the directory ``path``."""
    return sorted(n for n in run_outputs() if os.path.isfile(os.path.join(path, n)))


def remove_previous(path: str) -> None:
    """Remove a previous run's outputs from ``path`` (--overwrite), just before the new run writes its own,
    so that none is left next to them and a command refused earlier has removed nothing."""
    for name in previous_run(path):
        try:
            os.remove(os.path.join(path, name))
        except OSError as e:
            raise ValueError(f"--overwrite: cannot remove {os.path.join(path, name)}: {e.strerror}") from None


def prepare_out(path: str, check_run: bool = False, overwrite: bool = False) -> str:
    """Create ``path`` (and parents) if needed and check it is a writable directory; return it. With
    ``check_run``, a directory holding a previous run (:func:`previous_run`) is refused unless ``overwrite``
    (its files are then removed by :func:`remove_previous` when the new run writes, not here).

    Raises: ValueError (one line) when it is a file, cannot be created, is not writable, or holds a run.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--out {path} exists and is not a directory")
    found = previous_run(path) if check_run and os.path.isdir(path) else []
    if found and not overwrite:
        raise ValueError(f"--out {path} already holds a run ({', '.join(found[:4])}{', ...' if len(found) > 4 else ''}); "
                         f"pass --overwrite to replace it, --resume {path} to continue a train run, or choose "
                         f"another --out")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create --out directory {path}: {e.strerror}") from None
    probe = os.path.join(path, ".refopt-write-test")
    try:
        with open(probe, "w") as f:
            f.write("")
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"--out directory {path} is not writable: {e.strerror}") from None
    return path


def in_notebook() -> bool:
    """True inside a Jupyter kernel (a tutorial run as a notebook, by Jupyter, nbconvert or the docs build)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def parse_script_args(ap, argv=None):
    """``ap.parse_args(argv)`` for a script that also runs as a notebook (the tutorials). Inside a Jupyter
    kernel with ``argv`` None, ``sys.argv`` holds the kernel's own arguments (``-f FILE``,
    ``--HistoryManager.hist_file=:memory:``, ...), not the tutorial's: the defaults are used. From the
    command line any unknown argument is an error (exit 2 naming it, as argparse does), so a mistyped
    option never silently runs the defaults."""
    if argv is None and in_notebook():
        return ap.parse_args([])
    a, unknown = ap.parse_known_args(argv)
    extra = [u for i, u in enumerate(unknown) if u != "-f" and not (i and unknown[i - 1] == "-f")]
    if extra:   # (a kernel's "-f FILE" passed on is ignored)
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    return a


#: the environment variable that sets the tutorials' output folder (the docs build and the tests set it)
TUTORIAL_OUT_ENV = "REFOPT_TUTORIAL_OUT"


def tutorial_out(default: str = "runs/tutorials") -> str:
    """The tutorials' output folder: ``$REFOPT_TUTORIAL_OUT`` when set, else ``default``."""
    return os.environ.get(TUTORIAL_OUT_ENV) or default


def save_figure(fig, out: str, name: str, dpi: int = 100) -> str:
    """Write ``fig`` to ``OUT/NAME.png`` and return the path. Run as a script the figure is then closed; in a
    notebook it stays open, so that Jupyter shows it inline below the cell."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=dpi)
    if not in_notebook():
        import matplotlib.pyplot as plt
        plt.close(fig)
    return path


def save_results(out: str, name: str, results: dict) -> str:
    """Write a tutorial's measured numbers (a JSON-able dict; numpy scalars and arrays are converted) to
    ``OUT/NAME.json`` and return the path: the tests read the numbers of the very run the docs show."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, sort_keys=True, default=_results_jsonable)
        f.write("\n")
    return path


def _results_jsonable(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


def package_versions(names=("refopt", "numpy", "numba", "scipy", "scikit-learn", "matplotlib", "mkl")) -> dict:
    out = {"python": platform.python_version()}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def write_json(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=_jsonable)
        f.write("\n")


def _jsonable(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return repr(o)


def write_csv(path: str, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r.get(k)) for k in columns})


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return v


#: mantissas of the tick values in each decade, from coarse to fine
_MANTISSAS = ([1], [1, 3], [1, 2, 5], [1, 2, 3, 5, 7], [1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9],
              [1, 1.2, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 9],
              [k / 10 for k in range(10, 100)], [k / 100 for k in range(100, 1000)])


def log_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """Round tick values for a log axis over [lo, hi]: the coarsest of 1, 1-3, 1-2-5, ... per decade
    down to three significant digits that puts at least ``n`` ticks in the range (thinned to at most
    10), so that the axis is labelled even when the data span less than a decade."""
    if not (0 < lo <= hi) or not (np.isfinite(lo) and np.isfinite(hi)):
        return []
    if hi / lo < 1.05:
        lo, hi = lo / 1.03, hi * 1.03
    e0, e1 = int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi)))
    ticks: list[float] = []
    for mantissas in _MANTISSAS:
        ticks = [float(f"{m * 10.0 ** e:.4g}") for e in range(e0, e1 + 1) for m in mantissas]
        ticks = sorted({t for t in ticks if lo <= t <= hi})
        if len(ticks) >= n:
            break
    step = -(-len(ticks) // 10)
    return ticks[::step]


def log_axis(ax, lo: float, hi: float) -> None:
    """A log y axis over [lo, hi] labelled at :func:`log_ticks` (plain numbers, no 10^k notation)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    ax.set_yscale("log")
    ticks = log_ticks(lo, hi)
    if ticks and ticks[0] > lo * 1.1:   # no label near the lowest values: add the round value just below them
        below = [t for t in log_ticks(lo / 2, hi, len(ticks) + 4) if t <= lo]
        ticks = below[-1:] + ticks
    if ticks:
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_formatter(NullFormatter())
        pad = max((hi / lo) ** 0.04, 1.03)
        ax.set_ylim(min(lo, ticks[0]) / pad, max(hi, ticks[-1]) * pad)
