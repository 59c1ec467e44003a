r"""Peer presets matched by hyperparameters: which peer call reproduces a given refopt rule.

:func:`preset_for` builds, for any rule configuration, the :class:`~refopt.crosscheck.presets.Preset` of a
peer that reproduces it -- ``Adam(lr=1e-3, beta2=0.95)`` -> ``torch.optim.Adam(lr=0.001, betas=(0.9,
0.95))`` -- or None when the peer has no such configuration. The mappings are the rule's conventions file's
(:mod:`refopt.conventions`: each :class:`~refopt.conventions.PeerMapping`'s ``match``); the peer call lists
only the keywords that differ from the peer's own defaults (:data:`PEER_DEFAULTS`; e.g. ``optax.lamb``'s eps
is 1e-6, not 1e-8, so ``LAMB(eps=1e-8)`` passes ``eps=1e-08``), with the mapping's tolerance tier.
"""
from __future__ import annotations

from refopt.conventions import for_rule, peers
from refopt.conventions._spec import Preset

__all__ = ["preset_for", "PEER_DEFAULTS"]


def _defaults() -> dict:
    return {(m.adapter, m.ctor): dict(m.defaults) for m in peers().values()}


#: the defaults of the peer calls (keywords equal to these are left out of a matched call)
PEER_DEFAULTS = _defaults()


def preset_for(rule, peer: str) -> Preset | None:
    """The preset of ``peer`` (one of :data:`refopt.conventions.ALL_PEERS`) that reproduces ``rule``, or None."""
    from refopt.conventions import ALL_PEERS
    if peer not in ALL_PEERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {sorted(ALL_PEERS)}")
    conv = for_rule(rule)
    if conv is None:
        return None
    for m in conv.mappings:
        if m.adapter != peer or m.match is None:
            continue
        kw = m.match(rule)
        if kw is None:
            continue
        ctor, call = m.call(kw)
        return Preset(f"{peer}.{ctor} (matched by hyperparameters)", peer, m.family, (ctor, call), lambda r=rule: r,
                      "matched by hyperparameters (refopt.crosscheck.match)", layout=m.layout,
                      matrix_only=m.matrix_only, state=m.state_map(kw), tol=m.tol, factory=m.factory)
    return None
