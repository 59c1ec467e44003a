"""AdEMAMix and Simplified AdEMAMix written from their papers on three steps; the paper's alpha and beta3
warmups at their end points; negative controls: a bias-corrected slow EMA, an averaged simplified momentum."""
import math

import numpy as np
import pytest

import refopt
from refopt.rules.ademamix import alpha_warmup, beta3_warmup


def ademamix(x0, gs, lr, b1, b2, b3, alpha, eps, wd, T=None, slow_bc=False):
    x, m1, m2, v = x0.copy(), 0 * x0, 0 * x0, 0 * x0
    for t, g in enumerate(gs, start=1):
        a_t = alpha if T is None else min(t * alpha / T, alpha)
        # the paper's beta3 scheduler: the half-life ln(1/2)/ln(beta) - 1 interpolated linearly from beta1
        hl = lambda b: math.log(0.5) / math.log(b) - 1       # noqa: E731
        b3_t = b3 if T is None else min(0.5 ** (1 / ((1 - t / T) * hl(b1) + (t / T) * hl(b3) + 1)), b3)
        m1 = b1 * m1 + (1 - b1) * g
        m2 = b3_t * m2 + (1 - b3_t) * g
        v = b2 * v + (1 - b2) * g ** 2
        slow = m2 / (1 - b3 ** t) if slow_bc else m2
        x = x - lr * ((m1 / (1 - b1 ** t) + a_t * slow) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * x)
    return x


@pytest.mark.parametrize("T", [None, 2])
def test_ademamix_three_steps_from_the_algorithm(T):
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal(7)
    gs = [rng.standard_normal(7) for _ in range(3)]
    kw = dict(lr=0.02, b1=0.8, b2=0.95, b3=0.99, alpha=4.0, eps=1e-8, wd=0.1, T=T)
    rule = refopt.AdEMAMix(lr=0.02, beta1=0.8, beta2=0.95, beta3=0.99, alpha=4.0, weight_decay=0.1, warmup=T)
    x, s = x0, refopt.init(rule, x0)
    for g in gs:
        x, s = refopt.update(rule, s, x, g)
    np.testing.assert_allclose(x, ademamix(x0, gs, **kw), rtol=1e-14, atol=1e-15)
    assert np.max(np.abs(ademamix(x0, gs, **kw, slow_bc=True) - x)) > 1e-2
    if T is not None:     # the warmup changes the step
        assert np.max(np.abs(ademamix(x0, gs, **{**kw, "T": None}) - x)) > 1e-3


def test_warmups_at_their_end_points():
    assert alpha_warmup(0, 8.0, 100) == 0.0 and alpha_warmup(50, 8.0, 100) == 4.0 and alpha_warmup(500, 8.0, 100) == 8.0
    assert math.isclose(beta3_warmup(0, 0.9, 0.9999, 100), 0.9, rel_tol=1e-15)
    assert math.isclose(beta3_warmup(100, 0.9, 0.9999, 100), 0.9999, rel_tol=1e-15)
    assert beta3_warmup(10 ** 6, 0.9, 0.9999, 100) == 0.9999
    # linear in the half-life -1/ln(beta): halfway, 1/ln(beta) is the mean of the ends' 1/ln
    mid = beta3_warmup(50, 0.9, 0.9999, 100)
    assert math.isclose(1 / math.log(mid), 0.5 / math.log(0.9) + 0.5 / math.log(0.9999), rel_tol=1e-13)


def simplified(x0, gs, lr, b1, b2, alpha, eps, wd, average=False):
    x, m, v = x0.copy(), 0 * x0, 0 * x0
    for t, g in enumerate(gs, start=1):
        m = b1 * m + ((1 - b1) if average else 1.0) * g
        v = b2 * v + (1 - b2) * g ** 2
        x = x - lr * ((m + alpha * g) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * x)
    return x


def test_simplified_ademamix_three_steps():
    rng = np.random.default_rng(6)
    x0 = rng.standard_normal(7)
    gs = [rng.standard_normal(7) for _ in range(3)]
    kw = dict(lr=1e-3, b1=0.9, b2=0.99, alpha=2.0, eps=1e-8, wd=0.05)
    rule = refopt.SimplifiedAdEMAMix(lr=1e-3, beta1=0.9, beta2=0.99, alpha=2.0, weight_decay=0.05)
    x, s = x0, refopt.init(rule, x0)
    for g in gs:
        x, s = refopt.update(rule, s, x, g)
    np.testing.assert_allclose(x, simplified(x0, gs, **kw), rtol=1e-14, atol=1e-15)
    assert np.max(np.abs(simplified(x0, gs, **kw, average=True) - x)) > 1e-4


def test_simplified_with_alpha_zero_and_beta1_zero_is_rmsprop_like():
    """beta1 = 0, alpha = 0: the step is g / (sqrt(v_hat) + eps), Adam with beta1 = 0 (a closed form)."""
    rng = np.random.default_rng(1)
    x0, g1, g2 = (rng.standard_normal(5) for _ in range(3))
    a = refopt.SimplifiedAdEMAMix(lr=0.1, beta1=0.0, beta2=0.9)
    b = refopt.Adam(lr=0.1, beta1=0.0, beta2=0.9)
    xa, sa, xb, sb = x0, refopt.init(a, x0), x0, refopt.init(b, x0)
    for g in (g1, g2):
        xa, sa = refopt.update(a, sa, xa, g)
        xb, sb = refopt.update(b, sb, xb, g)
    np.testing.assert_allclose(xa, xb, rtol=1e-14)


