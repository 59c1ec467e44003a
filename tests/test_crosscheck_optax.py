"""refopt against optax (CONVENTIONS.md 2): every optax preset at the cross-check tolerances (elementwise,
NAdam and Schedule-Free within rel 1e-12 in float64, Muon within 1e-10; optax's float32-evaluated
Schedule-Free warmup within 1e-6), no gaps left, the wrong presets caught. JAX float64 is enabled by
the adapter. Skipped when optax is not installed (CI installs it)."""
import numpy as np
import pytest

pytest.importorskip("optax", reason="peer optax not installed: pip install jax==0.10.2 jaxlib==0.10.2 optax==0.2.8")

from crosscheck_helpers import assert_caught, assert_passes, ids, presets  # noqa: E402

from refopt.crosscheck.presets import PRESETS, Preset  # noqa: E402
from refopt.crosscheck.run import peer_trajectory, refopt_trajectory  # noqa: E402
from refopt.rules.adam import Adam  # noqa: E402

GOOD = presets("optax")
WRONG = presets("optax", misconfigured=True)
MLP = [p for p in GOOD if p.name in ("optax.sgd(nesterov)", "optax.adamw(wd=0.1)", "optax.contrib.muon",
                                     "optax.contrib.schedule_free_adamw", "optax.ema")]


@pytest.mark.parametrize("preset", GOOD, ids=ids(GOOD))
def test_float64_stream_50_steps(preset):
    r = assert_passes(preset)
    limit = 1e-10 if preset.family == "muon" else preset.tol.float64["params"]
    assert r.params_rel <= limit


@pytest.mark.parametrize("preset", GOOD, ids=ids(GOOD))
def test_float32_stream(preset):
    assert_passes(preset, dtype="float32")


@pytest.mark.parametrize("preset", MLP, ids=ids(MLP))
def test_float64_mlp_real_gradients(preset):
    assert_passes(preset, "mlp")


@pytest.mark.parametrize("preset", WRONG, ids=ids(WRONG))
def test_misconfigured_presets_are_caught(preset):
    assert_caught(preset, factor=100.0)


BY = {p.name: p for p in PRESETS}
NEW_EXACT = ["optax.nadam", "optax.nadamw(wd=0.1)", "optax.contrib.schedule_free_sgd(warmup64,wd)",
             "optax.contrib.schedule_free_adamw(warmup64,wd)"]


def test_no_optax_gaps_left():
    assert not [p.name for p in PRESETS if p.peer == "optax" and p.gap]
    assert BY["optax.nadam"].make_rule().nesterov and BY["optax.nadamw(wd=0.1)"].make_rule().nesterov
    assert BY["optax.contrib.schedule_free_sgd(warmup)"].make_rule().warmup_lag


@pytest.mark.parametrize("name", NEW_EXACT)
def test_new_pairs_float64_mlp_within_1e_12(name):
    """(The stream at 1e-12 is in test_float64_stream_50_steps.)"""
    r = assert_passes(BY[name], "mlp")
    assert r.params_rel <= 1e-12 and r.state_rel <= 1e-12


@pytest.mark.parametrize("name", ["optax.contrib.schedule_free_sgd(warmup)",
                                  "optax.contrib.schedule_free_adamw(warmup)"])
def test_shipping_warmup_call_differs_only_by_optax_float32_schedule(name):
    """optax's own warmup_steps=W computes count/W in float32 (0.5/5 -> 0.099999994): within 1e-6 of refopt
    with warmup_lag=True, not 1e-12; the float64-schedule rows above are exact. Without the lag: >= 0.2."""
    r = assert_passes(BY[name], "quadratic")
    assert 1e-10 < r.params_rel <= 1e-6


def test_nadam_default_adam_is_caught():
    """refopt Adam without nesterov against optax.nadam differs far beyond the tolerance."""
    from dataclasses import replace
    wrong = replace(BY["optax.nadam"], name="nadam vs adam", make_rule=lambda: Adam(lr=1e-2), expect_fail=True)
    assert_caught(wrong, factor=1e6)


def test_schedule_free_warmup_lag_first_step():
    """optax's z-step warmup lags by one step (CONVENTIONS 2.5): its first z-step is lr*0/W = 0, so after
    one step optax's z equals the initial params exactly, and so does refopt's with warmup_lag=True, while
    the FB reference (refopt's default) moved by lr*(1/W)*g."""
    import refopt
    from refopt.rules.schedule_free import ScheduleFreeSGD

    p = BY["optax.contrib.schedule_free_sgd(warmup)"]
    x0 = [np.array([1.0, -2.0])]
    g = [[np.array([0.5, 0.25])]]
    peer = peer_trajectory(p, x0, g, np.float64)
    assert np.array_equal(peer.state[0]["z"][0], x0[0])
    ref, _ = refopt_trajectory(p.make_rule(), x0, g, 1, fields=("z",))
    assert np.array_equal(ref.state[0]["z"][0], x0[0])
    rule = ScheduleFreeSGD(lr=0.5, warmup_steps=5, warmup_lag=True)
    _, state = refopt.update(rule, refopt.init(rule, x0), x0, g[0])
    assert np.array_equal(state.leaves[0].z, x0[0])
    rule = ScheduleFreeSGD(lr=0.5, warmup_steps=5)
    _, state = refopt.update(rule, refopt.init(rule, x0), x0, g[0])
    np.testing.assert_allclose(state.leaves[0].z, x0[0] - 0.5 * (1 / 5) * g[0][0], rtol=1e-15)


def test_ema_is_the_debiased_average_of_the_iterates():
    """PITFALLS B16 numbers through optax.ema fed iterates 10, 10, 4 with decay 0.9: 10, 10, 7.78597..."""
    import jax
    import optax
    with jax.enable_x64(True):   # the adapters scope x64: a direct optax call scopes it too
        ema = optax.ema(0.9, debias=True)
        s = ema.init(np.zeros(1))
        outs = []
        for v in (10.0, 10.0, 4.0):
            o, s = ema.update(np.array([v]), s)
            outs.append(float(o[0]))
    assert outs == pytest.approx([10.0, 10.0, 7.7859778597785985], rel=1e-12)


def test_pitfall_b02_eps_placement_numbers():
    x0 = [np.array([0.0])]
    grads = [[np.array([1e-8])]] * 3
    ref, _ = refopt_trajectory(Adam(lr=1e-3), x0, grads, 3)
    peer = peer_trajectory(Preset("b02", "optax", "adam", ("adam", dict(learning_rate=1e-3)), None, "t"),
                           x0, grads, np.float64)
    for traj in (ref, peer):
        assert traj.params[2][0][0] == pytest.approx(-1.5e-3, rel=1e-9)
