r"""The convention presets: for each peer optimizer, the refopt configuration that reproduces it.

One table, :data:`PRESETS` (and :data:`MISCONFIGURED`, presets that are wrong on purpose and must be
caught), gathered from the conventions files (:mod:`refopt.conventions`: each rule's file declares its
checked peer calls, whose refopt rule is :func:`refopt.like` of the call). Each :class:`Preset` names the peer call (library, constructor, keyword arguments), the refopt
rule that reproduces it, the array layout, which refopt state fields correspond to which peer state
entries, the tolerances, and the reason (the convention facts of CONVENTIONS.md it relies on).

Layouts: refopt's matrices are (fan_in, fan_out) (``x @ W``), as optax's; torch's ``nn.Linear`` weight is
(out, in). ``layout='transpose'`` hands the peer the transpose of every matrix (and transposes its params
and state back before comparing). For the elementwise rules the layout does not matter.

Tolerances (:class:`Tol`, see docs/crosscheck.md for the derivations):

* ``EXACT`` -- float64: the max-norm relative difference of params and state, per array and step, at most
  1e-12 (refopt follows the peers' operation order; what remains is a few ulps of reassociation, e.g.
  ``sqrt(v)/sqrt(bc2)`` vs ``sqrt(v/bc2)``, accumulated over 50 steps). float32: 2e-5, about 50 steps x a
  few float32 ulps (2^-24 = 6e-8) of per-step relative error in the step, rounding order differing.
* ``OPTAX_F32_WARMUP`` -- optax's Schedule-Free wrappers with ``warmup_steps``: optax evaluates the
  warmup schedule count/W in float32 even for float64 params (int32 count; 0.5*1/5 = 0.099999994), so
  the early z steps and averaging weights carry a relative error up to the float32 unit 6e-8 (2^-24);
  it stays in z and x (measured <= 1.1e-7 over 50 steps, the quadratic). float64 1e-6; float32 2e-5 as
  EXACT; the lag itself (warmup_lag=False) differs by >= 0.26. The same
  pairing with the warmup evaluated in float64 (adapter ``float64_warmup``) is EXACT.
* ``MUON_OPTAX`` -- float64 1e-10: Newton-Schulz in float64 on both sides, but BLAS (refopt) and XLA
  (optax) sum the matmuls in a different order and the quintic amplifies rounding (slope a = 3.4 at 0).
  float32: 2e-4.
* ``MUON_TORCH_BF16`` -- torch.optim.Muon casts the Newton-Schulz input to bfloat16 (8 significant
  bits: unit roundoff u = 2^-8 = 3.9e-3) whatever the param dtype, so its orthogonalised update carries
  ~1e-2 relative error per step. The params are therefore gated on the **per-step update**: max over steps of
  ||Delta_peer - Delta_refopt||_F / ||Delta_refopt||_F <= 0.06 on the full-rank random problems
  (stream, quadratic; measured <= 0.043), where Delta = x_t - x_{t-1}. On the real gradients of the MLP
  and the GPT the momentum is ill-conditioned and Jordan's quintic multiplies small singular values by up
  to a^5 = 3.4445^5 = 486, so bfloat16 rounding noise in weak directions is amplified: there the gate is
  0.25 (measured <= 0.145). The momentum buffer is computed in the param dtype by both, so the **state
  stays gated at EXACT**. The errors that must be caught are larger (measured, :data:`MISCONFIGURED`):
  on the stream a wrong scale or an untransposed layout (2:1 matrices: sqrt(2) - 1 = 0.41) gives
  >= 0.40, a sign error 2.1, dropping Nesterov 0.99; on the MLP / GPT the smallest is 0.37 (Nesterov).
"""
from __future__ import annotations

from refopt.conventions import registry
from refopt.conventions._spec import (EXACT, MUON_OPTAX, MUON_TORCH_BF16, OPTAX_F32_WARMUP, PEERS, Preset, Tol,
                                      _Raw)

__all__ = ["PRESETS", "MISCONFIGURED", "KNOWN_GAPS", "Preset", "Tol", "EXACT", "MUON_OPTAX", "MUON_TORCH_BF16",
           "OPTAX_F32_WARMUP", "PEERS", "FAMILIES", "select"]

#: the checked peer calls of every conventions file, torch's first, then optax's, then schedulefree's
PRESETS: list[Preset] = [p for peer in PEERS for c in registry().values() for p in c.presets if p.peer == peer]

#: Known gaps of the presets above that refopt does not reproduce by design (reported, never run): kept
#: out of PRESETS, whose rows are all reproduced.
KNOWN_GAPS: list[Preset] = [p for c in registry().values() for p in c.gaps]

#: Deliberately wrong presets: each must FAIL (they prove the tolerances catch real convention errors).
MISCONFIGURED: list[Preset] = [p for peer in PEERS for c in registry().values() for p in c.wrong if p.peer == peer]

FAMILIES = sorted({p.family for p in PRESETS})


def select(against: str = "all", families: list[str] | None = None, misconfigured: bool = False) -> list[Preset]:
    """The presets for ``against`` ('all' or a peer) and the rule ``families`` (None = all; in any case, as
    the reports print them: ``Adam`` is ``adam``).

    Raises: ValueError for an unknown peer or family."""
    if against != "all" and against not in PEERS:
        raise ValueError(f"--against must be one of {['all', *PEERS]}, got {against!r}")
    known = set(FAMILIES)
    families = [f.lower() if isinstance(f, str) else f for f in families] if families else families  # Adam = adam
    for f in families or []:
        if f not in known:
            raise ValueError(f"unknown rule family {f!r}; choose from {sorted(known)}")
    pool = PRESETS + (MISCONFIGURED if misconfigured else [])
    return [p for p in pool if (against == "all" or p.peer == against) and (not families or p.family in families)]