def test_ademamix_bad_input():
    for bad in (dict(beta3=1.0), dict(alpha=-1.0), dict(eps=0.0), dict(warmup=0), dict(warmup=2.5),
                dict(weight_decay=-1.0)):
        with pytest.raises(ValueError):
            refopt.AdEMAMix(**bad)
    with pytest.raises(ValueError):
        refopt.SimplifiedAdEMAMix(beta1=1.0)
    with pytest.raises(ValueError, match="warmup"):
        refopt.like("optax.contrib.ademamix", learning_rate=0.1, alpha=lambda c: c)
    with pytest.raises(ValueError, match="mask"):
        refopt.like("optax.contrib.simplified_ademamix", learning_rate=0.1, mask=lambda p: p)
    assert refopt.like("optax.contrib.ademamix", learning_rate=0.1, b3=0.999) == refopt.AdEMAMix(lr=0.1, beta3=0.999)


def test_beta3_and_alpha_warmup_forms_of_the_packages_and_the_paper():
    """The paper (Sec. 3) and pytorch_optimizer 4.1.0: beta3_t = min(exp(ln b1 ln b3 / ((1 - t/T) ln b3 + (t/T) ln b1)),
    b3), alpha_t = min(t alpha / T, alpha); heavyball 3.2.1: the same with b + 1e-8 inside the logs and b3 itself for
    t >= T; optax.contrib.ademamix: constants (a schedule of its own, read at count t - 1)."""
    b1, b3, T, alpha = 0.8, 0.99, 7, 3.0
    paper = lambda t: min(math.exp(math.log(b1) * math.log(b3) / ((1 - t / T) * math.log(b3)   # noqa: E731
                                                                  + (t / T) * math.log(b1))), b3)
    hb = lambda t: b3 if t >= T else math.exp(math.log(b1 + 1e-8) * math.log(b3 + 1e-8) / (   # noqa: E731
        (1 - t / T) * math.log(b3 + 1e-8) + (t / T) * math.log(b1 + 1e-8)))
    po = pytest.importorskip("pytorch_optimizer")
    heavyball_utils = pytest.importorskip("heavyball.utils")
    for t in (1, 3, 6, 7, 20):
        assert beta3_warmup(t, b1, b3, T) == paper(t)
        assert beta3_warmup(t, b1, b3, T, "heavyball") == hb(t)
        assert po.AdEMAMix.schedule_beta3(T, t, b1, b3) == paper(t)
        assert heavyball_utils.linear_hl_warmup_scheduler(t, beta_end=b3, beta_start=b1, warmup=T) == hb(t)
        assert alpha_warmup(t, alpha, T) == po.AdEMAMix.schedule_alpha(T, t, alpha)
        # heavyball: (t / T) alpha, not t alpha / T: the same to an ulp
        hb_alpha = heavyball_utils.linear_warmup_scheduler(t, alpha_end=alpha, alpha_start=0.0, warmup=T)
        assert hb_alpha == pytest.approx(alpha_warmup(t, alpha, T), rel=1e-15, abs=0)
        if t < T:    # the 1e-8 inside the logs moves beta3_t by about 1e-8 / (b ln b)
            assert 1e-10 < abs(hb(t) - paper(t)) < 1e-6
        else:
            assert hb(t) == paper(t) == b3
    assert beta3_warmup(1, b1, b3, None) == b3       # optax's constant b3


def test_like_refuses_what_the_rule_cannot_express():
    from refopt.conventions import like
    with pytest.raises(ValueError, match="storage_dtype"):
        like("heavyball.AdEMAMix", lr=0.01)
    with pytest.raises(ValueError, match="differ"):
        like("heavyball.AdEMAMix", beta3_warmup=5, alpha_warmup=3, storage_dtype="float64")
    with pytest.raises(ValueError, match="cautious decay"):
        like("heavyball.AdEMAMix", cautious_weight_decay=True, storage_dtype="float64")
    assert isinstance(like("heavyball.AdEMAMix", caution=True, storage_dtype="float64"), refopt.Cautious)
    with pytest.raises(ValueError, match="L2"):
        like("pytorch_optimizer.AdEMAMix", weight_decay=0.1)
    with pytest.raises(ValueError, match="fixed_decay"):
        like("pytorch_optimizer.AdEMAMix", weight_decay=0.1, weight_decouple=True, fixed_decay=True)
    with pytest.raises(ValueError, match="whole number"):
        like("pytorch_optimizer.AdEMAMix", t_alpha_beta3=2.5)
    r = like("heavyball.AdEMAMix", storage_dtype="float64", beta3_warmup=4, alpha_warmup=4)
    assert (r.alpha, r.warmup, r.warmup_form, r.eps_form) == (2.0, 4, "heavyball", "max")
    assert like("pytorch_optimizer.AdEMAMix", t_alpha_beta3=4.0) == refopt.AdEMAMix(warmup=4)


def test_eps_form_max_and_bad_forms():
    x0, g = np.array([1.0, 2.0]), np.array([1e-9, 3.0])
    r = refopt.AdEMAMix(lr=0.1, eps=1e-3, eps_form="max")
    x, _ = refopt.update(r, refopt.init(r, x0), x0, g)
    np.testing.assert_allclose(x, x0 - 0.1 * (1 + 5 * (1 - 0.9999)) * g / np.maximum(np.abs(g), 1e-3), rtol=1e-13)
    for bad in (dict(eps_form="clamp"), dict(warmup_form="optax")):
        with pytest.raises(ValueError):
            refopt.AdEMAMix(**bad)
