r"""Adapters: any optimizer presented as one *pure* step over numpy pytrees.

Every adapter has the same three methods (the contract the properties and the plug-in cross-check use)::

    state = adapter.init(params)                                 # params: a pytree of float arrays
    new_params, new_state = adapter.step(state, params, grads)   # inputs are never modified
    new_params, new_state = adapter.step(state, params, grads, value=f)   # a rule that needs the loss
    adapter.state_arrays(state) -> {name: [array or None per leaf]}   # the per-leaf state it exposes

The step's inputs beyond the gradients (:data:`refopt.core.INPUTS`: ``value``, the loss at ``params``) are
keyword arguments of ``step``, handed over in each framework's convention: refopt's and optax's ``value=``
(optax's extra arguments, for a transformation built with extra-argument support), torch's
``step(closure)`` with a closure that returns the loss as a 0-d tensor (the gradients are already set; it
evaluates nothing), a numpy implementation's ``step(state, params, grads, value=f)``. A step without them
is called as before.

plus ``checkpoint(state) -> blob`` / ``restore(blob, params) -> state`` (the implementation's own
save/restore path: torch's ``state_dict``, a host copy of an optax state), used by the bit-identical
resume property. Params, grads and returned arrays are always in **refopt's layout**: a matrix is
(fan_in, fan_out) (``x @ W``). ``layout='torch'`` means the implementation holds torch's (out, in):
an array of ndim >= 2 with refopt shape (k_1, ..., fan_in, fan_out) is handed over as
``np.transpose(a, (n-1, n-2, 0, ..., n-3))``, i.e. torch's (out, in, k_1, ...) (a Linear weight is
transposed; a conv filter (kh, kw, in, out) becomes torch's (out, in, kh, kw), the same flattening as
refopt's Muon: fan_in = prod(shape[:-1]), fan_out = shape[-1]); 1-D arrays are unchanged.

Kinds (:func:`make_adapter` picks one):

* :class:`RuleAdapter` -- a refopt rule (``refopt.init`` / ``refopt.update``).
* :class:`TorchAdapter` -- a ``torch.optim.Optimizer`` subclass, or any callable returning an optimizer
  when called as ``factory(params, **kwargs)``. Default layout 'torch'. The optimizer is deep-copied
  before every step (the copy's params are set from ``params``, its ``.grad`` from ``grads``), so the
  step is pure even though torch optimizers mutate. Computed in the arrays' dtype on CPU, with torch's
  default dtype set to that dtype (float64 or float32) while the optimizer is built and stepped and
  restored after: torch keeps some scalars in the default dtype (NAdam's ``mu_product``, ASGD's ``eta``
  and ``mu``), which a float64 run must compute in float64 (a float32 ``mu_product`` alone puts NAdam 1e-10 to
  1e-8 off in params rel over 50 steps).
* :class:`OptaxAdapter` -- a callable returning an ``optax.GradientTransformation`` when called as
  ``factory(**kwargs)``. Default layout 'refopt'. The step is ``tx.update`` then
  ``optax.apply_updates``, jit-compiled once. **JAX float64**: every JAX call of the adapter runs inside
  ``jax.enable_x64(True)`` (a scoped context), so float64 arrays stay float64 -- without it JAX silently
  computes in float32 (a correct Adam then misses 1e-12 by ~3e-7); the global ``jax_enable_x64`` flag
  is never changed.
* :class:`NumpyAdapter` -- an object (module, class instance, namespace) with ``init(params) -> state``
  and ``step(state, params, grads) -> (params, state)``, called with the pytrees as given. Default
  layout 'refopt'.

Errors: :class:`UserCodeError` wraps any exception raised by the implementation (the message ends with
the last line of its traceback); :class:`PeerNotInstalled` (an ImportError, also importable from
:mod:`refopt.crosscheck.peers`) when torch or JAX/optax is missing; ValueError for a bad layout or an
object that fits no kind. The peer libraries are imported through :func:`require`, on first use.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
from typing import Any, Callable

import numpy as np

from refopt import tree as T

__all__ = ["Adapter", "Named", "reads_names", "RuleAdapter", "TorchAdapter", "OptaxAdapter", "NumpyAdapter", "UserCodeError",
           "make_adapter", "load_impl", "to_layout", "from_layout", "PeerNotInstalled", "require"]

LAYOUTS = ("refopt", "torch")

#: the versions pinned by the ``peers`` extra of pyproject.toml, whose behaviour the tolerances and the
#: divergence atlas were measured on
INSTALL = {
    "torch": "pip install torch==2.13.0",
    "optax": "pip install jax==0.10.2 jaxlib==0.10.2 optax==0.2.8",
    "schedulefree": "pip install torch==2.13.0 && pip install schedulefree==1.4.1",
    "prodigyopt": "pip install torch==2.13.0 && pip install prodigyopt==1.1.2",
    "dadaptation": "pip install torch==2.13.0 && pip install dadaptation==3.2",
    "pytorch_optimizer": "pip install torch==2.13.0 && pip install pytorch-optimizer==4.1.0",
    "heavyball": "pip install torch==2.13.0 && pip install heavyball==3.2.1",
    "kron_torch": "pip install torch==2.13.0 && pip install kron-torch==0.3.3",
    "momo": "pip install torch==2.13.0 && pip install momo-opt==0.1.0",
}


class PeerNotInstalled(ImportError):
    """The peer library (or one of its dependencies) cannot be imported."""


def require(module: str, peer: str):
    """Import ``module`` or raise :class:`PeerNotInstalled` naming the peer and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PeerNotInstalled(f"peer {peer!r} is not installed ({e.name or module} missing); "
                               f"install it with: {INSTALL[peer]}") from None


