"""PSGD Kron against an oracle written with dense Kronecker algebra (numpy's kron and inverse in place of the rule's
per-axis products and triangular solves), closed forms of the first step (Q_0 = I: the step is the clipped debiased
momentum plus the probe's perturbation), the fit's counter and balance draws, negative controls for each oracle
switch, bad input, the kron_torch mapping and its rows through docs/factories/psgd_kron.py with supplied probes."""

import numpy as np
import pytest

import refopt
from refopt.rules.psgd_kron import EPS32, PSGDKron
from tree_steps import last_params, run

NEEDS_PEER = "peer kron_torch not installed: pip install -e .[peers]"


def _stream(shape, steps=8, seed=5):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), [rng.standard_normal(shape) for _ in range(steps)]


@pytest.mark.parametrize("shape, kw", [((4, 6), {}), ((5,), {}), ((3, 7), dict(memory_save_mode="smart_one_diag")),
                                       ((4, 4), dict(memory_save_mode="all_diag", weight_decay=0.1)),
                                       ((6, 3), dict(update_probability=0.4, precond_init_scale=0.5))])
def test_psgd_kron_matches_the_dense_kronecker_oracle(shape, kw):
    from refopt.conventions.psgd_kron import PSGDKronOracle
    from refopt.testing.adapters import RuleAdapter
    rule = PSGDKron(lr=0.05, beta1=0.8, precond_lr=0.3, **kw)
    x0, gs = _stream(shape, steps=25)       # balance_seed 42 balances at step 20
    np.testing.assert_allclose(last_params(PSGDKronOracle(rule), x0, gs), last_params(RuleAdapter(rule), x0, gs),
                               rtol=1e-11, atol=1e-13)


def test_the_first_step_closed_form():
    """Q_0 = I and the fit at step 1: h = g + sqrt(eps32) mean|g| v, A = h, B = v, each factor I - lr_P triu(H H^T -
    V V^T) / lb; with precond_lr tiny the step is lr h clipped at RMS 1.1."""
    x0, (g,) = _stream((3, 4), steps=1)
    rule = PSGDKron(lr=0.1, beta1=0.0, precond_lr=1e-14)
    x, _ = run(rule, x0, [g])
    h = g + np.sqrt(EPS32) * np.mean(np.abs(g)) * rule.probe(1, "<root>", (3, 4), np.float64)
    u = h * min(1.0, 1.1 / (np.sqrt(np.mean(h * h)) + 1e-12))
    np.testing.assert_allclose(x, x0 - 0.1 * u, rtol=1e-12, atol=1e-14)


def test_the_fit_counter_and_the_balance_draws():
    from refopt.rules.psgd_kron import balance_draws
    import random
    r = random.Random(42)
    assert balance_draws(42, 25) == [r.random() for _ in range(25)]
    fits = []
    rule, glob = PSGDKron(update_probability=0.4), PSGDKron().init_global()
    for t in range(1, 10):
        c, glob = rule.context(t, glob)
        fits.append(c.update)
        assert c.balance == (t == 20)
    assert fits == [False, False, True] * 3      # counter >= 1 / 0.4 = 2.5: every third step


@pytest.mark.parametrize("switch", [dict(perturb_step=False), dict(clip=False), dict(triu=False),
                                    dict(decay="before_clip")])
def test_each_convention_changes_the_trajectory(switch):
    from refopt.conventions.psgd_kron import PSGDKronOracle
    rule = PSGDKron(lr=0.05, precond_lr=0.5, weight_decay=0.5)
    x0, gs = _stream((4, 5), steps=10)
    ours = last_params(PSGDKronOracle(rule), x0, [10 * g for g in gs])
    assert np.abs(last_params(PSGDKronOracle(rule, **switch), x0, [10 * g for g in gs]) - ours).max() > 1e-6


