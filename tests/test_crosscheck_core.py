"""The cross-check machinery without any peer installed: the preset table, the problems, the
comparison figures (against hand-computed values), the 'peer not installed' paths and the CLI."""
import argparse

import numpy as np
import pytest

from refopt.crosscheck import peers
from refopt.crosscheck.presets import ALL_PEERS, FAMILIES, MISCONFIGURED, PRESETS, select
from refopt.crosscheck.problems import make_problem
from refopt.crosscheck.run import Trajectory, check, compare, run_preset


def test_preset_table_is_well_formed():
    names = [p.name for p in PRESETS + MISCONFIGURED]
    assert len(names) == len(set(names))
    for p in PRESETS + MISCONFIGURED:
        assert p.peer in ALL_PEERS and p.layout in ("same", "transpose") and p.why
        assert p.describe_peer().startswith({"torch": "torch.optim."}.get(p.peer, f"{p.peer}."))
        if p.make_rule is None:
            assert p.gap, p.name          # a preset without a refopt rule must say why
        else:
            p.make_rule()                 # constructs without error
    assert all(p.expect_fail for p in MISCONFIGURED) and not any(p.expect_fail for p in PRESETS)
    # every peer rule of docs/crosscheck.md has a row
    need = {"torch.SGD", "torch.Adam", "torch.AdamW", "torch.Muon", "torch.Muon(match_rms_adamw)", "optax.sgd",
            "optax.adam", "optax.adamw", "optax.nadam", "optax.contrib.muon", "optax.contrib.schedule_free_sgd",
            "optax.contrib.schedule_free_adamw", "optax.ema", "schedulefree.SGDScheduleFreeReference",
            "schedulefree.AdamWScheduleFreeReference"}
    assert need <= set(names)


def test_default_weight_decays_follow_the_peers():
    by = {p.name: p for p in PRESETS}
    assert by["torch.AdamW"].make_rule().weight_decay == 1e-2     # torch AdamW default
    assert by["optax.adamw"].make_rule().weight_decay == 1e-4     # optax adamw default
    assert "weight_decay" not in by["torch.AdamW"].peer_call[1]  # the peer runs with its own default
    assert "weight_decay" not in by["optax.adamw"].peer_call[1]
    m = by["torch.Muon"].make_rule()
    assert (m.scale, m.eps_mode, m.norm_eps, m.weight_decay, m.nesterov_mode) == ("jordan", "clamp", 1e-7, 0.1,
                                                                                  "standard")
    m = by["optax.contrib.muon"].make_rule()
    assert (m.scale, m.eps_mode, m.norm_eps, m.nesterov_mode) == ("jordan", "add", 1e-8, "bias_corrected")
    assert by["torch.Muon"].layout == "transpose" and by["optax.contrib.muon"].layout == "same"


def test_select_filters_and_rejects_unknown_names():
    assert {p.peer for p in select("torch")} == {"torch"}
    assert {p.family for p in select("all", ["adam", "muon"])} == {"adam", "muon"}
    assert len(select("all", misconfigured=True)) == len(PRESETS) + len(MISCONFIGURED)
    with pytest.raises(ValueError, match="against"):
        select("jax")
    with pytest.raises(ValueError, match="unknown rule family 'no_such_family'"):   # ('lion', 'adagrad' are families)
        select("all", ["no_such_family"])
    assert {p.family for p in select("all", ["lion", "clip"])} == {"lion", "clip"}
    assert "nadam" in FAMILIES
    assert select("all", ["Adam", "SF_SGD"]) == select("all", ["adam", "sf_sgd"])   # as the reports print them


@pytest.mark.parametrize("name", ["stream", "quadratic"])
def test_problems_are_deterministic_and_typed(name):
    a = make_problem(name, np.float64, seed=3)
    b = make_problem(name, np.float64, seed=3)
    c = make_problem(name, np.float32, seed=3)
    for x, y, z in zip(a.leaves, b.leaves, c.leaves):
        assert np.array_equal(x, y) and z.dtype == np.float32
        np.testing.assert_allclose(z, x, rtol=1e-6)
    ga, gb = a.grad(a.leaves, 2), b.grad(b.leaves, 2)
    assert all(np.array_equal(x, y) for x, y in zip(ga, gb))
    m = make_problem(name, np.float64, seed=3, matrix_only=True)
    assert all(x.ndim == 2 for x in m.leaves)


def test_stream_has_a_tiny_leaf_and_both_orientations():
    p = make_problem("stream")
    shapes = dict(zip(p.paths, (x.shape for x in p.leaves)))
    assert shapes["w"] == (6, 12) and shapes["v"] == (12, 6)
    g = dict(zip(p.paths, p.grad(p.leaves, 1)))
    assert 1e-9 < np.abs(g["tiny"]).max() < 1e-7      # near Adam's eps (PITFALLS B02)


def test_quadratic_gradient_is_h_times_offset():
    p = make_problem("quadratic", seed=0)
    g0 = p.grad(p.leaves, 1)
    shifted = [x + 1.0 for x in p.leaves]
    g1 = p.grad(shifted, 1)
    # g(x + 1) - g(x) = h > 0 elementwise, h in [0.1, 10]
    for a, b in zip(g0, g1):
        h = b - a
        assert h.min() >= 0.1 - 1e-12 and h.max() <= 10 + 1e-12