class UserCodeError(RuntimeError):
    """The implementation under test raised; ``last_line`` is the last line of its traceback."""

    def __init__(self, where: str, exc: BaseException):
        self.exc = exc
        lines = traceback.format_exception_only(type(exc), exc)
        self.last_line = lines[-1].strip() if lines else repr(exc)
        super().__init__(f"{where} raised: {self.last_line}")


def _check_returned(where: str, xs: list, new: list, paths: list[str]) -> None:
    """The params an implementation returns must keep the inputs' shapes and dtypes (float32 stays float32):
    :class:`UserCodeError` naming the first leaf that does not (it is the implementation's result)."""
    if len(new) != len(xs):
        raise UserCodeError(where, ValueError(f"returned {len(new)} params arrays for {len(xs)} inputs"))
    for x, a, p in zip(xs, new, paths):
        if a.shape != x.shape or a.dtype != x.dtype:
            raise UserCodeError(where, ValueError(
                f"returned {a.dtype} {a.shape} params for {x.dtype} {x.shape} inputs at leaf {p} (an optimizer "
                f"keeps its params' shape and dtype: float32 stays float32)"))


def _perm(ndim: int) -> tuple[int, ...]:
    return (ndim - 1, ndim - 2, *range(ndim - 2))


def to_layout(a: np.ndarray, layout: str) -> np.ndarray:
    """refopt's layout -> ``layout`` (a new C-contiguous array)."""
    if layout == "torch" and a.ndim >= 2:
        return np.ascontiguousarray(np.transpose(a, _perm(a.ndim)))
    return np.array(a, copy=True)


def from_layout(a: np.ndarray, layout: str) -> np.ndarray:
    """``layout`` -> refopt's layout (a new C-contiguous array)."""
    if layout == "torch" and a.ndim >= 2:
        return np.ascontiguousarray(np.transpose(a, np.argsort(_perm(a.ndim))))
    return np.array(a, copy=True)


def _check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