def test_psgd_kron_bad_input_and_probes():
    for kw, match in [(dict(lr=-1.0), "lr"), (dict(beta1=1.0), "beta1"), (dict(update_probability=0.0), "update_pr"),
                      (dict(update_probability=1.5), "update_probability"), (dict(memory_save_mode="x"), "memory"),
                      (dict(precond_lr=0.0), "precond_lr"), (dict(max_size_triangular=0), "max_size"),
                      (dict(probe_seed=-1), "probe_seed"), (dict(balance_seed=1.5), "balance_seed")]:
        with pytest.raises(ValueError, match=match):
            PSGDKron(**kw)
    with pytest.raises(ValueError, match=r"1 or 2 axes; the parameter at c has shape \(2, 2, 2\)"):
        refopt.init(PSGDKron(), {"c": np.zeros((2, 2, 2))})
    r = PSGDKron()
    assert np.array_equal(r.probe(3, "w", (2, 3), np.float64), r.probe(3, "w", (2, 3), np.float64))
    assert not np.array_equal(r.probe(3, "w", (2, 3), np.float64), r.probe(3, "v", (2, 3), np.float64))
    x, s = run(r, np.ones((3, 2), np.float32), [np.ones((3, 2), np.float32)] * 2)
    assert x.dtype == s.leaves.m.dtype == s.leaves.q[0].dtype == np.float32


def test_like_kron_torch():
    from refopt.conventions.psgd_kron import KronTorchSchedule
    r = refopt.like("kron_torch.Kron", lr=0.01, preconditioner_update_probability=0.5)
    assert r == PSGDKron(lr=0.01, update_probability=0.5)
    assert refopt.like("kron_torch.Kron").update_probability == KronTorchSchedule()
    assert KronTorchSchedule()(0) == 1 and np.isclose(KronTorchSchedule()(2000), np.exp(-1.5), rtol=1e-6)
    for kw, match in [(dict(momentum_into_precond_update=False), "momentum_into"), (dict(mu_dtype="x"), "mu_dtype"),
                      (dict(preconditioner_update_probability=2.0), "preconditioner_update_probability")]:
        with pytest.raises(ValueError, match=match):
            refopt.like("kron_torch.Kron", **kw)


def _factory():
    from crosscheck_helpers import load_factory
    return load_factory("psgd_kron")


def test_kron_torch_through_the_factory_with_supplied_probes():
    pytest.importorskip("kron_torch", reason=NEEDS_PEER)
    import torch

    import kron_torch.kron as module
    from refopt.crosscheck.plugin import check_impl
    f = _factory()
    kw = dict(lr=0.01, b1=0.8, weight_decay=0.05, precond_lr=0.2, precond_init_scale=0.5)
    rule = refopt.like("kron_torch.Kron", **kw)
    r = check_impl(f.psgd_kron, rule, kwargs=kw, framework="torch", problems=("stream", "gpt"), diagnose=False)
    assert r.agree and all(p.tier == "exact" and p.params_rel <= 1e-12 for p in r.problems), r.report()
    assert module.torch is torch and hasattr(module._update_precond, "_torchdynamo_orig_callable")   # restored
    # other probes than the package's are caught, by far
    wrong = PSGDKron(**{**rule.hyperparameters(), "probe_seed": 1})
    r = check_impl(f.psgd_kron, wrong, kwargs=kw, framework="torch", problems=("stream",), diagnose=False)
    assert not r.agree and r.problems[0].params_rel > 1e-4, r.report()


def _presets(misconfigured=False):
    from crosscheck_helpers import presets
    return presets("kron_torch", misconfigured, family="psgd_kron")


@pytest.mark.parametrize("preset", _presets(), ids=[p.name for p in _presets()])
def test_kron_torch_rows_agree(preset):
    pytest.importorskip("kron_torch", reason=NEEDS_PEER)
    from crosscheck_helpers import assert_passes
    assert assert_passes(preset).params_rel <= 1e-12


@pytest.mark.parametrize("preset", _presets(True), ids=[p.name for p in _presets(True)])
def test_kron_torch_wrong_rows_are_caught(preset):
    pytest.importorskip("kron_torch", reason=NEEDS_PEER)
    from crosscheck_helpers import assert_caught
    assert_caught(preset)
