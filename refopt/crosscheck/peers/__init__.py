"""The peers' optimizers as pure-step adapters (:mod:`refopt.testing.adapters`).

:func:`preset_adapter` turns a preset's peer call into an :class:`~refopt.testing.adapters.Adapter`
(torch and schedulefree: a :class:`~refopt.testing.adapters.TorchAdapter`; optax: an
:class:`~refopt.testing.adapters.OptaxAdapter`), so the cross-check, the divergence atlas, the plug-in
check and :mod:`refopt.testing` run every optimizer through the same adapters and the same trajectory
code (:func:`refopt.crosscheck.run.trajectory`). Each peer's module (:func:`adapter`) has ``load()``
(import the peer) and ``preset_adapter(preset, factory=None)``. The adapters take and return arrays in
refopt's layout; their ``state_arrays`` name the entries as the peer does (torch ``exp_avg``, optax
``[0].mu``), which a preset's ``state`` map {refopt field: peer name} refers to. The peer is imported
lazily, on first use; a missing peer raises :class:`PeerNotInstalled` with the pip command that installs it.
"""
from __future__ import annotations

import importlib

import numpy as np

from refopt import tree as T
from refopt.testing.adapters import INSTALL, Adapter, PeerNotInstalled, require

__all__ = ["INSTALL", "PeerNotInstalled", "require", "adapter", "available", "preset_adapter", "NegatedGrads"]


def adapter(peer: str):
    """The module of ``peer`` ('torch', 'optax', 'schedulefree'; a torch package: its
    :class:`~refopt.crosscheck.peers.packages.Package`): ``load()`` and ``preset_adapter``."""
    if peer not in INSTALL:
        raise ValueError(f"unknown peer {peer!r}; choose from {sorted(INSTALL)}")
    from refopt.crosscheck.peers.packages import PACKAGES
    if peer in PACKAGES:
        return PACKAGES[peer]
    return importlib.import_module(f"refopt.crosscheck.peers.{peer}")


def available(peer: str) -> tuple[bool, str]:
    """(True, '') if ``peer`` can be imported, else (False, the reason with the install command)."""
    mod = adapter(peer)
    try:
        mod.load()
    except PeerNotInstalled as e:
        return False, str(e)
    return True, ""


def preset_adapter(preset, factory=None) -> Adapter:
    """The preset's peer call (``preset.peer``, ``preset.peer_call``, ``preset.layout``) as an Adapter;
    ``preset.negate_peer_grads`` feeds it -g. ``factory`` replaces the peer's constructor and takes the
    same arguments (torch, schedulefree: ``factory(params, **kwargs)`` -> a torch optimizer, e.g. a
    subclass; optax: ``factory(**kwargs)`` -> a GradientTransformation). Raises :class:`PeerNotInstalled`."""
    out = adapter(preset.peer).preset_adapter(preset, factory)
    return NegatedGrads(out) if preset.negate_peer_grads else out


class NegatedGrads(Adapter):
    """``inner`` fed the negated gradients -g (a sign error in the gradient convention, the negative control
    of :attr:`Preset.negate_peer_grads <refopt.crosscheck.presets.Preset>`)."""

    def __init__(self, inner: Adapter):
        self.inner = inner
        self.name, self.framework, self.layout = f"{inner.name} fed -g", inner.framework, inner.layout

    def init(self, params):
        return self.inner.init(params)

    def step(self, state, params, grads):
        gs, _, td = T.flatten(grads)
        return self.inner.step(state, params, T.unflatten(td, [-np.asarray(g) for g in gs]))

    def state_arrays(self, state) -> dict:
        return self.inner.state_arrays(state)

    def checkpoint(self, state):
        return self.inner.checkpoint(state)

    def restore(self, blob, params):
        return self.inner.restore(blob, params)
