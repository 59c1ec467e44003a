"""Cross-checks of refopt against torch.optim, optax and schedulefree (issue 5; docs/crosscheck.md).

``presets.PRESETS`` is the table of conventions (peer call -> refopt rule); ``run.run_preset`` runs one
row on a canonical problem (``problems``) and compares params and state step by step; the peers are
imported lazily by the adapters in ``peers``.
"""
from refopt.crosscheck.peers import PeerNotInstalled
from refopt.crosscheck.presets import KNOWN_GAPS, MISCONFIGURED, PRESETS, Preset, Tol
from refopt.crosscheck.run import Result, run_all, run_preset, table

__all__ = ["PRESETS", "MISCONFIGURED", "KNOWN_GAPS", "Preset", "Tol", "Result", "run_preset", "run_all", "table",
           "PeerNotInstalled"]
