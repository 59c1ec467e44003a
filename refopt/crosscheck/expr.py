r"""Rule expressions: ``"AdamW(lr=1e-3, weight_decay=0.1)"`` -> the refopt rule, parsed safely.

Grammar (a subset of Python expressions, read with :mod:`ast`; nothing is ever evaluated)::

    expr    := call | literal
    call    := NAME "(" [expr ("," expr)*] ["," NAME "=" expr ...] ")"
             | NAME "." like_* "(" ... ")"                  # e.g. Muon.like_torch(lr=0.02)
    literal := number | -number | string | True | False | None | tuple/list/dict of literals

NAME is resolved dynamically, at parse time, among

* refopt's public rule classes: every name in ``refopt.__all__`` bound to a subclass of
  :class:`refopt.core.Rule` (so rules added later, e.g. Lion, work without editing this module), and
  their ``like_*`` preset constructors (``Muon.like_torch``, ``Muon.like_optax``);
* ``like(PEER, **peer_kwargs)`` (:func:`refopt.like`): the rule that reproduces a peer's call, e.g.
  ``like("torch.optim.RMSprop", lr=0.01, centered=True)``;
* the public constructors of :mod:`refopt.schedules` (its ``Schedule`` subclasses and the functions
  returning one, e.g. ``warmup_cosine(3, 20, 0.1)``);
* as bare values, refopt's public label functions (``matrix_labels``, ``gpt_labels``, ``mlp_labels``).

Nested rules are allowed (``Hyperball(Muon(lr=0.02), lr=0.1)``). Anything else -- attribute access
other than ``like_*``, names of variables, operators other than unary minus, lambdas, comprehensions,
subscripts, ``**kwargs`` -- raises :class:`ExprError` (a ValueError) naming the offending piece and its
column, as does a constructor's own ValueError/TypeError (bad hyperparameters).
"""
from __future__ import annotations

import ast
import inspect
from typing import Any, Callable

__all__ = ["ExprError", "parse_rule", "constructors", "to_expr"]


class ExprError(ValueError):
    """The rule expression is malformed, uses something other than literals and known constructors, or
    the constructor rejected its arguments."""


def constructors() -> dict[str, Callable]:
    """{name: constructor} the parser accepts (looked up anew at every call)."""
    import refopt
    from refopt import schedules
    from refopt.core import Rule

    out: dict[str, Callable] = {}
    for name in getattr(refopt, "__all__", []):
        obj = getattr(refopt, name, None)
        if inspect.isclass(obj) and issubclass(obj, Rule) and obj is not Rule:
            out[name] = obj
    base = getattr(schedules, "Schedule", None)
    kinds = {}
    for name in dir(schedules):
        obj = getattr(schedules, name)
        if not name.startswith("_") and inspect.isclass(obj) and base is not None and issubclass(obj, base) \
                and obj is not base:
            kinds[name] = obj
    for name, obj in kinds.items():
        out.setdefault(name, obj)
    out["like"] = refopt.like          # like("torch.optim.RMSprop", lr=0.01): a peer call's refopt rule
    for name in dir(schedules):      # functions building a concrete schedule (e.g. warmup_cosine -> Join)
        obj = getattr(schedules, name)
        if not name.startswith("_") and inspect.isfunction(obj) and obj.__module__ == schedules.__name__ \
                and _returns(obj).strip("'\"") in kinds:
            out.setdefault(name, obj)
    return out


def label_functions() -> dict[str, Callable]:
    """{name: function} of refopt's public parameter-label functions (``matrix_labels``, ``gpt_labels``,
    ...: every function in ``refopt.__all__`` whose name ends in ``_labels`` and that takes (path, array);
    not ``mlp_labels``, which builds a labels tree from the whole params), usable bare as a value,
    e.g. ``Partition({"hidden": Muon(), "other": AdamW()}, labels=matrix_labels)`` (matrix_labels gives
    'hidden' to 2-D arrays, 'other' to the rest)."""
    import refopt

    return {n: getattr(refopt, n) for n in getattr(refopt, "__all__", [])
            if n.endswith("_labels") and callable(getattr(refopt, n, None)) and _takes_path_and_array(getattr(refopt, n))}


def _takes_path_and_array(fn) -> bool:
    """True for a label function ``(path, x) -> label``; False for a builder of a labels tree from the whole
    params (``mlp_labels(params)``), which an expression cannot call on the problem's params."""
    try:
        ps = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    required = [p for p in ps if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) == 2


def _returns(fn) -> str:
    return str(getattr(fn, "__annotations__", {}).get("return", ""))