class Adapter:
    """Base class; see the module docstring for the contract."""

    name: str = "adapter"
    framework: str = ""
    layout: str = "refopt"
    #: True: the cross-check may hand it the problem's tree by its real leaf names (:class:`Named`) in place of
    #: the list its documented contract gives user code
    named: bool = False
    #: the step's inputs beyond the gradients it needs (``('value',)``), for the callers that read them off it
    inputs: tuple = ()

    def init(self, params):  # pragma: no cover - abstract
        raise NotImplementedError

    def step(self, state, params, grads, **inputs):  # pragma: no cover - abstract
        raise NotImplementedError

    def state_arrays(self, state) -> dict:
        return {}

    def checkpoint(self, state):
        return copy.deepcopy(state)

    def restore(self, blob, params):
        return copy.deepcopy(blob)

    def __repr__(self):
        return f"{type(self).__name__}({self.name})"


# -------------------------------------------------------------------------------------------------
class RuleAdapter(Adapter):
    """A refopt rule."""

    framework = "refopt"
    named = True

    def __init__(self, rule):
        from refopt.core import Rule

        if not isinstance(rule, Rule):
            raise TypeError(f"expected a refopt rule, got {type(rule).__name__}")
        self.rule = rule
        self.name = repr(rule) if len(repr(rule)) < 80 else type(rule).__name__

    def init(self, params):
        import refopt
        return refopt.init(self.rule, params)

    @property
    def inputs(self) -> tuple:
        return tuple(self.rule.inputs)

    def step(self, state, params, grads, **inputs):
        import refopt
        return refopt.update(self.rule, state, params, grads, **inputs)

    def state_arrays(self, state) -> dict:
        out: dict[str, list] = {}
        leaf_states = T.leaves(state.leaves, is_leaf=lambda n: hasattr(n, "_fields"))
        for i, s in enumerate(leaf_states):
            arrays, paths, _ = T.flatten(s)
            for a, p in zip(arrays, paths):
                if isinstance(a, np.ndarray):     # any shape: NovoGrad's 0-d v, a factored moment's rows
                    out.setdefault(p, [None] * len(leaf_states))[i] = np.array(a)
        return out


def reads_names(obj) -> bool:
    """True when ``obj`` (a torch factory, or a :class:`TorchAdapter` of one) asks for named parameters
    (``named_parameters = True``): the cross-check then runs both sides on the problem's named tree
    (:class:`Named`)."""
    return getattr(getattr(obj, "factory", obj), "named_parameters", False) is True


class Named(Adapter):
    """``inner`` run on the tree of dicts and lists that ``paths`` name (:func:`refopt.tree.from_paths`) while it
    takes and returns lists of leaves in ``paths`` order: the cross-check's problems are such lists, and a rule
    or an optimizer that reads parameter names (pytorch_optimizer's AdamMini, a Partition by name) then sees the
    problem's real names (``blocks[0].attn.w_q``) in place of ``[i]``. State lists and everything else as
    ``inner`` gives them, per leaf in ``paths`` order."""

    def __init__(self, inner: Adapter, paths):
        self.inner, self.paths = inner, list(paths)
        self.order, _, self.td = T.flatten(T.from_paths(self.paths, list(range(len(self.paths)))))

    def __getattr__(self, name):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _tree(self, xs):
        xs = list(xs)
        if len(xs) != len(self.paths):
            raise ValueError(f"{len(xs)} leaves for the {len(self.paths)} paths {self.paths}")
        return T.unflatten(self.td, [xs[i] for i in self.order])

    def _list(self, leaves: list) -> list:
        out = [None] * len(leaves)
        for j, i in enumerate(self.order):
            out[i] = leaves[j]
        return out

    def init(self, params):
        return self.inner.init(self._tree(params))

    def step(self, state, params, grads, **inputs):
        if "closure" in inputs:      # the caller's closure takes and returns lists in paths order
            fn = inputs["closure"]

            def closure(tree):
                value, gs = fn(self._list(T.flatten_up_to(self.td, tree, "params")))
                return value, self._tree(gs)

            inputs = {**inputs, "closure": closure}
        new, state = self.inner.step(state, self._tree(params), self._tree(grads), **inputs)
        return self._list(T.flatten_up_to(self.td, new, "params")), state

    def state_arrays(self, state) -> dict:
        return {k: self._list(v) for k, v in self.inner.state_arrays(state).items()}

    def checkpoint(self, state):
        return self.inner.checkpoint(state)

    def restore(self, blob, params):
        return self.inner.restore(blob, self._tree(params))

    def __repr__(self):
        return repr(self.inner)


