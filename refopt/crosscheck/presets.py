r"""The convention presets: for each peer optimizer, the refopt configuration that reproduces it.

One table, :data:`PRESETS` (and :data:`MISCONFIGURED`, presets that are wrong on purpose and must be
caught), gathered from the conventions files (:mod:`refopt.conventions`: each rule's file declares its
checked peer calls, whose refopt rule is :func:`refopt.like` of the call). Each :class:`Preset` names the
peer call (library, constructor, keyword arguments), the refopt rule that reproduces it, the array layout, which refopt state fields correspond to which peer state
entries, the tolerances, and the reason (the convention facts of CONVENTIONS.md it relies on).

Layouts: refopt's matrices are (fan_in, fan_out) (``x @ W``), as optax's; torch's ``nn.Linear`` weight is
(out, in). ``layout='transpose'`` hands the peer the transpose of every matrix (and transposes its params
and state back before comparing). For the elementwise rules the layout does not matter.

Tolerances (:class:`Tol`, their tiers and the measurements behind them): :mod:`refopt.conventions._spec`.
"""
from __future__ import annotations

from refopt.conventions import registry
from refopt.conventions._spec import (ALL_PEERS, EXACT, MUON_OPTAX, MUON_TORCH_BF16, OPTAX_F32_WARMUP, PEERS,
                                      SHAMPOO_ROUNDING, SOAP_ROUNDING, Preset, Tol)

__all__ = ["PRESETS", "MISCONFIGURED", "KNOWN_GAPS", "Preset", "Tol", "EXACT", "MUON_OPTAX", "MUON_TORCH_BF16",
           "OPTAX_F32_WARMUP", "SOAP_ROUNDING", "SHAMPOO_ROUNDING", "PEERS", "ALL_PEERS", "FAMILIES", "select"]

#: the checked peer calls of every conventions file, torch's first, then optax's, schedulefree's and the torch
#: packages'
PRESETS: list[Preset] = [p for peer in ALL_PEERS for c in registry().values() for p in c.presets if p.peer == peer]

#: Known gaps of the presets above that refopt does not reproduce by design (reported, never run): kept
#: out of PRESETS, whose rows are all reproduced.
KNOWN_GAPS: list[Preset] = [p for c in registry().values() for p in c.gaps]

#: Deliberately wrong presets: each must FAIL (they prove the tolerances catch real convention errors).
MISCONFIGURED: list[Preset] = [p for peer in ALL_PEERS for c in registry().values() for p in c.wrong if p.peer == peer]

FAMILIES = sorted({p.family for p in PRESETS})


def select(against: str = "all", families: list[str] | None = None, misconfigured: bool = False) -> list[Preset]:
    """The presets for ``against`` ('all' or a peer) and the rule ``families`` (None = all; in any case, as
    the reports print them: ``Adam`` is ``adam``).

    Raises: ValueError for an unknown peer or family."""
    if against != "all" and against not in ALL_PEERS:
        raise ValueError(f"--against must be one of {['all', *ALL_PEERS]}, got {against!r}")
    known = set(FAMILIES)
    families = [f.lower() if isinstance(f, str) else f for f in families] if families else families  # Adam = adam
    for f in families or []:
        if f not in known:
            raise ValueError(f"unknown rule family {f!r}; choose from {sorted(known)}")
    pool = PRESETS + (MISCONFIGURED if misconfigured else [])
    return [p for p in pool if (against == "all" or p.peer == against) and (not families or p.family in families)]
