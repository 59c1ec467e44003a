"""torch.optim peer: runs ``torch.optim.<Class>(params, **kwargs)`` on CPU in the requested dtype.

Gradients are handed over as ``p.grad`` (fresh tensors, so the optimizer cannot alias refopt's arrays);
``foreach=False`` is forced where the class takes it (the single-tensor code path of CONVENTIONS.md 1).
Layout 'transpose' gives torch the transpose of every matrix (torch's (out, in) Linear layout) and
transposes params and state back. State keys are torch's ``optimizer.state[p]`` names
(``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``).
"""
from __future__ import annotations

import numpy as np

from refopt.crosscheck.peers import require


def load():
    return require("torch", "torch")


_FOREACH = {"SGD", "Adam", "AdamW"}


class TorchRunner:
    def __init__(self, preset, leaves, dtype, optimizer_cls=None):
        torch = load()
        self.torch = torch
        self.preset = preset
        self.transpose = preset.layout == "transpose"
        self.params = [torch.nn.Parameter(torch.from_numpy(self._to_peer(x).copy())) for x in leaves]
        ctor, kw = preset.peer_call
        kw = dict(kw)
        if optimizer_cls is None:
            optimizer_cls = getattr(torch.optim, ctor)
            if ctor in _FOREACH:
                kw.setdefault("foreach", False)
        self.opt = optimizer_cls(self.params, **kw)
        self.sign = -1.0 if preset.negate_peer_grads else 1.0

    def _to_peer(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.T) if self.transpose and a.ndim == 2 else a

    def _from_peer(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.T) if self.transpose and a.ndim == 2 else np.array(a)

    def step(self, grads):
        for p, g in zip(self.params, grads):
            p.grad = self.torch.from_numpy((self.sign * self._to_peer(g)).astype(g.dtype, copy=True))
        # torch keeps some scalars (NAdam's mu_product) in its default dtype: float64 while a float64 run steps,
        # scoped to the step and restored (a float32 product alone costs about 1e-10)
        old = self.torch.get_default_dtype()
        if self.params and self.params[0].dtype == self.torch.float64:
            self.torch.set_default_dtype(self.torch.float64)
        try:
            self.opt.step()
        finally:
            self.torch.set_default_dtype(old)

    def get_params(self):
        return [self._from_peer(p.detach().numpy()) for p in self.params]

    def get_state(self):
        out = {}
        for field, key in self.preset.state.items():
            out[field] = [self._from_peer(self.opt.state[p][key].detach().numpy()) for p in self.params]
        return out


def make(preset, leaves, dtype):
    return TorchRunner(preset, leaves, dtype)