# -------------------------------------------------------------------------------------------------
class _TorchState:
    __slots__ = ("opt", "params")

    def __init__(self, opt, params):
        self.opt, self.params = opt, params


def _clone(opt, memo: dict):
    """A deep copy of a torch optimizer *with all its attributes* (``copy.deepcopy`` goes through
    ``Optimizer.__getstate__``, which keeps only defaults, state and param_groups and would drop a
    subclass's own attributes)."""
    new = opt.__class__.__new__(opt.__class__)
    memo[id(opt)] = new
    new.__dict__.update(copy.deepcopy(opt.__dict__, memo))
    step = new.__dict__.get("step")
    if getattr(step, "_wrapped_by_lr_sched", False):
        # a torch LR scheduler replaced opt.step by a wrapper calling the *original* optimizer (a function is
        # not copied by deepcopy): the clone gets the same wrapper around its own step
        inner = step.__wrapped__

        @functools.wraps(inner)
        def wrapper(*args, **kwargs):
            new._opt_called = True
            return inner(new, *args, **kwargs)
        wrapper._wrapped_by_lr_sched = True
        new.step = wrapper
    return new


def _refuse_closure_over(clone, original, name: str) -> None:
    """UserCodeError when the clone's step is a user's closure over the original optimizer (``opt.step =
    wrapper`` calling the original's bound step): the copy would step the original and never move itself."""
    step = clone.__dict__.get("step")
    if step is None or getattr(step, "_wrapped_by_lr_sched", False):
        return
    cells = [c.cell_contents for c in (getattr(step, "__closure__", None) or ()) if _filled(c)]
    # the original itself, its bound step, or an LR scheduler's wrapper of its step (a function: not copied)
    if any(v is original or getattr(v, "__self__", None) is original or getattr(v, "_wrapped_by_lr_sched", False)
           for v in cells):
        raise UserCodeError(f"{name}.step()", RuntimeError(
            "the optimizer's step was replaced by a closure over the optimizer object itself (opt.step = "
            "wrapper), so a copy of it would step the original; define step() in an Optimizer subclass "
            "instead (an LR scheduler can be stepped there)"))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:   # an empty cell
        return False
    return True


def in_layout(closure: Callable, layout: str, td) -> Callable:
    """The step's ``closure`` (params -> (value, grads), a tree ``td`` of arrays in refopt's layout) on the
    implementation's ``layout``: the arrays it is handed are moved back to refopt's layout, the gradients it
    returns to the implementation's."""
    if layout == "refopt":
        return closure

    def fn(tree):
        value, gs = closure(T.unflatten(td, [from_layout(np.asarray(x), layout) for x in T.flatten(tree)[0]]))
        return value, T.unflatten(td, [to_layout(np.asarray(g), layout) for g in T.flatten(gs)[0]])

    return fn


