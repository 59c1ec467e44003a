"""The cautious mask written from Algorithm 1 of Liang et al. 2024 (mask u g > 0, rescale n / (k + 1)) and from
heavyball's sign-bit form, in plain Python per entry; negative controls: no rescale, the other mask, no mask.
The sign-bit form is checked against heavyball's own ``caution`` on the cases where the two forms differ."""
import math

import numpy as np
import pytest

import refopt
from tree_steps import run


def _lion_cautious(x0, gs, lr, b1, b2, wd, form="product", rescale=True, mask=True):
    """Lion's direction under the mask, per entry over a flat list, decay before the step."""
    x, m = list(x0), [0.0] * len(x0)
    for g in gs:
        u = [math.copysign(1.0, c) if c != 0 else 0.0 for c in ((1 - b1) * gi + b1 * mi for gi, mi in zip(g, m))]
        m = [b2 * mi + (1 - b2) * gi for mi, gi in zip(m, g)]
        n = len(u)
        if form == "product":
            keep = [ui * gi > 0 for ui, gi in zip(u, g)]
            f = n / (sum(keep) + 1)
        else:
            keep = [math.copysign(1, ui) == math.copysign(1, gi) for ui, gi in zip(u, g)]
            f = n / max(sum(keep), 1)
        if not rescale:
            f = 1.0
        if mask:
            u = [ui * f if k else 0.0 for ui, k in zip(u, keep)]
        x = [(1 - lr * wd) * xi - lr * ui for xi, ui in zip(x, u)]
    return np.array(x)


def _data(seed=2, n=9, steps=5):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n), [rng.standard_normal(n) for _ in range(steps)]


@pytest.mark.parametrize("form", ["product", "signbit"])
def test_lion_under_the_mask_from_the_algorithm(form):
    x0, gs = _data()
    rule = refopt.Cautious(refopt.Lion(beta1=0.8, beta2=0.95), lr=0.01, weight_decay=0.1, mask=form)
    want = _lion_cautious(x0, gs, 0.01, 0.8, 0.95, 0.1, form)
    np.testing.assert_allclose(run(rule, x0, gs)[0], want, rtol=1e-15, atol=1e-16)


def test_negative_controls_are_caught():
    x0, gs = _data()
    got = run(refopt.Cautious(refopt.Lion(beta1=0.8, beta2=0.95), lr=0.01, weight_decay=0.1), x0, gs)[0]
    for wrong in (dict(rescale=False), dict(mask=False), dict(wd=0.0)):
        kw = dict(lr=0.01, b1=0.8, b2=0.95, wd=0.1)
        kw.update({k: v for k, v in wrong.items() if k == "wd"})
        want = _lion_cautious(x0, gs, **kw, **{k: v for k, v in wrong.items() if k != "wd"})
        assert np.max(np.abs(got - want)) > 1e-4


def test_the_two_masks_differ_at_zeros_and_in_the_rescale():
    from refopt.rules.cautious import cautious_mask
    u = np.array([1.0, -1.0, 0.0, 2.0])
    g = np.array([3.0, 1.0, 0.0, 1.0])
    # product: u g > 0 keeps entries 0 and 3 (k = 2), n / (k + 1) = 4/3; signbit keeps 0, 2 and 3, 4/3 too
    np.testing.assert_array_equal(cautious_mask(u, g, "product"), u * np.array([1, 0, 0, 1]) * (4 / 3))
    np.testing.assert_array_equal(cautious_mask(u, g, "signbit"), u * np.array([1, 0, 1, 1]) * (4 / 3))
    # nothing agrees: product gives 0 (n / 1 times nothing), signbit 0 too
    assert not cautious_mask(np.array([1.0, -1.0]), np.array([-1.0, 1.0]), "signbit").any()
    assert cautious_mask(np.ones(3), np.ones(3), "product").tolist() == [0.75] * 3     # n / (n + 1)
    assert cautious_mask(np.ones(3), np.ones(3), "signbit").tolist() == [1.0] * 3


