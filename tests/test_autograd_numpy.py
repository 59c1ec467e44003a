"""NumPy inside a loss: NumPy functions on traced values run refopt's primitives;
the primitives behind them (where, maximum, minimum, clip, abs, sqrt, log1p, expm1, square) have the gradients of
their equations (central differences away from kinks) and jax.grad's conventions at ties and kinks; a
hand-written gradient can be checked without giving up a keyword name."""
from __future__ import annotations

import numpy as np
import pytest

import refopt
import refopt.autograd as ag

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
jax.config.update("jax_enable_x64", True)


def _grad(f, x):
    return ag.grad(lambda p: ag.sum(f(p)))(np.asarray(x, dtype=np.float64))


def _jax_grad(f, x):
    return np.asarray(jax.grad(lambda p: jnp.sum(f(p)))(jnp.asarray(x, dtype=jnp.float64)))


# refopt primitive, numpy spelling (through dispatch), jax spelling; the points include the kinks/ties
CASES = {
    "abs": (ag.abs, np.abs, jnp.abs, [-2.0, -0.0, 0.0, 0.5, 3.0]),
    "sqrt": (ag.sqrt, np.sqrt, jnp.sqrt, [0.25, 1.0, 4.0]),
    "log1p": (ag.log1p, np.log1p, jnp.log1p, [-0.5, 1e-10, 0.0, 3.0]),
    "expm1": (ag.expm1, np.expm1, jnp.expm1, [-3.0, 1e-10, 0.0, 2.0]),
    "square": (ag.square, np.square, jnp.square, [-2.0, 0.0, 1.5]),
    "maximum": (lambda x: ag.maximum(x, 1.0), lambda x: np.maximum(x, 1.0), lambda x: jnp.maximum(x, 1.0),
                [0.0, 1.0, 2.0]),
    "maximum_self": (lambda x: ag.maximum(x, x * 1.0), lambda x: np.maximum(x, x * 1.0),
                     lambda x: jnp.maximum(x, x * 1.0), [0.5, 2.0]),
    "minimum": (lambda x: ag.minimum(1.0, x), lambda x: np.minimum(1.0, x), lambda x: jnp.minimum(1.0, x),
                [0.0, 1.0, 2.0]),
    "clip": (lambda x: ag.clip(x, -1.0, 1.0), lambda x: np.clip(x, -1.0, 1.0), lambda x: jnp.clip(x, -1.0, 1.0),
             [-2.0, -1.0, 0.0, 1.0, 2.0]),
    "where": (lambda x: ag.where(x > 0, x * x, -x), lambda x: np.where(x > 0, x * x, -x),
              lambda x: jnp.where(x > 0, x * x, -x), [-1.0, 0.0, 2.0]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_match_jax(name):
    f_ag, f_np, f_jax, xs = CASES[name]
    x = np.array(xs)
    expected = _jax_grad(f_jax, x)
    for f in (f_ag, f_np):
        np.testing.assert_array_equal(ag.value_and_grad(lambda p: ag.sum(f(p)))(x)[1], expected)
        np.testing.assert_allclose(f(x), np.asarray(f_jax(jnp.asarray(x))), rtol=1e-15, atol=0)


def test_tie_conventions_written_out():
    """The documented values, independent of jax: max/min ties 1/2 each, clip 1/2 at a bound, |x|'(0) = 1."""
    np.testing.assert_array_equal(_grad(lambda x: ag.maximum(x, 1.0), [1.0]), [0.5])
    g = ag.grad(lambda p: ag.sum(ag.maximum(p["a"], p["b"])))({"a": np.array([1.0, 2.0]), "b": np.array([1.0, 0.0])})
    np.testing.assert_array_equal(g["a"], [0.5, 1.0])
    np.testing.assert_array_equal(g["b"], [0.5, 0.0])
    np.testing.assert_array_equal(_grad(lambda x: ag.clip(x, 0.0, 1.0), [-1, 0, 0.5, 1, 2]), [0, 0.5, 1, 0.5, 0])
    np.testing.assert_array_equal(_grad(ag.abs, [-1.0, 0.0, 1.0]), [-1.0, 1.0, 1.0])


def test_negative_control_a_wrong_tie_rule_is_caught():
    """A maximum that sends the whole cotangent to the first operand at ties (relu-like) differs from
    jax.grad at the tie: the comparison above would catch it."""
    def wrong_max(x, y):
        return ag.where(x >= y, x, y * np.ones_like(ag.value(x)))

    x = np.array([1.0])
    assert not np.array_equal(_grad(lambda p: wrong_max(p, 1.0), x), _jax_grad(lambda p: jnp.maximum(p, 1.0), x))


@pytest.mark.parametrize("name", ["abs", "sqrt", "log1p", "expm1", "square", "maximum", "minimum", "clip", "where"])
def test_gradients_match_central_differences_away_from_kinks(name):
    f_ag = CASES[name][0]
    x = np.array([-1.7, -0.3, 0.35, 0.8, 1.6, 2.4]) if name not in ("sqrt", "log1p") else \
        np.array([0.3, 0.9, 2.5]) if name == "sqrt" else np.array([-0.6, 0.3, 2.5])
    ag.check_grads(lambda p: ag.sum(f_ag(p) * np.arange(1.0, len(x) + 1)), x, rtol=1e-8)


def test_where_nan_convention_and_the_double_where_idiom():
    x = np.array([-1.0, 0.0, 4.0])
    with np.errstate(invalid="ignore", divide="ignore"):
        plain = _grad(lambda p: ag.where(p > 0, ag.sqrt(p), 0.0), x)
        plain_jax = _jax_grad(lambda p: jnp.where(p > 0, jnp.sqrt(p), 0.0), x)
    # NaN at x <= 0 from 0 * sqrt'(x) (sqrt'(0) = inf, sqrt'(-1) = NaN), exactly as jax.grad
    np.testing.assert_array_equal(plain, plain_jax)
    assert np.isnan(plain[:2]).all() and plain[2] == 0.25
    safe = _grad(lambda p: ag.where(p > 0, ag.sqrt(ag.where(p > 0, p, 1.0)), 0.0), x)
    safe_np = _grad(lambda p: np.where(p > 0, np.sqrt(np.where(p > 0, p, 1.0)), 0.0), x)
    safe_jax = _jax_grad(lambda p: jnp.where(p > 0, jnp.sqrt(jnp.where(p > 0, p, 1.0)), 0.0), x)
    np.testing.assert_array_equal(safe, [0.0, 0.0, 0.25])
    np.testing.assert_array_equal(safe_np, safe_jax)


def test_numpy_in_a_teachers_loss():
    """np.mean, np.log1p, np.where, np.maximum, np.sum, np.clip, ndarray (op) Node in one loss."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((20, 3)), rng.integers(0, 2, 20) * 2.0 - 1.0

    def loss_np(p):
        z = X @ p["w"] + p["b"]
        hinge = np.maximum(0.0, 1.0 - y * z)
        logistic = np.log1p(np.exp(-np.clip(y * z, -30.0, 30.0)))
        return np.mean(np.where(y > 0, hinge, logistic)) + 0.1 * np.sum(np.square(p["w"]))

    def loss_ag(p):
        z = ag.matmul(X, p["w"]) + p["b"]
        hinge = ag.maximum(0.0, 1.0 - y * z)
        logistic = ag.log1p(ag.exp(-ag.clip(y * z, -30.0, 30.0)))
        return ag.mean(ag.where(y > 0, hinge, logistic)) + 0.1 * ag.sum(ag.square(p["w"]))

    p = {"w": rng.standard_normal(3), "b": np.array(0.1)}
    v1, g1 = ag.value_and_grad(loss_np)(p)
    v2, g2 = ag.value_and_grad(loss_ag)(p)
    assert v1 == v2 and all(np.array_equal(g1[k], g2[k]) for k in p)
    assert v1 == loss_np(p)                       # the same function runs untraced on plain arrays
    ag.check_grads(loss_np, p, rtol=1e-7)


def test_float32_stays_float32():
    x = np.array([0.5, 1.0, 2.0], np.float32)
    for f in (np.log1p, np.expm1, np.square, np.abs, np.sqrt, lambda a: np.maximum(a, 1.0),
              lambda a: np.clip(a, 0.7, 1.5), lambda a: np.where(a > 1, a, 2.0 * a)):
        v, g = ag.value_and_grad(lambda p: np.mean(f(p)))(x)
        assert v.dtype == np.float32 and g.dtype == np.float32


@pytest.mark.parametrize("call, needle", [
    (lambda x: np.sin(x), "numpy.sin is not a differentiable"),
    (lambda x: np.cumsum(x), "numpy.cumsum is not a differentiable"),
    (lambda x: np.add.reduce(x), "np.add.reduce|add.reduce"),
    (lambda x: np.exp(x, out=np.empty(3)), "out"),
    (lambda x: np.mean(x, dtype=np.float32), "dtype"),
    (lambda x: np.asarray(x), "drop the gradient"),
    (lambda x: np.array([x, x]), "drop the gradient|not a differentiable"),
])
def test_unsupported_numpy_names_the_missing_primitive(call, needle):
    with pytest.raises(TypeError, match=needle):
        ag.value_and_grad(lambda p: ag.sum(call(p)))(np.ones(3))
    try:
        ag.value_and_grad(lambda p: ag.sum(np.sin(p)))(np.ones(3))
    except TypeError as e:
        assert "np.log1p" in str(e) and "np.where" in str(e)        # lists what is differentiable


@pytest.mark.parametrize("call, needle", [
    (lambda x: float(ag.sum(x)), r"float\(x\) on a traced Node .* drop the gradient"),
    (lambda x: int(ag.sum(x)), r"int\(x\) on a traced Node"),
    (lambda x: ag.sum(x).item(), r"x\.item\(\) on a traced Node .* refopt\.autograd\.value"),
    (lambda x: x.tolist(), r"x\.tolist\(\) on a traced Node"),
    (lambda x: 2.0 ** x, r"c \*\* x .* only constant exponents .* np\.exp\(x \* np\.log\(c\)\)"),
    (lambda x: x ** x, "the exponent must be a constant"),
    (lambda x: x.__setitem__(0, 1.0), r"in-place assignment\) .* np\.where\(mask"),
    (lambda x: np.linalg.norm(x), r"numpy\.linalg\.norm is not a differentiable"),
])
def test_operations_a_node_refuses_raise_the_documented_type_error(call, needle):
    """float(node), node.item(), 2.0 ** node ... raise the TypeError that lists what a Node supports (they
    raised Python's own 'float() argument must be ...', AttributeError 'item', 'unsupported operand')."""
    with pytest.raises(TypeError, match=needle) as e:
        ag.value_and_grad(lambda p: ag.sum(call(p)))(np.ones(3))
    assert "np.log1p" in str(e.value) and "np.where" in str(e.value)
    assert float(ag.sum(np.ones(3))) == 3.0                      # untraced values are plain numbers


def test_a_missing_node_attribute_lists_what_is_supported():
    with pytest.raises(AttributeError, match=r"no attribute 'std'.* x\.mean.* np\.tanh"):
        ag.value_and_grad(lambda p: p.std())(np.ones(3))
    seen = []
    ag.value_and_grad(lambda p: seen.append((hasattr(p, "std"), hasattr(p, "_x"), hasattr(p, "mean"))) or ag.sum(p))(
        np.ones(3))
    assert seen == [(False, False, True)]                        # hasattr works on a traced Node
    x = np.array([1.0, 4.0])                                     # c ** x written as exp(x log c) does differentiate
    np.testing.assert_allclose(ag.grad(lambda p: ag.sum(np.exp(p * np.log(2.0))))(x), np.log(2.0) * 2.0 ** x,
                               rtol=1e-15)


def test_comparisons_give_plain_boolean_arrays():
    def f(p):
        mask = (p > 0) & (p <= 2) & np.isfinite(p)
        assert isinstance(mask, np.ndarray) and mask.dtype == bool
        return ag.sum(ag.where(mask, p, 0.0))

    np.testing.assert_array_equal(ag.grad(f)(np.array([-1.0, 1.0, 3.0])), [0.0, 1.0, 0.0])


def test_check_grad_fn_keeps_every_keyword_for_the_users_function():
    def f(p, X, grad=1.0, eps=0.0, rtol=2.0, seed=3):   # the user's keywords, including check_grads' names
        return grad * np.sum(np.tanh(X @ p["w"])) + eps + rtol + seed

    def grad_f(p, X, grad=1.0, eps=0.0, rtol=2.0, seed=3):
        return {"w": grad * X.T @ (1 - np.tanh(X @ p["w"]) ** 2)}

    X = np.random.default_rng(1).standard_normal((5, 3))
    p = {"w": np.array([0.1, -0.2, 0.3])}
    kw = {"grad": 2.0, "eps": 5.0, "rtol": 7.0, "seed": 9}
    assert refopt.check_grad_fn(f, grad_f, p, args=(X,), kwargs=kw) < 1e-8
    assert ag.check_grad_fn(f, grad_f, p, (X,)) < 1e-8

    def wrong(p, X, grad=1.0, **_):                      # negative control: the factor 'grad' forgotten
        return {"w": X.T @ (1 - np.tanh(X @ p["w"]) ** 2)}

    with pytest.raises(AssertionError, match=r"check_grad_fn: relative error .* worst leaves: w"):
        refopt.check_grad_fn(f, wrong, p, args=(X,), kwargs=kw)
    with pytest.raises(ValueError, match="shape"):
        refopt.check_grad_fn(f, lambda p, X: {"w": np.ones(2)}, p, args=(X,))
    with pytest.raises(ValueError):
        refopt.check_grad_fn(f, lambda p, X: {"v": np.ones(3)}, p, args=(X,))


def test_check_grads_fails_on_nan():
    """A NaN relative error (NaN gradient or value) fails the check (``nan > rtol`` is False, so a plain
    ``err > rtol`` test would pass it)."""
    with np.errstate(invalid="ignore"):
        with pytest.raises(AssertionError, match="nan"):
            ag.check_grads(lambda p: ag.sum(np.log1p(p)), np.array([-2.0, 0.5]))
        with pytest.raises(AssertionError, match="nan"):
            ag.check_grads_per_leaf(lambda p: ag.sum(np.log1p(p["a"])), {"a": np.array([-2.0, 0.5])})