class TorchAdapter(Adapter):
    """A ``torch.optim.Optimizer`` subclass or a factory ``factory(params, **kwargs) -> optimizer``. A factory with
    the attribute ``named_parameters = True`` gets ``[(path, param), ...]`` (refopt's leaf paths, e.g.
    ``blocks[0].attn.w_q``), as ``model.named_parameters()`` gives them, for optimizers that pick their rule
    by parameter name."""

    framework = "torch"
    named = True

    def __init__(self, factory: Callable, kwargs: dict | None = None, layout: str = "torch",
                 name: str | None = None):
        self.torch = require("torch", "torch")
        self.factory, self.kwargs = factory, dict(kwargs or {})
        self.layout = _check_layout(layout)
        self.name = name or getattr(factory, "__qualname__", repr(factory))

    def _leaves(self, params):
        xs, paths, td = T.flatten(params)
        return xs, paths, td

    @contextlib.contextmanager
    def _default_dtype(self, xs):
        """torch's default dtype set to the arrays' dtype (float64 or float32; any other: left as it is),
        restored on exit."""
        torch = self.torch
        dtype = {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32}.get(
            np.result_type(*{np.asarray(x).dtype for x in xs}) if len(xs) else None)
        old = torch.get_default_dtype()
        if dtype is not None:
            torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(old)

    def _build(self, xs, paths):
        torch = self.torch
        ps = [torch.nn.Parameter(torch.from_numpy(to_layout(np.asarray(x), self.layout))) for x in xs]
        given = list(zip(paths, ps)) if reads_names(self.factory) else ps
        try:
            with self._default_dtype(xs):
                opt = self.factory(given, **self.kwargs)
        except Exception as e:
            raise UserCodeError(f"{self.name}(params, **{self.kwargs})", e) from e
        if not isinstance(opt, torch.optim.Optimizer):
            raise ValueError(f"{self.name}(params, **kwargs) returned a {type(opt).__name__}, not a "
                             f"torch.optim.Optimizer (use --framework jax for optax, numpy for init/step)")
        return _TorchState(opt, ps)

    def init(self, params):
        xs, paths, _ = self._leaves(params)
        return self._build(xs, paths)

    def step(self, state, params, grads, **inputs):
        torch = self.torch
        xs, gs, _, td = T.check_like(params, grads)
        memo: dict = {}
        opt = _clone(state.opt, memo)
        ps = [memo.get(id(p), p) for p in state.params]
        with torch.no_grad():
            for p, x in zip(ps, xs):
                p.copy_(torch.from_numpy(to_layout(x, self.layout)))
        for p, g in zip(ps, gs):
            p.grad = torch.from_numpy(to_layout(g, self.layout))
        _refuse_closure_over(opt, state.opt, self.name)
        lrs = [g.get("lr") for g in state.opt.param_groups]
        try:
            with self._default_dtype(xs):
                if "closure" in inputs:  # torch's convention: a closure that re-evaluates at the params
                    opt.step(self._closure(inputs["closure"], ps, td))
                elif "value" in inputs:    # a closure returning the loss (the gradients are set)
                    loss = torch.tensor(float(inputs["value"]))
                    opt.step(lambda: loss)
                else:
                    opt.step()
        except Exception as e:
            raise UserCodeError(f"{self.name}.step()", e) from e
        if [g.get("lr") for g in state.opt.param_groups] != lrs:
            raise UserCodeError(f"{self.name}.step()", RuntimeError(
                "stepping a copy of the optimizer changed the learning rate of the original: a hook or closure "
                "(e.g. an LR scheduler stepped from a step hook) holds the original optimizer, so refopt cannot "
                "replay it; step the scheduler in a step() method of an Optimizer subclass instead"))
        new = [from_layout(p.detach().numpy(), self.layout) for p in ps]
        for p in ps:
            p.grad = None
        return T.unflatten(td, new), _TorchState(opt, ps)

    def _closure(self, fn, ps, td):
        """torch's closure for the step's ``closure`` (refopt's layout, a tree ``td``): it reads the params'
        current values, evaluates, sets every ``.grad`` and returns the loss as a 0-d tensor."""
        torch = self.torch
        fn = in_layout(fn, self.layout, td)

        def closure():
            value, gs = fn(T.unflatten(td, [p.detach().numpy().copy() for p in ps]))
            for p, g in zip(ps, T.flatten(gs)[0]):
                p.grad = torch.from_numpy(np.array(g, copy=True))
            return torch.tensor(float(value))

        return closure

    def state_arrays(self, state) -> dict:
        out: dict[str, list] = {}
        n = len(state.params)
        for i, p in enumerate(state.params):
            for k, v in state.opt.state.get(p, {}).items():
                if isinstance(v, self.torch.Tensor) and v.ndim > 0:
                    # any shape (Adafactor's row_var / col_var); an array with the param's ndim (the param's
                    # shape, or a keepdims reduction of it) is moved to refopt's layout like the param; a
                    # reshaped copy of the param's shape (prodigyopt's flat s and p0, pytorch_optimizer
                    # AdamMini's per-head m) is reshaped to it first
                    a = v.detach().numpy()
                    if v.numel() == p.numel() and tuple(v.shape) != tuple(p.shape):
                        a, v = a.reshape(tuple(p.shape)), p
                    out.setdefault(str(k), [None] * n)[i] = from_layout(a, self.layout) if v.ndim == p.ndim \
                        else np.array(a, copy=True)
        return out

    def checkpoint(self, state):
        return copy.deepcopy(state.opt.state_dict())

    def restore(self, blob, params):
        xs, paths, _ = self._leaves(params)
        st = self._build(xs, paths)
        try:
            st.opt.load_state_dict(copy.deepcopy(blob))
        except Exception as e:
            raise UserCodeError(f"{self.name}.load_state_dict()", e) from e
        return st


