"""refopt.models.mlp: init statistics, plain vs traced evaluation, whole-model gradient vs finite differences."""
import numpy as np
import pytest

from refopt.models import mlp
from refopt.autograd import check_grads, check_grads_per_leaf, value_and_grad


def _data(seed=0, n=7, d=5, k=3):
    r = np.random.default_rng(seed)
    return r.standard_normal((n, d)), r.integers(0, k, n)


@pytest.mark.parametrize("activation", ["relu", "tanh", "gelu"])
def test_whole_mlp_gradient_fd(activation):
    x, y = _data()
    params = mlp.init(1, [5, 6, 4, 3], activation=activation)
    for layer in params["layers"]:  # nonzero biases so their gradients are exercised off the init point
        layer["b"] = np.random.default_rng(2).standard_normal(layer["b"].shape) * 0.1
    assert check_grads(mlp.loss, params, x, y, activation, eps=1e-5) <= 1e-6
    errs = check_grads_per_leaf(mlp.loss, params, x, y, activation, eps=1e-5)
    assert set(errs) == {f"layers[{i}].{n}" for i in range(3) for n in "bw"}


def test_plain_equals_traced():
    x, y = _data(3)
    params = mlp.init(4, [5, 8, 3])
    plain = mlp.loss(params, x, y)
    assert isinstance(plain, np.ndarray)
    v, g = value_and_grad(mlp.loss)(params, x, y)
    assert v == plain
    np.testing.assert_array_equal(mlp.apply(params, x), mlp.apply(params, x))


def test_init_statistics_and_dtype():
    p = mlp.init(0, [400, 300, 10], dtype=np.float32)
    w = p["layers"][0]["w"]
    assert w.dtype == np.float32 and w.shape == (400, 300) and p["layers"][1]["b"].shape == (10,)
    assert abs(w.std() - np.sqrt(2 / 400)) < 0.02 * np.sqrt(2 / 400)  # He init, relu gain sqrt(2)
    assert np.all(p["layers"][0]["b"] == 0)
    p64 = mlp.init(0, [400, 300, 10])
    np.testing.assert_array_equal(p64["layers"][0]["w"].astype(np.float32), w)
    x, y = _data(n=4, d=400, k=10)
    v, g = value_and_grad(mlp.loss)(p, x, y)
    assert np.asarray(v).dtype == np.float32 and g["layers"][0]["w"].dtype == np.float32


def test_errors():
    with pytest.raises(ValueError, match="sizes"):
        mlp.init(0, [5])
    with pytest.raises(ValueError, match="activation"):
        mlp.init(0, [5, 2], activation="elu")
    with pytest.raises(ValueError, match="features"):
        mlp.apply(mlp.init(0, [5, 2]), np.ones((1, 4)))


def test_learns_digits_few_steps():
    """A few full-batch gradient steps on real digits must lower the loss (plain SGD written here)."""
    from refopt.models.data import load_digits
    d = load_digits(np.float64)
    params = mlp.init(0, [64, 32, 10])
    vg = value_and_grad(mlp.loss)
    first = None
    for _ in range(30):
        v, g = vg(params, d.x_train, d.y_train)
        first = v if first is None else first
        params = {"layers": [{k: l[k] - 0.5 * gl[k] for k in l} for l, gl in zip(params["layers"], g["layers"])]}
    assert mlp.loss(params, d.x_train, d.y_train) < 0.5 * first
