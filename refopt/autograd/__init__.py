"""autograd-lite: reverse-mode differentiation over NumPy arrays for refopt's reference models.

``value_and_grad(f)(params, *args) -> (value, grads)`` traces ``f`` on a pytree of parameters, walks the
graph backwards iteratively and returns gradients with the params' structure. Primitives run on plain
arrays too, so models written with them need no tracing to evaluate. See ``core`` for the design,
``ops`` and ``nn`` for the primitives and their VJPs, ``check`` for finite-difference checking.
"""
from .check import check_grad_fn, check_grads, check_grads_per_leaf
from .core import Node, grad, is_node, unbroadcast, value, value_and_grad
from .nn import (attention, cross_entropy, embedding, ffn_activation, linear_concat, log_softmax,
                 residual_linear, rms_norm, self_attention, softmax, swiglu)
from .ops import (abs, add, clip, div, exp, expm1, gelu, getitem, log, log1p, matmul, maximum, mean, minimum,
                  mul, neg, power, relu, reshape, sigmoid, silu, sqrt, square, sub, sum, tanh, transpose, where)

__all__ = [
    "Node", "value_and_grad", "grad", "is_node", "value", "unbroadcast", "check_grads", "check_grads_per_leaf",
    "check_grad_fn",
    "add", "sub", "mul", "div", "neg", "power", "matmul", "sum", "mean", "reshape", "transpose", "getitem",
    "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "silu", "gelu",
    "abs", "log1p", "expm1", "square", "where", "maximum", "minimum", "clip",
    "softmax", "log_softmax", "cross_entropy", "rms_norm", "embedding", "attention", "swiglu",
    "linear_concat", "self_attention", "ffn_activation", "residual_linear",
]