# -------------------------------------------------------------------------------------------------
def x64_scope(enabled: bool = True):
    """A context in which JAX keeps float64 (``jax.enable_x64``; ``jax.experimental.enable_x64`` on
    older JAX). The global flag is left as it was."""
    import jax

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(enabled)
    from jax.experimental import enable_x64  # pragma: no cover - older JAX
    return enable_x64(enabled)  # pragma: no cover


class OptaxAdapter(Adapter):
    """A factory ``factory(**kwargs) -> optax.GradientTransformation``."""

    framework = "jax"

    def __init__(self, factory: Callable, kwargs: dict | None = None, layout: str = "refopt",
                 name: str | None = None, jit: bool = True):
        self.jit = jit       # False: run the step eagerly (no compile per new shape; the properties do)
        self.jax = require("jax", "optax")
        self.optax = require("optax", "optax")
        self.factory, self.kwargs = factory, dict(kwargs or {})
        self.layout = _check_layout(layout)
        self.name = name or getattr(factory, "__qualname__", repr(factory))
        self._tx = None
        self._jit = None

    def _scope(self):
        return x64_scope(True)

    def _transform(self):
        if self._tx is None:
            try:
                tx = self.factory(**self.kwargs)
            except Exception as e:
                raise UserCodeError(f"{self.name}(**{self.kwargs})", e) from e
            if not (hasattr(tx, "init") and hasattr(tx, "update")):
                raise ValueError(f"{self.name}(**kwargs) returned a {type(tx).__name__}, not an "
                                 f"optax.GradientTransformation (use --framework torch or numpy)")
            optax = self.optax

            def step(params, state, grads, inputs):
                updates, state = tx.update(grads, state, params, **inputs)
                return optax.apply_updates(params, updates), state

            self._tx, self._jit, self._eager = tx, self.jax.jit(step), step
            # optax's extra arguments (value=...) go to a transformation built to take them only
            self._extra = isinstance(tx, optax.GradientTransformationExtraArgs)
        return self._tx

    def _to_jax(self, xs):
        import jax.numpy as jnp
        return [jnp.asarray(to_layout(np.asarray(x), self.layout)) for x in xs]

    def init(self, params):
        xs, _, _ = T.flatten(params)
        with self._scope():
            tx = self._transform()
            try:
                return tx.init(self._to_jax(xs))
            except Exception as e:
                raise UserCodeError(f"{self.name}(...).init", e) from e

    def step(self, state, params, grads, **inputs):
        xs, gs, _, td = T.check_like(params, grads)
        with self._scope():
            self._transform()
            if "closure" in inputs:
                raise ValueError(f"{self.name}: the closure input (L-BFGS's line search) is handed to torch "
                                 f"(step(closure)) and numpy implementations; optax's value_fn must be a JAX "
                                 f"function, which refopt's numpy model is not")
            extra = {k: float(v) for k, v in inputs.items()} if self._extra else {}
            try:
                fn = self._jit if self.jit else self._eager
                new, state = fn(self._to_jax(xs), state, self._to_jax(gs), extra)
                new = [from_layout(np.asarray(a), self.layout) for a in new]
            except Exception as e:
                raise UserCodeError(f"{self.name}(...).update", e) from e
        _check_returned(f"{self.name}(...).update", xs, new, T.flatten(params)[1])
        return T.unflatten(td, new), state

    def state_arrays(self, state) -> dict:
        out: dict[str, list] = {}
        flat, _ = self.jax.tree_util.tree_flatten_with_path(state)
        groups: dict[str, dict] = {}
        for path, v in flat:
            if not path or getattr(v, "ndim", None) is None:
                continue
            last = path[-1]
            idx = getattr(last, "idx", None)
            if idx is None:
                continue
            name = "".join(_key(k) for k in path[:-1]).lstrip(".") or "state"
            groups.setdefault(name, {})[idx] = v
        for name, d in groups.items():
            n = max(d) + 1
            out[name] = [from_layout(np.asarray(d[i]), self.layout) if i in d else None for i in range(n)]
        return out

    def checkpoint(self, state):
        return self.jax.device_get(state)

    def restore(self, blob, params):
        import jax.numpy as jnp
        with self._scope():
            return self.jax.tree_util.tree_map(jnp.asarray, blob)


