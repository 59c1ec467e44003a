"""refopt: a golden reference for neural-network optimizers, in numpy and numba.

Pure-functional API (Optimisers.jl / optax style)::

    import refopt
    rule = refopt.AdamW(lr=1e-3, weight_decay=0.01)
    state = refopt.init(rule, params)
    params, state = refopt.update(rule, state, params, grads)
"""
from refopt import autograd, tree
from refopt.autograd import check_grads, grad, value_and_grad
from refopt.core import OptState, Rule, direction, eval_params, init, update, update_
from refopt.rules import SGD, Adam, AdamW

__version__ = "0.1.0"

__all__ = ["tree", "autograd", "value_and_grad", "grad", "check_grads", "OptState", "Rule", "init", "update", "update_", "direction", "eval_params",
           "SGD", "Adam", "AdamW", "__version__"]
