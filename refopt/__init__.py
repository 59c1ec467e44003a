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
from refopt.rules import RefoptWarning, matrix_labels

globals().update({c.__name__: c for c in _rules.exported_rules()})   # every rule class of refopt/rules/


def like(peer: str, **kwargs):
    """The refopt rule that reproduces the peer call ``peer(**kwargs)``, with the peer's own argument names
    and defaults: ``refopt.like("torch.optim.AdamW", lr=1e-3, weight_decay=0.1)``,
    ``refopt.like("optax.adamw", learning_rate=1e-3)``. See :func:`refopt.conventions.like`."""
    from refopt.conventions import like as _like
    return _like(peer, **kwargs)

__version__ = "0.1.0"


def gpt_labels(path, x):
    """The parameter group ('hidden' / 'other') of one array of the reference GPT: an alias of
    ``refopt.models.gpt.param_label`` (see there), usable as ``Partition(labels=refopt.gpt_labels)``;
    ``refopt.models.gpt.labels(params)`` gives the same as a labels tree."""
    from refopt.models.gpt import param_label
    return param_label(path, x)


def mlp_labels(params, first: str = "hidden", last: str = "other"):
    """The labels tree of the reference MLP: an alias of ``refopt.models.mlp.labels`` (see there)."""
    from refopt.models.mlp import labels
    return labels(params, first, last)


__all__ = [
    "tree", "autograd", "schedules", "value_and_grad", "grad", "check_grads", "check_grads_per_leaf", "check_grad_fn",
    "OptState", "Rule", "init", "update", "update_", "direction", "eval_params", "save", "load", "Checkpoint",
    "CheckpointError", "msign",
    *(c.__name__ for c in _rules.exported_rules()), "like", "RefoptWarning", "gpt_labels", "matrix_labels",
    "mlp_labels", "__version__",
]