def _key(k) -> str:
    for attr in ("name", "key"):
        if hasattr(k, attr):
            return f".{getattr(k, attr)}"
    if hasattr(k, "idx"):
        return f"[{k.idx}]"
    return str(k)


# -------------------------------------------------------------------------------------------------
class NumpyAdapter(Adapter):
    """An object with ``init(params)`` and ``step(state, params, grads) -> (params, state)``."""

    framework = "numpy"

    def __init__(self, impl: Any, layout: str = "refopt", name: str | None = None):
        for m in ("init", "step"):
            if not callable(getattr(impl, m, None)):
                raise ValueError(f"{name or impl!r} has no {m}(); the numpy kind needs init(params) and "
                                 f"step(state, params, grads) -> (params, state)")
        self.impl = impl
        self.layout = _check_layout(layout)
        self.name = name or getattr(impl, "__name__", type(impl).__name__)

    def _to(self, tree):
        """The arrays in the implementation's layout: the caller's arrays themselves in refopt's layout
        (so that :func:`refopt.testing.properties.purity` sees what the implementation writes), new
        transposed arrays in torch's."""
        if self.layout == "refopt":
            return tree
        xs, _, td = T.flatten(tree)
        return T.unflatten(td, [to_layout(np.asarray(x), self.layout) for x in xs])

    def init(self, params):
        try:
            return self.impl.init(self._to(params))
        except Exception as e:
            raise UserCodeError(f"{self.name}.init", e) from e

    def step(self, state, params, grads, **inputs):
        xs, _, paths, td = T.check_like(params, grads)
        try:
            if "closure" in inputs:
                inputs = {**inputs, "closure": in_layout(inputs["closure"], self.layout, td)}
            new, state = self.impl.step(state, self._to(params), self._to(grads), **inputs)
        except Exception as e:
            raise UserCodeError(f"{self.name}.step", e) from e
        out = [from_layout(np.asarray(x), self.layout) for x in T.flatten(new)[0]]
        _check_returned(f"{self.name}.step", xs, out, paths)
        return T.unflatten(td, out), state

    def state_arrays(self, state) -> dict:
        """{entry: per-leaf arrays}: an entry ``name[i]`` of the state (a list with one array per params
        leaf, e.g. ``{"m": [...], "v": [...]}``) is leaf i of ``name``; any other array is its own entry."""
        out: dict[str, list] = {}
        try:
            arrays, paths, _ = T.flatten(state)
        except Exception:
            return out
        groups: dict[str, dict] = {}
        for a, p in zip(arrays, paths):
            if not (isinstance(a, np.ndarray) and a.ndim > 0):
                continue
            m = re.fullmatch(r"(.+)\[(\d+)\]", p)
            if m:
                groups.setdefault(m.group(1), {})[int(m.group(2))] = a
            else:
                out[p] = [np.array(a)]   # a copy: an implementation may write its state in place later
        for name, d in groups.items():
            out[name] = [from_layout(np.asarray(d[i]), self.layout) if i in d else None for i in range(max(d) + 1)]
        return out