def test_mlp_problem_gives_real_gradients():
    pytest.importorskip("sklearn")
    p = make_problem("mlp", np.float64, seed=0)
    assert p.paths == ["layers[0].b", "layers[0].w", "layers[1].b", "layers[1].w"]
    g = dict(zip(p.paths, p.grad(p.leaves, 1)))
    # the digits have always-zero pixels: their rows of the first layer's gradient are exactly 0
    w0 = g["layers[0].w"]
    assert np.any(np.all(w0 == 0, axis=1)) and np.abs(w0).max() > 0
    # softmax cross-entropy: the last bias gradient is mean(softmax - onehot), which sums to 0
    assert abs(g["layers[1].b"].sum()) < 1e-15
    from refopt.models import mlp
    assert np.array_equal(mlp.init(0, [64, 16, 10])["layers"][0]["w"], p.leaves[1])
    m = make_problem("mlp", np.float64, seed=0, matrix_only=True)
    assert m.paths == ["layers[0].w", "layers[1].w"]


def test_compare_figures_match_hand_computation():
    x0 = [np.array([1.0, -2.0])]
    ref = Trajectory([[np.array([1.5, -2.0])], [np.array([2.0, -1.0])]], [])
    peer = Trajectory([[np.array([1.5, -2.0 + 1e-3])], [np.array([2.0, -1.0 - 2e-3])]], [])
    fig = compare(ref, peer, x0, ["w"])
    assert fig["params_abs"] == pytest.approx(2e-3)
    assert fig["params_rel"] == pytest.approx(max(1e-3 / 2.0, 2e-3 / 2.0))
    # step 2: du_ref = (0.5, 1.0); du_peer = (0.5, 1.0 - 3e-3) -> 3e-3 / sqrt(1.25)
    # step 1: du_ref = (0.5, 0); du_peer = (0.5, 1e-3) -> 1e-3 / 0.5 = 2e-3
    assert fig["update_rel"] == pytest.approx(max(3e-3 / np.sqrt(1.25), 2e-3))
    assert fig["state_rel"] is None
    assert check(fig, {"params": 1.01e-3}) == [] and check(fig, {"params": 1e-4})
    assert "update" in check(fig, {"update": 1e-3})[0]


def test_compare_state_and_exact_match():
    x0 = [np.zeros(3)]
    s = [{"m": [np.array([1.0, 2.0, 4.0])]}]
    fig = compare(Trajectory([[np.ones(3)]], s), Trajectory([[np.ones(3)]], [{"m": [np.array([1.0, 2.0, 4.5])]}]),
                  x0, ["w"])
    assert fig["params_abs"] == 0 and fig["params_rel"] == 0 and fig["update_rel"] == 0
    assert fig["state_abs"] == pytest.approx(0.5) and fig["state_rel"] == pytest.approx(0.5 / 4.0)


def _pretend_missing(monkeypatch, peer):
    real = peers.available

    def fake(name):
        if name == peer:
            return False, f"peer {peer!r} is not installed (x missing); install it with: {peers.INSTALL[peer]}"
        return real(name)
    monkeypatch.setattr(peers, "available", fake)


def test_missing_peer_is_a_skip_with_the_install_command(monkeypatch):
    _pretend_missing(monkeypatch, "torch")
    r = run_preset(next(p for p in PRESETS if p.peer == "torch"), steps=2)
    assert r.status == "skip" and "pip install torch==2.13.0" in r.message and not r.failed


def test_require_names_the_peer_and_the_pip_command():
    with pytest.raises(peers.PeerNotInstalled, match=r"peer 'optax' is not installed .*pip install"):
        peers.require("refopt_no_such_module_xyz", "optax")
    assert "torch==2.13.0" in peers.INSTALL["schedulefree"]      # never an unpinned torch


def test_gap_rows_are_reported_not_failed():
    from refopt.crosscheck.presets import Preset

    p = Preset("optax.fake_gap", "optax", "nadam", ("nadam", {}), None, "t", gap="refopt has no such rule")
    r = run_preset(p, steps=2)
    assert r.status == "gap" and "no such rule" in r.message and not r.failed


def _cli(argv):
    from refopt.cli import crosscheck
    p = argparse.ArgumentParser()
    crosscheck.add_arguments(p)
    return crosscheck.run(p.parse_args(argv))


def test_cli_missing_requested_peer_exits_2_with_a_clear_message(monkeypatch, capsys):
    _pretend_missing(monkeypatch, "optax")
    assert _cli(["--against", "optax", "--steps", "2"]) == 2
    assert "pip install jax==0.10.2 jaxlib==0.10.2 optax==0.2.8" in capsys.readouterr().err


def test_cli_rejects_bad_steps():
    with pytest.raises(ValueError, match="--steps"):
        _cli(["--steps", "0"])


def test_wrong_presets_are_not_run_where_they_coincide_with_the_right_one():
    from refopt.rules.muon import muon_scale
    wrong = next(p for p in MISCONFIGURED if p.name.startswith("WRONG scale"))
    # on the quadratic's (5, 8) matrix the wrong scale IS the right number: nothing to catch there
    assert muon_scale((5, 8), "spectral") == muon_scale((5, 8), "jordan")
    assert muon_scale((12, 6), "spectral") != muon_scale((12, 6), "jordan")
    r = run_preset(wrong, "quadratic", steps=2)
    assert r.status == "skip" and "wide (5, 8)" in r.message and not r.failed
