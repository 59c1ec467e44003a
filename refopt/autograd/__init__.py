"""autograd-lite: reverse-mode differentiation over NumPy arrays for refopt's reference models.

``value_and_grad(f)(params, *args) -> (value, grads)`` traces ``f`` on a pytree of parameters, walks the
graph backwards iteratively and returns gradients with the params' structure. Primitives run on plain
arrays too, so models written with them need no tracing to evaluate. See ``core`` for the design,
``ops`` and ``nn`` for the primitives and their VJPs, ``check`` for finite-difference checking.
"""
from .check import check_grads, check_grads_per_leaf
from .core import Node, grad, is_node, unbroadcast, value, value_and_grad
from .nn import (attention, cross_entropy, embedding, ffn_activation, linear_concat, log_softmax, rms_norm,
                 self_attention, softmax, swiglu)
from .ops import (add, div, exp, gelu, getitem, log, matmul, mean, mul, neg, power, relu, reshape,
                  sigmoid, silu, sqrt, sub, sum, tanh, transpose)

__all__ = [
    "Node", "value_and_grad", "grad", "is_node", "value", "unbroadcast", "check_grads", "check_grads_per_leaf",
    "add", "sub", "mul", "div", "neg", "power", "matmul", "sum", "mean", "reshape", "transpose", "getitem",
    "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "silu", "gelu",
    "softmax", "log_softmax", "cross_entropy", "rms_norm", "embedding", "attention", "swiglu",
    "linear_concat", "self_attention", "ffn_activation",
]