# -------------------------------------------------------------------------------------------------
FRAMEWORKS = ("torch", "jax", "numpy")


def make_adapter(impl: Any, kwargs: dict | None = None, framework: str | None = None,
                 layout: str | None = None, name: str | None = None) -> Adapter:
    """The adapter for ``impl``: a refopt rule, or (``framework``) 'torch' (the default for any other
    callable: a ``torch.optim.Optimizer`` subclass or a factory ``impl(params, **kwargs)``), 'jax'
    (``impl(**kwargs)`` returns an optax GradientTransformation; the default for a function defined in optax,
    such as ``optax.polyak_sgd``) or 'numpy' (an object with ``init`` and ``step``). ``layout``: 'torch' or
    'refopt' (default: 'torch' for torch, 'refopt' otherwise).

    Raises: ValueError for an unknown framework or layout, or an object that fits no kind."""
    from refopt.core import Rule

    if isinstance(impl, Rule):
        if kwargs:
            raise ValueError("kwargs do not apply to a refopt rule")
        return RuleAdapter(impl)
    if framework is None:
        if (not callable(impl) or inspect.ismodule(impl)) and callable(getattr(impl, "step", None)):
            framework = "numpy"
        elif (getattr(impl, "__module__", None) or "").split(".")[0] == "optax":
            framework = "jax"
        else:
            framework = "torch"
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    if framework == "torch":
        if not callable(impl):
            raise ValueError(f"{name or impl!r} is not callable: the torch kind needs an Optimizer subclass or a "
                             f"factory NAME(params, **kwargs)")
        return TorchAdapter(impl, kwargs, layout or "torch", name)
    if framework == "jax":
        if not callable(impl):
            raise ValueError(f"{name or impl!r} is not callable: the jax kind needs NAME(**kwargs) -> "
                             f"optax.GradientTransformation")
        return OptaxAdapter(impl, kwargs, layout or "refopt", name)
    if kwargs:
        impl = impl(**kwargs) if callable(impl) and not inspect.ismodule(impl) else impl
    return NumpyAdapter(impl, layout or "refopt", name)


def load_impl(spec: str) -> tuple[Any, str]:
    """``"MODULE:NAME"`` or ``"path/to/file.py:NAME"`` -> (the object, its display name). NAME may be
    dotted (``optax.contrib:muon``, ``mymod:Cls.factory``). Raises ValueError for a malformed spec, a
    missing file or attribute; :class:`UserCodeError` when importing the module raises."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"--impl must be MODULE_OR_FILE.py:NAME, got {spec!r}")
    mod_part, _, name = spec.rpartition(":")
    if not mod_part or not name:
        raise ValueError(f"--impl must be MODULE_OR_FILE.py:NAME, got {spec!r}")
    try:
        if mod_part.endswith(".py"):
            if not os.path.isfile(mod_part):
                raise ValueError(f"--impl: no such file {mod_part}")
            modname = "_refopt_impl_" + os.path.splitext(os.path.basename(mod_part))[0]
            s = importlib.util.spec_from_file_location(modname, mod_part)
            module = importlib.util.module_from_spec(s)
            sys.modules[modname] = module
            s.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_part)
    except ValueError:
        raise
    except ModuleNotFoundError as e:
        if e.name and mod_part.split(".")[0] == e.name:
            raise ValueError(f"--impl: no module named {mod_part!r}") from None
        raise UserCodeError(f"importing {mod_part}", e) from e
    except Exception as e:
        raise UserCodeError(f"importing {mod_part}", e) from e
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--impl: {mod_part} has no attribute {name!r}")
        obj = getattr(obj, part)
    return obj, f"{os.path.basename(mod_part)}:{name}"

