"""torch.optim peer: ``torch.optim.<Class>(params, **kwargs)`` as a
:class:`~refopt.testing.adapters.TorchAdapter` (CPU, the arrays' dtype, torch's default dtype set to it
while the optimizer is built and stepped).

``foreach=False`` is passed where the class takes it (the single-tensor code path of CONVENTIONS.md 1).
Layout 'transpose' gives torch the transpose of every matrix (torch's (out, in) Linear layout, the
adapter's layout 'torch') and transposes params and state back. State entries are torch's
``optimizer.state[p]`` names (``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``).
"""
from __future__ import annotations

import inspect

from refopt.crosscheck.peers import require

#: Preset.layout -> the adapter's layout
LAYOUTS = {"same": "refopt", "transpose": "torch"}


def load():
    return require("torch", "torch")


def takes_foreach(cls) -> bool:
    """True when the optimizer class takes a ``foreach`` argument."""
    try:
        return "foreach" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def preset_adapter(preset, factory=None, prefix: str = "torch.optim", module=None):
    """The preset's ``<module>.<ctor>(params, **kwargs)`` (``module`` default ``torch.optim``; or
    ``factory(params, **kwargs)`` or the preset's own ``factory``, which then gets the kwargs as they are) as a
    TorchAdapter in the preset's layout."""
    from refopt.testing.adapters import TorchAdapter

    torch = load()
    ctor, kw = preset.peer_call
    kw = dict(kw)
    factory = factory or getattr(preset, "factory", None)
    if factory is None:
        factory = getattr(torch.optim if module is None else module, ctor)
        if takes_foreach(factory):
            kw.setdefault("foreach", False)
    return TorchAdapter(factory, kw, layout=LAYOUTS[preset.layout], name=f"{prefix}.{ctor}")
