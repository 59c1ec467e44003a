"""Every numba kernel agrees with the plain-numpy twin next to it (the twins are the kernels' spec)."""
import numpy as np
import pytest

import refopt
from oracles import adam_reference, sf_adamw_reference, sgd_reference

from refopt.conventions import oracle

TOL = {np.float64: 1e-14, np.float32: 1e-6}


def _data(dtype, shape=(7, 5), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


def _close(a, b, dtype):
    assert a.dtype == b.dtype == dtype
    np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("rule", [refopt.SGD(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
                                  refopt.SGD(lr=0.1, momentum=0.9, nesterov=True)])
def test_sgd_kernel_matches_twin(dtype, rule):
    x, g1, g2 = _data(dtype)
    s = refopt.init(rule, x)
    b = s.leaves.b
    for t, g in ((1, g1), (2, g2)):
        x_ref, b = sgd_reference(x, g, b, t, rule)
        x, s = refopt.update(rule, s, x, g)
        _close(x, x_ref, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("rule", [refopt.Adam(lr=0.1, weight_decay=0.01), refopt.AdamW(lr=0.1, weight_decay=0.1)])
def test_adam_kernel_matches_twin(dtype, rule):
    x, g1, g2 = _data(dtype)
    s = refopt.init(rule, x)
    m, v = s.leaves.m, s.leaves.v
    for t, g in ((1, g1), (2, g2)):
        x_ref, m, v = adam_reference(x, g, m, v, t, rule)
        x, s = refopt.update(rule, s, x, g)
        _close(x, x_ref, dtype)
        _close(s.leaves.v, v, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_wrapper_kernels_match_twins(dtype):
    """Covariant, Hyperball and Average against their plain-numpy oracles (refopt/conventions/)."""
    x, g, _ = _data(dtype)
    base = refopt.SGD(lr=1.0)  # direction u = g
    for rule in (refopt.Covariant(base, lr=0.05), refopt.Hyperball(base, lr=0.05), refopt.Average(refopt.SGD(lr=0.1))):
        o = oracle(rule)
        xs, s, xo, so = x, refopt.init(rule, x), x, o.init(x)
        for _ in range(2):
            xs, s = refopt.update(rule, s, xs, g)
            xo, so = o.step(so, xo, g)
            _close(xs, xo, dtype)
        if isinstance(rule, refopt.Average):
            _close(refopt.eval_params(rule, s, xs), o.state_arrays(so)["mu"][0], dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_schedule_free_adamw_kernel_matches_twin(dtype):
    rule = refopt.ScheduleFreeAdamW(lr=0.01, warmup_steps=2, weight_decay=0.1)
    y, g1, g2 = _data(dtype)
    s = refopt.init(rule, y)
    z, x, v = s.leaves.z, s.leaves.x, s.leaves.v
    glob = s.glob
    for t, g in ((1, g1), (2, g2)):
        ctx, glob = rule.context(t, glob)
        y_ref, z, x, v = sf_adamw_reference(y, g, z, x, v, ctx, rule)
        y, s = refopt.update(rule, s, y, g)
        _close(y, y_ref, dtype)
        _close(s.leaves.x, x, dtype)