def test_signbit_mask_is_heavyballs_caution():
    torch = pytest.importorskip("torch")
    hb = pytest.importorskip("heavyball")
    from refopt.rules.cautious import cautious_mask
    rng = np.random.default_rng(0)
    for _ in range(5):
        u, g = rng.standard_normal(12), rng.standard_normal(12)
        u[:2], g[1:3] = 0.0, -0.0
        want = hb.utils.caution(torch.tensor(g), torch.tensor(u)).numpy()
        keep = np.signbit(u) == np.signbit(g)
        f = u.size / max(int(keep.sum()), 1)
        # heavyball divides two integer tensors: its rescale is a float32 number, also for float64 arrays
        np.testing.assert_array_equal(want, np.where(keep, u, 0.0) * float(np.float32(f)))
        np.testing.assert_allclose(cautious_mask(u, g, "signbit"), want, rtol=1e-7, atol=0)
        assert np.array_equal(cautious_mask(u, g, "signbit") != 0, want != 0)


def test_float32_stays_float32_and_bad_inputs():
    x0, gs = _data()
    rule = refopt.Cautious(refopt.Adam(), lr=0.01)
    x = run(rule, x0.astype(np.float32), [g.astype(np.float32) for g in gs])[0]
    assert x.dtype == np.float32
    for bad in (dict(lr=-1.0), dict(weight_decay=-0.1), dict(mask="sign")):
        with pytest.raises(ValueError):
            refopt.Cautious(refopt.Lion(), **bad)
    with pytest.raises(ValueError, match="weight_decay"):
        refopt.Cautious(refopt.Lion(weight_decay=0.1))          # decay goes on the wrapper
    with pytest.raises(ValueError, match="schedule"):
        refopt.Cautious(refopt.Lion(schedule=lambda t: 1.0))


def test_like_pytorch_optimizer_lion():
    assert refopt.like("pytorch_optimizer.Lion", lr=1e-3, betas=(0.8, 0.95), weight_decay=0.1, cautious=True) == \
        refopt.Cautious(refopt.Lion(beta1=0.8, beta2=0.95), lr=1e-3, weight_decay=0.1)
    for kw, what in ((dict(cautious=False), "refopt.Lion"), (dict(cautious=True, use_gc=True), "use_gc"),
                     (dict(cautious=True, weight_decay=0.1, fixed_decay=True), "fixed_decay")):
        with pytest.raises(ValueError, match=what):
            refopt.like("pytorch_optimizer.Lion", **kw)


def test_like_heavyball_caution():
    r = refopt.like("heavyball.AdEMAMix", lr=1e-2, weight_decay=0.05, storage_dtype="float64", caution=True)
    assert isinstance(r, refopt.Cautious) and r.mask == "signbit" and (r.lr, r.weight_decay) == (1e-2, 0.05)
    assert r.base.weight_decay == 0 and r.base.eps_form == "max" and r.base.alpha == 2.0
    from refopt.conventions.ademamix import HEAVYBALL
    assert HEAVYBALL.match(r)["caution"] is True and HEAVYBALL.match(r.base)["caution"] is False
    with pytest.raises(ValueError, match="cautious decay"):
        refopt.like("heavyball.AdEMAMix", storage_dtype="float64", caution=True, cautious_weight_decay=True)


def _heavyball_caution_rows(misconfigured):
    from crosscheck_helpers import presets
    return [p for p in presets("heavyball", misconfigured) if "caution" in p.name]


@pytest.mark.parametrize("preset", _heavyball_caution_rows(False), ids=lambda p: p.name)
def test_heavyball_caution_row_agrees(preset):
    pytest.importorskip("heavyball", reason="peer heavyball not installed: pip install -e .[peers]")
    from crosscheck_helpers import assert_passes
    r = assert_passes(preset)
    assert r.params_rel <= 1e-12
    assert_passes(preset, "mlp")
    assert_passes(preset, dtype="float32")


@pytest.mark.parametrize("preset", _heavyball_caution_rows(True), ids=lambda p: p.name)
def test_heavyball_caution_with_the_product_mask_is_caught(preset):
    pytest.importorskip("heavyball", reason="peer heavyball not installed: pip install -e .[peers]")
    from crosscheck_helpers import assert_caught
    assert_caught(preset)
