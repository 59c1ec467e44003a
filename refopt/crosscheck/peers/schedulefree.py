"""schedulefree peer (facebookresearch/schedule_free, the ``*Reference`` classes): torch optimizers, run by
the torch adapter. The AdamW reference starts in eval mode and refuses to step there:
``optimizer.train()`` is called once, when the optimizer is built (its "Switching to train mode" line
silenced). State entries: ``z``, ``x``, ``y``, ``exp_avg_sq``; the params are y (CONVENTIONS.md 5).
"""
from __future__ import annotations

import contextlib
import io

from refopt.crosscheck import peers
from refopt.crosscheck.peers import require


def load():
    require("torch", "schedulefree")
    return require("schedulefree", "schedulefree")


def in_train_mode(cls):
    """``factory(params, **kwargs)``: ``cls(params, **kwargs)`` switched to train mode (``.train()``, where
    it has one), its printout silenced."""
    def build(params, **kwargs):
        opt = cls(params, **kwargs)
        if hasattr(opt, "train"):
            with contextlib.redirect_stdout(io.StringIO()):
                opt.train()
        return opt
    build.__qualname__ = cls.__qualname__
    return build


def preset_adapter(preset, factory=None):
    """The preset's ``schedulefree.<ctor>(params, **kwargs)`` in train mode as a TorchAdapter (``factory``
    replaces the class)."""
    sf = load()
    ctor, _ = preset.peer_call
    return peers.adapter("torch").preset_adapter(preset, in_train_mode(factory or getattr(sf, ctor)),
                                                 prefix="schedulefree")
