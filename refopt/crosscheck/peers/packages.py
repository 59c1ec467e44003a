"""The torch packages that ship a few optimizers each (prodigyopt, dadaptation, pytorch_optimizer, heavyball,
kron_torch, momo: the authors' momo-opt): ``<package>.<Class>(params, **kwargs)`` run by the torch adapter, ``foreach=False`` where the class takes it.
State entries are the package's ``optimizer.state[p]`` names; its rule-wide numbers (Prodigy's ``d``, the
sums of D-Adaptation) live in ``param_groups`` and are compared through the params they move.
"""
from __future__ import annotations

from refopt.conventions._spec import PACKAGES as NAMES
from refopt.crosscheck.peers import require


class Package:
    """``load()`` and ``preset_adapter(preset, factory=None)`` of one torch package (an ``adapter`` module)."""

    def __init__(self, name: str):
        self.name = name

    def load(self):
        require("torch", self.name)
        return require(self.name, self.name)

    def preset_adapter(self, preset, factory=None):
        """The preset's ``<package>.<ctor>(params, **kwargs)`` as a TorchAdapter (``factory`` replaces the
        class and gets the kwargs as they are)."""
        from refopt.crosscheck.peers import torch as torch_peer

        return torch_peer.preset_adapter(preset, factory, prefix=self.name, module=self.load())



PACKAGES = {name: Package(name) for name in NAMES}
