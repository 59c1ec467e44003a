"""refopt against facebookresearch/schedule_free's reference classes (CONVENTIONS.md 5): params (y) and
state (z, x, exp_avg_sq) within rel 1e-12 in float64 over 50 steps. Skipped when schedulefree is not
installed (CI installs torch==2.13.0 first, then schedulefree)."""
import numpy as np
import pytest

pytest.importorskip("torch", reason="peer schedulefree needs torch: pip install torch==2.13.0")
pytest.importorskip("schedulefree", reason="peer schedulefree not installed: pip install schedulefree")

from crosscheck_helpers import assert_passes, ids, presets  # noqa: E402

from refopt.crosscheck.presets import Preset  # noqa: E402
from refopt.crosscheck.run import peer_trajectory, refopt_trajectory  # noqa: E402
from refopt.rules.schedule_free import ScheduleFreeSGD  # noqa: E402

GOOD = presets("schedulefree")


@pytest.mark.parametrize("preset", GOOD, ids=ids(GOOD))
@pytest.mark.parametrize("problem", ["stream", "mlp"])
def test_float64_50_steps(preset, problem):
    r = assert_passes(preset, problem)
    assert r.params_rel <= 1e-12 and r.state_rel <= 1e-12


@pytest.mark.parametrize("preset", GOOD, ids=ids(GOOD))
def test_float32_stream(preset):
    assert_passes(preset, dtype="float32")


def test_lr_zero_first_step_gives_c_zero_not_nan():
    """PITFALLS B12: lr = 0 at the first step -> the reference's ZeroDivisionError branch, c = 0."""
    p = Preset("b12", "schedulefree", "sf_sgd", ("SGDScheduleFreeReference", dict(lr=0.0)), None, "t",
               state={"x": "x"})
    x0 = [np.array([1.0, 2.0])]
    g = [[np.array([0.3, -0.1])]] * 2
    peer = peer_trajectory(p, x0, g, np.float64)
    ref, _ = refopt_trajectory(ScheduleFreeSGD(lr=0.0), x0, g, 2, ("x",))
    for traj in (peer, ref):
        assert np.isfinite(traj.params[1][0]).all()
        assert np.array_equal(traj.state[1]["x"][0], x0[0])
