"""Thin adapters that run a peer optimizer step by step on given arrays.

Every adapter exposes ``make(preset, leaves, dtype) -> runner`` where ``leaves`` is the list of initial
arrays (refopt's layout) and the runner has ``step(grads)`` (a list of arrays, refopt's layout),
``params() -> list[ndarray]`` and ``state() -> {refopt field: list[ndarray]}`` (refopt's layout, for the
fields named in the preset's ``state`` map). The peer is imported lazily, on first use; a missing peer
raises :class:`PeerNotInstalled` with the pip command that installs it.
"""
from __future__ import annotations

import importlib

#: the versions pinned by the ``peers`` extra of pyproject.toml, whose behaviour the tolerances and the
#: divergence atlas were measured on
INSTALL = {
    "torch": "pip install torch==2.13.0",
    "optax": "pip install jax==0.10.2 jaxlib==0.10.2 optax==0.2.8",
    "schedulefree": "pip install torch==2.13.0 && pip install schedulefree==1.4.1",
}


class PeerNotInstalled(ImportError):
    """The peer library (or one of its dependencies) cannot be imported."""


def require(module: str, peer: str):
    """Import ``module`` or raise :class:`PeerNotInstalled` naming the peer and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PeerNotInstalled(f"peer {peer!r} is not installed ({e.name or module} missing); "
                               f"install it with: {INSTALL[peer]}") from None


def adapter(peer: str):
    """The adapter module of ``peer`` ('torch', 'optax' or 'schedulefree')."""
    if peer not in INSTALL:
        raise ValueError(f"unknown peer {peer!r}; choose from {sorted(INSTALL)}")
    return importlib.import_module(f"refopt.crosscheck.peers.{peer}")


def available(peer: str) -> tuple[bool, str]:
    """(True, '') if ``peer`` can be imported, else (False, the reason with the install command)."""
    mod = adapter(peer)
    try:
        mod.load()
    except PeerNotInstalled as e:
        return False, str(e)
    return True, ""
