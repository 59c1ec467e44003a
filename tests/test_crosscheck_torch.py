"""refopt against torch.optim (CONVENTIONS.md 1): every torch preset at the cross-check tolerances, the
deliberately wrong presets caught, and the PITFALLS B02 / B05 numbers reproduced by both sides.
Skipped (with the reason) when torch is not installed; CI installs torch==2.13.0."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="peer torch not installed: pip install torch==2.13.0")

from crosscheck_helpers import assert_caught, assert_passes, ids, presets  # noqa: E402

from refopt.crosscheck.presets import Preset  # noqa: E402
from refopt.crosscheck.run import peer_trajectory, refopt_trajectory  # noqa: E402
from refopt.rules.adam import Adam, AdamW  # noqa: E402

#: L-BFGS's rows run closed loop, float64 only, on the problems with a loss, at their own tier: tests/test_lbfgs.py
GOOD = [p for p in presets("torch") if p.family != "lbfgs"]
WRONG = [p for p in presets("torch", misconfigured=True) if p.family != "lbfgs"]


@pytest.mark.parametrize("preset", GOOD, ids=ids(GOOD))
def test_float64_stream_50_steps(preset):
    r = assert_passes(preset)
    if preset.family != "muon":
        assert r.params_rel <= 1e-12 and (r.state_rel is None or r.state_rel <= 1e-12)


@pytest.mark.parametrize("preset", GOOD, ids=ids(GOOD))
def test_float64_mlp_real_gradients(preset):
    assert_passes(preset, "mlp")


@pytest.mark.parametrize("preset", GOOD, ids=ids(GOOD))
def test_float32_stream(preset):
    assert_passes(preset, dtype="float32")


def test_gpt_real_gradients_adamw_and_muon():
    by = {p.name: p for p in GOOD}
    assert_passes(by["torch.AdamW"], "gpt", steps=20)
    assert_passes(by["torch.Muon"], "gpt", steps=20)


@pytest.mark.parametrize("preset", WRONG, ids=ids(WRONG))
def test_misconfigured_presets_are_caught(preset):
    # at least 5x the tolerance: the bf16 Muon tolerance still separates scale, layout, sign and momentum
    assert_caught(preset, factor=5.0)


def test_torch_muon_bf16_state_is_exact_but_step_is_not():
    """The momentum buffer is float64 on both sides (exact); the step carries torch's bf16 NS error."""
    r = assert_passes(next(p for p in GOOD if p.name == "torch.Muon"))
    assert r.state_rel < 1e-14
    assert 1e-3 < r.update_rel < 0.06      # bf16 is visibly there, and within the derived tolerance


def _torch_preset(ctor, **kw):
    return Preset("ad hoc", "torch", "adam", (ctor, kw), None, "test")


def test_pitfall_b05_adamw_numbers():
    """PITFALLS B05: theta_0 = 1, g = 0.5 then -0.25, lr = 0.1, wd = 0.1 -> 0.890000002, 0.8544662986878463."""
    x0 = [np.array([1.0])]
    grads = [[np.array([0.5])], [np.array([-0.25])]]
    ref, _ = refopt_trajectory(AdamW(lr=0.1, weight_decay=0.1), x0, grads, 2)
    peer = peer_trajectory(_torch_preset("AdamW", lr=0.1, weight_decay=0.1), x0, grads, np.float64)
    for traj in (ref, peer):
        assert traj.params[0][0][0] == pytest.approx(0.890000002, rel=1e-15, abs=1e-15)
        assert traj.params[1][0][0] == pytest.approx(0.8544662986878463, rel=1e-14)
    # the decay-after-step bug gives 0.89100000198: far outside
    assert abs(peer.params[0][0][0] - 0.89100000198) > 9e-4


def test_pitfall_b02_eps_placement_numbers():
    """PITFALLS B02: constant g = 1e-8, lr = 1e-3, eps = 1e-8, 3 steps: every step is lr*g/(g+eps) =
    5e-4, p_3 = -1.5e-3 (the eps-hat form would give -1.2535358402830757e-4)."""
    x0 = [np.array([0.0])]
    grads = [[np.array([1e-8])]] * 3
    ref, _ = refopt_trajectory(Adam(lr=1e-3), x0, grads, 3)
    peer = peer_trajectory(_torch_preset("Adam", lr=1e-3), x0, grads, np.float64)
    for traj in (ref, peer):
        assert traj.params[2][0][0] == pytest.approx(-1.5e-3, rel=1e-9)
        assert abs(traj.params[2][0][0] - -1.2535358402830757e-4) > 1e-3


def _cli(argv):
    import argparse

    from refopt.cli import crosscheck
    p = argparse.ArgumentParser()
    crosscheck.add_arguments(p)
    return crosscheck.run(p.parse_args(argv))


def test_cli_exit_status_json_and_negative(tmp_path, monkeypatch, capsys):
    import json
    from dataclasses import replace

    from refopt.crosscheck import presets
    out = tmp_path / "r.json"
    assert _cli(["--against", "torch", "--rules", "adamw", "--problems", "stream", "--steps", "5",
                 "--negative", "--json", str(out)]) == 0
    res = json.load(open(out))["results"]
    assert {r["status"] for r in res} == {"pass", "caught"} and all(r["peer"] == "torch" for r in res)
    assert "2 pass, 2 caught" in capsys.readouterr().out
    # a wrong preset presented as a correct one makes the command fail
    wrong = replace(next(p for p in presets.MISCONFIGURED if p.peer == "torch" and p.family == "adamw"),
                    expect_fail=False)
    monkeypatch.setattr(presets, "select", lambda *a, **k: [wrong])
    assert _cli(["--against", "torch", "--problems", "stream", "--steps", "5"]) == 1
    assert "fail" in capsys.readouterr().out