def _where(node: ast.AST) -> str:
    return f"at column {getattr(node, 'col_offset', 0) + 1}"


def _literal(node: ast.AST, names: dict) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and \
            isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float)) and \
            not isinstance(node.operand.value, bool):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.Tuple, ast.List)):
        vals = [_value(e, names) for e in node.elts]
        return tuple(vals) if isinstance(node, ast.Tuple) else vals
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ExprError(f"'**' inside a dict is not allowed ({_where(node)})")
        return {_literal(k, names): _value(v, names) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Name) and node.id in label_functions():
        return label_functions()[node.id]
    if isinstance(node, ast.Name):
        raise ExprError(f"unknown name {node.id!r} ({_where(node)}); a bare name is not a value: call a "
                        f"constructor, e.g. {node.id}(...), or use a literal")
    raise ExprError(f"{type(node).__name__} is not allowed ({_where(node)}): only literals and calls of "
                    f"refopt rule and schedule constructors")


def _callee(node: ast.AST, names: dict) -> tuple[str, Callable]:
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ExprError(f"unknown constructor {node.id!r} ({_where(node)}); known: {', '.join(sorted(names))}")
        return node.id, names[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("like_"):
        owner = names.get(node.value.id)
        fn = getattr(owner, node.attr, None) if inspect.isclass(owner) else None
        if fn is None or not callable(fn):
            raise ExprError(f"unknown preset {node.value.id}.{node.attr} ({_where(node)})")
        return f"{node.value.id}.{node.attr}", fn
    raise ExprError(f"only refopt rule/schedule constructors (and their like_* presets) may be called "
                    f"({_where(node)})")


def _value(node: ast.AST, names: dict) -> Any:
    if isinstance(node, ast.Call):
        label, fn = _callee(node.func, names)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise ExprError(f"*args / **kwargs are not allowed in {label}(...) ({_where(node)})")
        args = [_value(a, names) for a in node.args]
        kwargs = {k.arg: _value(k.value, names) for k in node.keywords}
        try:
            return fn(*args, **kwargs)
        except (TypeError, ValueError) as e:
            raise ExprError(f"{label}(...): {e}") from None
    return _literal(node, names)


def parse_rule(expr: str):
    """The refopt rule written as ``expr`` (see the module docstring).

    Returns a :class:`refopt.core.Rule`. Raises :class:`ExprError` (a ValueError) for a syntax error, a
    forbidden construct, an unknown name, bad arguments, or an expression that is not a rule."""
    from refopt.core import Rule

    if not isinstance(expr, str) or not expr.strip():
        raise ExprError("the rule expression is empty; e.g. 'AdamW(lr=1e-3, weight_decay=0.1)'")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"cannot parse rule expression {expr!r}: {e.msg} (column {e.offset})") from None
    value = _value(tree.body, constructors())
    if not isinstance(value, Rule):
        raise ExprError(f"{expr!r} is not a refopt rule (it is a {type(value).__name__})")
    return value


def peer_call(expr: str) -> tuple[str, dict] | None:
    """(PEER, kwargs) when ``expr`` is a call ``like("PEER", **kwargs)`` at its top level, else None (the
    plug-in cross-check then pairs the state as that peer names it, :meth:`PeerMapping.state_map`).
    Raises :class:`ExprError` as :func:`parse_rule` for a bad expression."""
    try:
        node = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "like"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return None
    names = constructors()
    return node.args[0].value, {k.arg: _value(k.value, names) for k in node.keywords if k.arg is not None}


def to_expr(value: Any) -> str:
    """A rule expression for ``value`` (a rule, schedule or literal) that :func:`parse_rule` reads back
    to an equal rule; fields at their default are left out. Raises ExprError for a value that has no
    expression (a lambda schedule, a label function)."""
    import dataclasses

    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        inner = ", ".join(to_expr(v) for v in value)
        return f"({inner},)" if isinstance(value, tuple) and len(value) == 1 else \
            (f"({inner})" if isinstance(value, tuple) else f"[{inner}]")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{to_expr(k)}: {to_expr(v)}" for k, v in value.items()) + "}"
    for name, fn in label_functions().items():
        if value is fn:
            return name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if constructors().get(name) is not type(value):
            raise ExprError(f"{name} is not a public refopt constructor")
        parts = []
        for f in dataclasses.fields(value):
            if not f.init:
                continue
            v = getattr(value, f.name)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if default is not dataclasses.MISSING and _same(v, default):
                continue
            parts.append(f"{f.name}={to_expr(v)}")
        return f"{name}({', '.join(parts)})"
    raise ExprError(f"{type(value).__name__} value {value!r} has no rule expression")


def _same(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False
