"""refopt: a golden reference for neural-network optimizers, in numpy and numba.

Pure-functional API (Optimisers.jl / optax style)::

    import refopt
    rule = refopt.AdamW(lr=1e-3, weight_decay=0.01)
    state = refopt.init(rule, params)
    params, state = refopt.update(rule, state, params, grads)

See :mod:`refopt.core` for the contract, :mod:`refopt.rules` for the rules, :mod:`refopt.schedules` for
learning-rate multipliers, :mod:`refopt.autograd` for the numpy autograd.
"""
from refopt import autograd, schedules, tree
from refopt.autograd import check_grad_fn, check_grads, check_grads_per_leaf, grad, value_and_grad
from refopt.checkpoint import Checkpoint, CheckpointError, load, save
from refopt.core import OptState, Rule, direction, eval_params, init, update, update_
from refopt.linalg import msign
from refopt import rules as _rules
from refopt.labels import at_least_2d_labels, gpt_labels, matrix_labels, mlp_labels
from refopt.rules import RefoptWarning

globals().update({c.__name__: c for c in _rules.exported_rules()})   # every rule class of refopt/rules/

from refopt import core as _core, fast  # noqa: E402
from refopt.fast import walk as _fast_walk  # noqa: E402

_core.fast_step = _fast_walk.step   # the speed layer; refopt.fast.reading_path() runs the plain walk


def like(peer: str, **kwargs):
    """The refopt rule that reproduces the peer call ``peer(**kwargs)``, with the peer's own argument names
    and defaults: ``refopt.like("torch.optim.AdamW", lr=1e-3, weight_decay=0.1)``,
    ``refopt.like("optax.adamw", learning_rate=1e-3)``. See :func:`refopt.conventions.like`."""
    from refopt.conventions import like as _like
    return _like(peer, **kwargs)

__version__ = "0.1.0"


__all__ = [
    "tree", "autograd", "schedules", "fast", "value_and_grad", "grad", "check_grads", "check_grads_per_leaf", "check_grad_fn",
    "OptState", "Rule", "init", "update", "update_", "direction", "eval_params", "save", "load", "Checkpoint",
    "CheckpointError", "msign",
    *(c.__name__ for c in _rules.exported_rules()), "like", "RefoptWarning", "gpt_labels", "matrix_labels",
    "at_least_2d_labels",
    "mlp_labels", "__version__",
]
