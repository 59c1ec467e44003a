"""schedulefree peer (facebookresearch/schedule_free, the ``*Reference`` classes): torch optimizers, so
this reuses the torch adapter. The AdamW reference starts in eval mode and refuses to step there:
``optimizer.train()`` is called once before the first step. State keys: ``z``, ``x``, ``y``,
``exp_avg_sq``; the params are y (CONVENTIONS.md 5).
"""
from __future__ import annotations

import contextlib
import io

from refopt.crosscheck.peers import require
from refopt.crosscheck.peers.torch import TorchRunner


def load():
    require("torch", "schedulefree")
    return require("schedulefree", "schedulefree")


def make(preset, leaves, dtype):
    sf = load()
    ctor, _ = preset.peer_call
    runner = TorchRunner(preset, leaves, dtype, optimizer_cls=getattr(sf, ctor))
    if hasattr(runner.opt, "train"):
        with contextlib.redirect_stdout(io.StringIO()):   # the reference prints "Switching to train mode"
            runner.opt.train()
    return runner
