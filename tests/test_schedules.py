"""Schedules: PITFALLS B17 numbers, zero-length phases, clamping, validation, ELR (post 000), configs."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refopt.schedules import (ELR, WSD, Constant, CosineDecay, Join, LinearDecay, LinearWarmup, Product,
                              from_config, to_config, warmup_cosine)


def values(s, T):
    return [s(t) for t in range(1, T + 1)]


# --- PITFALLS B17 ------------------------------------------------------------------------------------

def test_b17_warmup_then_cosine_floor():
    expected = [0.25, 0.5, 0.75, 1.0, 0.939711431703, 0.775, 0.55, 0.325, 0.160288568297, 0.1]
    got = values(warmup_cosine(4, 10, floor=0.1), 10)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    s = warmup_cosine(4, 10, floor=0.1)
    assert s(1) > 0
    assert s(4) == 1.0            # peak exactly at the end of warmup
    assert s(10) == 0.1           # floor exactly at the last step


def test_b17_wsd():
    expected = [0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0]
    got = values(WSD(warmup_steps=2, decay_steps=8, total_steps=10), 10)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-15)
    assert got[1] == 1.0 and got[-1] == 0.0


def test_b17_rejects_zero_based_bug_pattern():
    bug = [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25]   # 0-indexed step/W, W=4, stable to 6, D=4
    ours = values(WSD(4, 4, 10), 10)
    assert ours == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert ours != bug and ours[0] > 0


def test_b17_cosine_floor_is_not_a_clamp():
    s = warmup_cosine(0, 20, floor=0.5)
    got = np.array(values(s, 20))
    p = np.arange(1, 21) / 20
    np.testing.assert_allclose(got, 0.5 + 0.5 * 0.5 * (1 + np.cos(np.pi * p)), rtol=0, atol=1e-15)
    assert np.all(np.diff(got) < 0)            # no flat tail
    clamp = np.maximum(0.5 * (1 + np.cos(np.pi * p)), 0.5)
    assert np.max(np.abs(got - clamp)) > 0.1


def test_zero_length_phases():
    assert LinearWarmup(0)(1) == 1.0
    assert WSD(0, 5, 10)(1) == 1.0                              # W = 0: lr(1) = peak
    assert values(WSD(3, 0, 10), 12) == [1 / 3, 2 / 3] + [1.0] * 10   # D = 0: constant after warmup
    assert values(WSD(10, 0, 10), 11) == [t / 10 for t in range(1, 11)] + [1.0]   # W = T, no division by 0
    assert values(warmup_cosine(10, 10, 0.1), 10) == [t / 10 for t in range(1, 11)]
    np.testing.assert_allclose(values(WSD(4, 6, 10), 10),
                               [0.25, 0.5, 0.75, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0.0], atol=1e-15)
    assert LinearDecay(0, final=0.3)(1) == 0.3 and CosineDecay(0, floor=0.2)(5) == 0.2


def test_clamped_after_horizon():
    for s, T in [(warmup_cosine(4, 10, 0.1), 10), (WSD(2, 8, 10), 10), (WSD(2, 8, 10, final=0.2, decay="cosine"), 10),
                 (ELR(10, 0.5, 0.1), 10), (LinearDecay(7, 0.0), 7)]:
        end = s(T)
        assert [s(T + k) for k in (1, 2, 1000)] == [end] * 3
        assert end >= 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, True, "3", None])
def test_bad_step_raises(bad):
    with pytest.raises(ValueError):
        WSD(2, 8, 10)(bad)


def test_numpy_integer_step_accepted():
    assert WSD(2, 8, 10)(np.int64(3)) == 0.875


@pytest.mark.parametrize("make", [
    lambda: LinearWarmup(-1), lambda: LinearWarmup(2.5), lambda: LinearWarmup(3, start=1.5),
    lambda: LinearDecay(3, final=-0.1), lambda: CosineDecay(3, floor=float("nan")), lambda: Constant(-1.0),
    lambda: WSD(6, 5, 10), lambda: WSD(1, 1, 0), lambda: WSD(1, 1, 10, decay="exp"), lambda: WSD(1, 1, 10, final=2),
    lambda: warmup_cosine(11, 10), lambda: warmup_cosine(1, 10, floor=1.5),
    lambda: ELR(0, 0.1, 0.1), lambda: ELR(10, 1.0, 0.1), lambda: ELR(10, 0.5, -1.0),
    lambda: Join(()), lambda: Join(((0, Constant()),)), lambda: Join(((2, lambda t: 1.0),)),
    lambda: Join(((-1, Constant()),)),
    lambda: Product(()), lambda: Product((Constant(), 3)),
])
def test_constructor_validation(make):
    with pytest.raises(ValueError):
        make()


# --- building blocks ---------------------------------------------------------------------------------

def test_warmup_start_and_decays():
    np.testing.assert_allclose(values(LinearWarmup(4, start=0.2), 5), [0.4, 0.6, 0.8, 1.0, 1.0], atol=1e-15)
    np.testing.assert_allclose(values(LinearDecay(4, final=0.2), 5), [0.8, 0.6, 0.4, 0.2, 0.2], atol=1e-15)
    np.testing.assert_allclose(values(CosineDecay(2, floor=0.0), 3), [0.5, 0.0, 0.0], atol=1e-15)
    assert Constant(0.3)(99) == 0.3


def test_join_and_product():
    s = Join(((2, Constant(0.5)), (0, Constant(9.0)), (3, LinearDecay(3))))
    np.testing.assert_allclose(values(s, 7), [0.5, 0.5, 2 / 3, 1 / 3, 0.0, 0.0, 0.0], atol=1e-15)
    assert s.total_steps == 5
    tail = Join(((3, Constant(0.5)), (0, Constant(9.0))))     # held at the last non-empty phase's end
    assert tail(10) == 0.5
    p = Product((LinearWarmup(2), Constant(0.5)))
    assert values(p, 3) == [0.25, 0.5, 0.5]


def test_elr_seed000():
    T, c0, c1 = 100, 0.8, 0.05
    s = ELR(T, c0, c1)
    t = np.arange(1, T + 1)
    oracle = (1 - t / T) / np.sqrt(1 - c0 * np.exp(-c1 * t)) * math.sqrt(1 - c0)
    np.testing.assert_allclose(values(s, T), oracle, rtol=1e-13, atol=1e-16)
    got = np.array(values(s, T))
    assert got[-1] == 0.0 and np.all(np.diff(got) < 0) and np.all(got < 1 - t / T + 1e-300)
    # proportional to the seed's ELR curve: the ratio to (1-t/T)/sqrt(1-c0 e^{-c1 t}) is constant
    ratio = got[:-1] / ((1 - t[:-1] / T) / np.sqrt(1 - c0 * np.exp(-c1 * t[:-1])))
    np.testing.assert_allclose(ratio, math.sqrt(1 - c0), rtol=1e-13)
    # c0 = 0 is the plain linear decay
    np.testing.assert_allclose(values(ELR(T, 0.0, c1), T), 1 - t / T, atol=1e-15)
    e = ELR.from_adamw(T, lr=1e-3, weight_decay=0.1, init_rms=0.02)
    assert e.c0 == pytest.approx(1 - 3 * 0.1 * 0.02 ** 2 / 1e-3) and e.c1 == pytest.approx(1e-4)
    with pytest.raises(ValueError):
        ELR.from_adamw(T, lr=0.0, weight_decay=0.1, init_rms=0.02)


def test_config_round_trip_is_json_and_exact():
    scheds = [Constant(0.5), LinearWarmup(3, 0.1), LinearDecay(4, 0.2), CosineDecay(5, 0.1), ELR(10, 0.3, 0.2),
              WSD(2, 8, 10, final=0.1, decay="cosine"), warmup_cosine(4, 10, 0.1),
              Product((LinearWarmup(2), ELR(20, 0.5, 0.1)))]
    for s in scheds:
        d = json.loads(json.dumps(to_config(s)))
        back = from_config(d)
        assert back == s and hash(back) == hash(s)
        assert values(back, 25) == values(s, 25)
    with pytest.raises(ValueError):
        from_config({"name": "Nope"})
    with pytest.raises(ValueError):
        from_config({"name": "WSD", "warmup_steps": 1})
    assert "WSD(warmup_steps=2" in repr(WSD(2, 8, 10))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30), st.floats(0, 1),
       st.sampled_from(["linear", "cosine"]))
def test_wsd_shape_property(w, d, extra, final, decay):
    T = max(w + d + extra, 1)
    s = WSD(w, d, T, final=final, decay=decay)
    g = np.array(values(s, T + 2))
    assert np.all(np.isfinite(g)) and np.all(g > 0 if final > 0 else g >= 0) and np.all(g <= 1.0)
    assert np.all(g[w:] >= final - 1e-15)
    assert g[0] > 0 or (d == T and final == 0 and T == 1)
    if w > 0:
        assert g[w - 1] == 1.0 and np.all(np.diff(g[:w]) > 0)
    assert np.all(np.diff(g[max(w - 1, 0):]) <= 1e-15)
    assert g[T - 1] == (final if d > 0 else 1.0)
    assert g[T] == g[T + 1] == g[T - 1]
