"""Tutorials (tutorials/*.py, loaded from their file paths: tutorials/ is not a package) reproduce the
claims they state, checked numerically on tiny runs.

Each tutorial's claims are tested on a small run with a real numerical assertion (closed forms, exact
identities, negative controls); see tutorials/README.md for the claims. Every tutorial is a jupytext
percent script: the last test checks that each opens as a notebook with markdown and code cells.
"""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import refopt
import tutorial_runs
from refopt.models import mlp
from refopt.models.data import load_digits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_tutorial(name):
    path = os.path.join(ROOT, "tutorials", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"tutorial_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def t01():
    return load_tutorial("t01_reparametrization")


@pytest.fixture(scope="module")
def digits():
    return load_digits(dtype=np.float64)


@pytest.fixture(scope="module")
def t01_runs(t01, digits):
    return {c: t01.run(steps=6, c=c, lr=0.1, elr=0.01, hidden=16, batch_size=64, seed=1, data=digits)
            for c in (1.0, 10.0, 0.1)}


# ---- the derivation behind t01, checked without the tutorial's training loop --------------------------------

def test_reparam_gradient_is_grad_over_c(t01, digits):
    """grad l_hat(c*w) = grad l(w) / c for the scaled leaf, the other gradients unchanged (chain rule)."""
    c = 10.0
    params = mlp.init(3, [64, 8, 10], dtype=np.float64)
    x, y = digits.x_train[:50], digits.y_train[:50]
    v, g = refopt.value_and_grad(mlp.loss)(params, x, y)
    v_hat, g_hat = refopt.value_and_grad(t01.reparam_loss(c))(t01.to_hat(params, c), x, y)
    assert abs(v_hat - v) <= 1e-14 * abs(v)
    np.testing.assert_allclose(g_hat["layers"][0]["w"], g["layers"][0]["w"] / c, rtol=1e-12, atol=1e-17)
    for i, j in [(0, "b"), (1, "w"), (1, "b")]:
        np.testing.assert_allclose(g_hat["layers"][i][j], g["layers"][i][j], rtol=1e-12, atol=1e-17)


def test_one_sgd_step_on_w_hat_is_lr_over_c2_on_w(t01, digits):
    """One SGD step of lr eta on w_hat, mapped back, equals w - (eta/c^2) grad l(w) (plain-numpy step)."""
    c, eta = 0.1, 0.05
    params = mlp.init(4, [64, 8, 10], dtype=np.float64)
    x, y = digits.x_train[:40], digits.y_train[:40]
    _, g = refopt.value_and_grad(mlp.loss)(params, x, y)
    p_hat = t01.to_hat(params, c)
    _, g_hat = refopt.value_and_grad(t01.reparam_loss(c))(p_hat, x, y)
    new_hat, _ = refopt.update(refopt.SGD(lr=eta), refopt.init(refopt.SGD(lr=eta), p_hat), p_hat, g_hat)
    w_back = t01.from_hat(new_hat, c)["layers"][0]["w"]
    w0 = params["layers"][0]["w"]
    expect = w0 - (eta / c ** 2) * g["layers"][0]["w"]
    assert np.linalg.norm(w_back - expect) <= 1e-12 * np.linalg.norm(expect)


# ---- the tutorial's claims ------------------------------------------------------------------------------------

@pytest.mark.parametrize("c", [10.0, 0.1])
def test_sgd_with_lr_times_c2_reproduces_sgd_on_w(t01_runs, c):
    r = t01_runs[c]
    assert r["max_dev_scaled_lr"] <= 1e-12
    np.testing.assert_allclose(r["loss_sgd_scaled_lr"], r["loss_sgd"], rtol=1e-12)


@pytest.mark.parametrize("c", [10.0, 0.1])
def test_sgd_with_the_same_lr_differs(t01_runs, c):
    """Negative control: SGD is not covariant, the same lr on w_hat gives another trajectory."""
    r = t01_runs[c]
    assert r["max_dev_same_lr"] > 1e-3
    assert np.nanmax(np.abs(r["loss_sgd_same_lr"][1:] - r["loss_sgd"][1:])) > 1e-4


@pytest.mark.parametrize("c", [10.0, 0.1])
def test_covariant_trajectory_does_not_depend_on_c(t01_runs, c):
    r = t01_runs[c]
    assert r["max_dev_cov"] <= 1e-10
    np.testing.assert_allclose(r["loss_cov"], t01_runs[1.0]["loss_cov"], rtol=1e-10)
    # and it is the Covariant trajectory, not SGD's: eq. (elr-g) takes other steps than SGD
    assert np.max(np.abs(r["loss_cov"][1:] - r["loss_sgd"][1:])) > 1e-4


def test_c_equal_one_is_exactly_the_reference(t01_runs):
    r = t01_runs[1.0]
    assert r["max_dev_same_lr"] == 0.0 and r["max_dev_scaled_lr"] == 0.0 and r["max_dev_cov"] == 0.0
    assert np.all(np.isfinite(r["loss_sgd"])) and r["loss_sgd"][-1] < r["loss_sgd"][0]


def test_rel_dev_detects_a_perturbation(t01):
    """The deviation measure itself: relative Frobenius error of the worst array; zero-vs-zero counts 0."""
    p = {"a": np.array([3.0, 4.0]), "b": np.zeros(2)}
    q = {"a": np.array([3.0, 4.5]), "b": np.zeros(2)}
    assert t01.rel_dev(q, p) == pytest.approx(0.5 / 5.0, rel=1e-15)
    assert t01.rel_dev(p, p) == 0.0


def test_t01_main_writes_png(t01, tmp_path, capsys):
    out = tmp_path / "tut"
    results = t01.main(["--out", str(out), "--steps", "5", "--hidden", "8"])
    png = out / "t01_reparametrization.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert [r["c"] for r in results] == [1.0, 10.0, 0.1]
    assert "max relative deviation" in capsys.readouterr().out


# ---- t02 (post 004): averaging as a schedule, the EMA preview, Schedule-Free ---------------------------------

@pytest.fixture(scope="module")
def t02():
    return load_tutorial("t02_averaging_as_schedule")


def test_t02_eq10_multiplier_uniform_is_linear_decay_and_ema_is_eq17(t02):
    T = 50
    t = np.arange(1, T + 1)
    np.testing.assert_allclose(t02.averaging_multiplier(np.ones(T)), 1 - t / T, rtol=0, atol=1e-15)
    g = 0.9
    np.testing.assert_allclose(t02.averaging_multiplier(t02.ema_weights(T, g)), (1 - g ** (T - t)) / (1 - g ** T),
                               rtol=1e-12, atol=1e-15)
    # negative control: the EMA's multiplier is not the linear decay
    assert np.max(np.abs(t02.averaging_multiplier(t02.ema_weights(T, g)) - (1 - t / T))) > 0.3
    with pytest.raises(ValueError, match="weights >= 0"):
        t02.averaging_multiplier([1.0, -1.0])


def test_t02_averaging_leaves_the_trajectory_unchanged(t02, digits):
    r = t02.run(steps=7, lr=0.3, ema_decay=0.9, hidden=8, batch_size=16, seed=2, eval_every=3, n_branches=1,
                data=digits)
    assert list(r["step"]) == [0, 3, 6, 7]
    assert r["ema_raw_bitwise"]
    # before any step the average is the init (eval_params gives x_0), after it it is not the iterate
    assert r["loss_average"][0] == r["loss_const"][0] == r["loss_linear"][0]
    assert abs(r["loss_average"][-1] - r["loss_const"][-1]) > 1e-6
    assert r["loss_linear"][-1] != r["loss_const"][-1]


def test_t02_ema_previews_the_end_of_a_short_linear_decay(t02, digits):
    """At the branch points the EMA (gamma = 0.95) is closer to the endpoint of a linear decay over the last
    W = 2/(1 - gamma) = 40 steps than the raw constant-lr iterate is (mean over the points and 2 seeds)."""
    ema_gap, raw_gap = [], []
    for seed in (0, 1):
        r = t02.run(steps=400, lr=0.5, ema_decay=0.95, hidden=32, eval_every=10, n_branches=4, seed=seed,
                    data=digits)
        assert r["window"] == 40 and list(r["branch_end"]) == [100, 200, 300, 400]
        s, raw = r["branch_curves"][200]
        assert s[0] == 160 and raw[0] == r["loss_const"][list(r["step"]).index(160)]   # branched off the run
        ema_gap += list(np.abs(r["ema_at_branch"] - r["branch_loss"]))
        raw_gap += list(np.abs(r["raw_at_branch"] - r["branch_loss"]))
    assert np.mean(ema_gap) < 0.5 * np.mean(raw_gap)


def test_t02_main_writes_png(t02, tmp_path):
    r = t02.main(["--out", str(tmp_path), "--steps", "60", "--hidden", "8", "--eval-every", "10",
                  "--ema-decay", "0.9"])
    assert (tmp_path / "t02_averaging_as_schedule.png").read_bytes()[:8] == PNG_MAGIC
    assert r["schedule_free"]["linear"].shape == (3,)


# ---- t03 (post 000): joint symmetries and the gradient identity -------------------------------------------

@pytest.fixture(scope="module")
def t03_run():
    t03 = load_tutorial("t03_joint_symmetries")
    tr = t03.identity_along_training(steps=4, every=2, lr=1e-2)
    inv = t03.invariances(tr["params"], tr["config"], *tr["batch"], c=2.5)
    return t03, tr, inv


def test_t03_joint_symmetries_keep_the_loss_single_weights_do_not(t03_run):
    _, _, inv = t03_run
    assert len(inv["joint"]) == 8                                       # reglu, untied: every symmetry of the list
    assert max(inv["joint"].values()) < 1e-13 and max(inv["per_channel"].values()) < 1e-13
    assert inv["embedding"]["untied, eps=0"] < 1e-13
    assert 1e-9 < inv["embedding"]["untied, eps=1e-6"] < 1e-4           # eps breaks it, slightly
    assert inv["embedding"]["tied head, eps=0"] > 1e-4                  # the tied head scales the logits
    assert min(inv["single"].values()) > 1e3 * max(inv["joint"].values(), default=0) + 1e-7  # one weight alone


def test_t03_gradient_identity_holds_along_training_but_per_weight_terms_do_not_vanish(t03_run):
    _, tr, _ = t03_run
    assert tr["step"] == [0, 2, 4]
    assert tr["max_residual"] < 1e-12
    assert max(tr["median_cosine"].values()) > 1e-2                     # <w, g> != 0 for single weights


def test_t03_main_writes_png(t03_run, tmp_path):
    t03, _, _ = t03_run
    r = t03.main(["--out", str(tmp_path), "--steps", "2", "-f", "kernel.json"])   # a kernel's -f is ignored
    assert (tmp_path / "t03_joint_symmetries.png").read_bytes()[:8] == PNG_MAGIC
    assert r["training"]["max_residual"] < 1e-12


@pytest.mark.parametrize("name", sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "tutorials"))
                                         if f.startswith("t") and f.endswith(".py")))
def test_a_mistyped_tutorial_option_is_an_error(name, tmp_path):
    """A teacher's `--stpes 3` must not silently run the default figure (exit 2 naming the option); a
    kernel's `-f FILE` is ignored. Run as a script, so that a tutorial's top-level cells stop at the options."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tutorials", f"{name}.py"), "--out", str(tmp_path),
                           "--stpes", "3", "-f", "kernel.json"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 2 and "unrecognized arguments: --stpes 3" in proc.stderr


# ---- t04 (post 000): AdamW's ELR, measured ------------------------------------------------------------------

@pytest.fixture(scope="module")
def t04():
    return load_tutorial("t04_adamw_elr")


def test_t04_update_rms_and_the_plateau_of_the_weight_norm(t04):
    """u_rms = sqrt((1-b1)/(1+b1)); constant lr: ||w||^2 -> eta/(2 lambda), not the seed's eta/(3 lambda);
    at lambda eta t = 0.5 the e^{-2 lambda eta t} model fits, the seed's e^{-lambda eta t} / 3 does not."""
    r = t04.run(steps=1500, lr=2e-3, wd=1.0, init_rms=0.005, d=4000)
    assert r["u_rms_measured"] == pytest.approx(r["u_rms_theory"], rel=0.02)
    assert r["plateau"] == pytest.approx(0.5, rel=0.06)
    assert abs(r["plateau"] - 1 / 3) > 0.1
    assert r["w2_mid"] == pytest.approx(r["w2_mid_corrected"], rel=0.06)
    assert abs(r["w2_mid"] - r["w2_mid_seed"]) > 0.1
    # linear decay: the recursion follows the measured curve once Adam's first, larger (bias-corrected) steps
    # are forgotten; the peak is well below the constant-lr plateau
    np.testing.assert_allclose(r["lin"]["w2"][300:], r["rec_lin"][300:], rtol=0.08)
    assert 0.2 < r["peak_linear"] < 0.45
    assert t04.recursion(np.full(3, 0.5), 1.0, 1.0)[-1] == pytest.approx((0.25 + 0.25) * 0.25 + 0.25)


def test_t04_main_writes_png(t04, tmp_path):
    t04.main(["--out", str(tmp_path), "--steps", "50", "--dim", "100"])
    assert (tmp_path / "t04_adamw_elr.png").read_bytes()[:8] == PNG_MAGIC


# ---- t05 (post 002): weight decay only sets the learning rate ------------------------------------------------

@pytest.fixture(scope="module")
def t05_run(digits):
    t05 = load_tutorial("t05_weight_decay_sets_lr")
    return t05, t05.run(steps=60, hidden=32, eval_every=10, data=digits)


def test_t05_matching_eta_eff_follows_muonwd_unmatched_does_not(t05_run):
    _, r = t05_run
    assert r["gap_matched"] < 0.3 * r["gap_nowd"]
    assert r["gap_muonh_aligned"] < 0.3 * r["gap_nowd"]
    assert r["gap_wd_aligned"] < 0.3 * r["gap_wd_vs_muonh"]


def test_t05_alignment_by_angle(t05_run):
    """MuonH with lr tan(theta_t) turns by MuonWD's angles; MuonWD aligned (with feedback) by MuonH's."""
    t05, r = t05_run
    th = r["theta"]
    for p in t05.MATS:
        assert np.median(th["muonh_aligned"][p] / th["wd"][p]) == pytest.approx(1.0, abs=0.03)
        assert np.median(th["wd_aligned"][p][5:] / th["muonh"][p][5:]) == pytest.approx(1.0, abs=0.03)
        # negative control: unaligned, the angles differ far more
        assert np.median(np.abs(th["muonh"][p] / th["wd"][p] - 1)) > \
            3 * np.median(np.abs(th["muonh_aligned"][p] / th["wd"][p] - 1))


def test_t05_main_writes_png(t05_run, tmp_path):
    t05, _ = t05_run
    t05.main(["--out", str(tmp_path), "--steps", "4", "--hidden", "8"])
    assert (tmp_path / "t05_weight_decay_sets_lr.png").read_bytes()[:8] == PNG_MAGIC


# ---- t06 (posts 003, 001): stability metrics, coordinate check, lr transfer -----------------------------------

@pytest.fixture(scope="module")
def t06(tmp_path_factory):
    return tutorial_runs.run("t06_stability_and_mup", str(tmp_path_factory.mktemp("t")))


def test_t06_writes_its_figure(t06):
    out, _ = t06
    with open(os.path.join(out, "t06_stability_and_mup.png"), "rb") as f:
        assert f.read(8) == PNG_MAGIC


def test_t06_linear_layer_metrics_are_attained_by_the_top_singular_direction(t06):
    _, r = t06
    for row in r["table"]:
        for metric in ("forward", "dependency", "update"):
            closed, worst = row["closed"][metric], row["worst"][metric]
            assert abs(worst - closed) <= 1e-10 * closed
            assert row["random"][metric] < 0.95 * closed                  # random inputs do not find the sup
        assert row["closed"]["dependency"] == pytest.approx(2 * row["closed"]["forward"], rel=1e-15)


def test_t06_mup_sigma_gives_rms_operator_norm_one_at_every_shape(t06):
    _, r = t06
    assert all(0.85 < v < 1.05 for v in r["rms_op"]["mup_sigma"])
    assert max(r["rms_op"]["He"]) > 2.5 * min(r["rms_op"]["He"])          # negative control: He depends on shape


def test_t06_linear_stability_closed_form_against_an_independent_svd():
    """forward = sqrt(d_in/d_out) sigma_max(W) from numpy's singular values (not refopt's code path)."""
    from refopt import diagnostics as D
    W = np.random.default_rng(5).standard_normal((40, 10))
    sv = np.linalg.svd(W, compute_uv=False)
    st = D.linear_stability(W, 0.5 * W)
    assert st.forward == pytest.approx(np.sqrt(4.0) * sv[0], rel=1e-14)
    assert st.update == pytest.approx(np.sqrt(4.0) * 0.5 * sv[0], rel=1e-14)


def test_t06_coordinate_check_is_flat_for_mup_and_muon_not_for_standard(t06):
    _, r = t06
    s = r["slopes"]
    assert max(map(abs, s["mup"].values())) < 0.2 and max(map(abs, s["muon"].values())) < 0.2
    assert min(s["standard"]["z2"], s["standard"]["logits"]) > 0.4       # negative control: SP grows with n


def test_t06_best_lr_stays_under_mup_and_drifts_under_standard(t06):
    _, r = t06
    step = 10 ** 0.25                                                     # one grid step
    mup_best, sp_best = np.array(r["best_lr"]["mup"]), np.array(r["best_lr"]["standard"])
    assert mup_best.max() / mup_best.min() <= step * 1.0001
    assert sp_best[0] / sp_best[-1] >= step ** 2 * 0.9999                 # at least two grid steps down


def test_t06_exercise_solutions():
    """docs/tutorials/solutions/t06_stability_and_mup.md against the tutorial's checks; wrong answers fail."""
    import math
    from refopt import diagnostics as D
    from refopt import mup
    d_in, d_out = 1024, 64
    answer1 = math.sqrt(d_out / d_in) / (math.sqrt(d_in) + math.sqrt(d_out))
    Z = np.random.default_rng(1).standard_normal((1024, 64))
    assert 0.9 < D.rms_operator_norm(answer1 * Z) < 1.1
    assert not 0.9 < D.rms_operator_norm(math.sqrt(2 / d_in) * Z) < 1.1       # He's sigma fails the check
    G2 = np.random.default_rng(2).standard_normal((256, 64))
    W2 = mup.mup_sigma(256, 64) * np.random.default_rng(3).standard_normal((256, 64))
    dW = -0.01 * math.sqrt(64 / 256) * refopt.msign(G2, "svd")
    answer2 = D.linear_stability(W2, dW).update
    assert abs(answer2 - 0.01) < 1e-12
    wrong = D.linear_stability(W2, -0.01 * refopt.msign(G2, "svd")).update   # without the spectral scale
    assert abs(wrong - 0.01) > 1e-3


# ---- t07 (post 001): independent weight decay -----------------------------------------------------------------

@pytest.fixture(scope="module")
def t07(tmp_path_factory):
    return tutorial_runs.run("t07_independent_weight_decay", str(tmp_path_factory.mktemp("t")))


def test_t07_writes_its_figure(t07):
    out, _ = t07
    with open(os.path.join(out, "t07_independent_weight_decay.png"), "rb") as f:
        assert f.read(8) == PNG_MAGIC


def test_t07_tau_iter_moves_with_lr_for_torch_adamw_and_stays_for_independent(t07):
    """The probe decays by (1 - rate) per step exactly: tau = -1/log(1 - rate), rate = lr lambda (torch-style)
    or lambda (independent)."""
    _, r = t07
    lrs = np.array(r["lrs"])
    np.testing.assert_allclose(r["tau_decoupled"], -1 / np.log1p(-lrs * r["wd_torch"]), rtol=1e-9)
    np.testing.assert_allclose(r["tau_independent"], -1 / np.log1p(-r["wd_indep"]), rtol=1e-9)
    assert r["tau_decoupled"][0] / r["tau_decoupled"][-1] > 900               # moves 1000x over the sweep
    assert np.all(np.isfinite(r["test_independent"]))


def test_t07_fixed_tau_epoch_gives_the_same_decay_per_epoch_across_data_sizes(t07):
    _, r = t07
    sizes = r["sizes"]
    for tau in r["tau_epoch_rule"]:
        assert tau == pytest.approx(r["tau_epoch_target"], rel=0.01)
    # negative control: a fixed lambda gives tau_epoch proportional to 1/N
    fixed = r["tau_epoch_fixed"]
    assert fixed[0] == pytest.approx(sizes[-1] / sizes[0] * fixed[-1], rel=0.01)
    assert fixed[0] > 3 * r["tau_epoch_target"]


def test_t07_exercise_solutions():
    """docs/tutorials/solutions/t07_independent_weight_decay.md against the tutorial's checks (the probe alone)."""
    def probe_tau(rule, steps):
        p = np.ones(16)
        state = refopt.init(rule, p)
        for _ in range(steps):
            p, state = refopt.update(rule, state, p, np.zeros(16))
        return steps / -np.log(np.linalg.norm(p) / 4.0)

    answer1 = 1 / 500
    for lr in (1e-3, 1e-1):
        assert abs(probe_tau(refopt.AdamW(lr=lr, weight_decay=answer1, wd_mode="independent"), 300) / 500 - 1) < 0.01
    assert abs(probe_tau(refopt.AdamW(lr=1e-1, weight_decay=answer1), 300) / 500 - 1) > 0.5   # torch-style fails
    answer2 = 3e-3 / 1e-2
    t_indep = probe_tau(refopt.AdamW(lr=1e-2, weight_decay=3e-3, wd_mode="independent"), 300)
    assert abs(probe_tau(refopt.AdamW(lr=1e-2, weight_decay=answer2), 300) / t_indep - 1) < 1e-9
    assert probe_tau(refopt.AdamW(lr=2e-2, weight_decay=answer2), 300) == pytest.approx(t_indep / 2, rel=0.01)
    answer3 = 1 / (10 * 2000 / 32)
    tau_e = probe_tau(refopt.AdamW(lr=1e-2, weight_decay=answer3, wd_mode="independent"), 600) / (2000 / 32)
    assert abs(tau_e / 10 - 1) < 0.01


# ---- t08: trajectories ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def t08(tmp_path_factory):
    return tutorial_runs.run("t08_trajectories", str(tmp_path_factory.mktemp("t")))


def test_t08_writes_its_figure(t08):
    out, _ = t08
    with open(os.path.join(out, "t08_trajectories.png"), "rb") as f:
        assert f.read(8) == PNG_MAGIC


def test_t08_sgd_on_the_quadratic_is_the_closed_form_and_sign_descent_steps_lr(t08):
    """x_t = (1 - eta)^t x_0, y_t = (1 - eta kappa)^t y_0 (eta = 0.07, kappa = 25); |sign step| = lr exactly,
    Adam (beta1 > 0) is not sign descent (negative control)."""
    _, r = t08
    assert r["sgd_closed_form_err"] < 1e-11
    assert r["sign_step_err"] < 1e-12
    lo, hi = r["adam_step_range"]
    assert hi - lo > 1e-3 and abs(hi - 0.15) < 1e-9                       # Adam's first step is lr, then it shrinks


def test_t08_rosenbrock_ordering(t08):
    """Adam reaches the minimum, momentum and Nesterov get closer than SGD, sign descent stalls."""
    _, r = t08
    d = r["rosenbrock_distance"]
    assert d["Adam"] < 1e-2 < d["momentum 0.9"] < d["SGD"] < d["sign descent"]
    assert r["rosenbrock_final"]["sign descent"] > 1.0
    assert abs(d["momentum 0.9"] / d["Nesterov 0.9"] - 1) < 0.05


def test_t08_muon_direction_is_orthogonal_and_wins_on_the_ill_conditioned_matrix_problem(t08):
    _, r = t08
    np.testing.assert_allclose(r["sv_muon_direction"], 1.0, rtol=1e-12)
    assert max(r["sv_gradient"]) / min(r["sv_gradient"]) > 1e3
    m = r["matrix_final"]
    assert m["Muon (exact msign)"] < 1e-2 * min(m["SGD"], m["Adam"])


def test_t08_exercise_solutions():
    """docs/tutorials/solutions/t08_trajectories.md, each against the tutorial's check; a wrong answer fails."""
    K = 25.0

    def final_loss(rule, steps):
        w = np.array([-4.0, 1.0])
        state = refopt.init(rule, w)
        for _ in range(steps):
            w, state = refopt.update(rule, state, w, np.array([w[0], K * w[1]]))
        return 0.5 * (w[0] ** 2 + K * w[1] ** 2)

    answer1 = 2 / K
    assert final_loss(refopt.SGD(lr=0.99 * answer1), 300) < 1.0 < final_loss(refopt.SGD(lr=1.01 * answer1), 300)
    wrong = 2 / (K + 1)                                                    # SGD's best lr, not its limit
    assert not final_loss(refopt.SGD(lr=1.01 * wrong), 300) > 1.0
    answer2 = (4 / (np.sqrt(K) + 1) ** 2, ((np.sqrt(K) - 1) / (np.sqrt(K) + 1)) ** 2)
    f_hb = final_loss(refopt.SGD(lr=answer2[0], momentum=answer2[1]), 60)
    f_sgd = final_loss(refopt.SGD(lr=2 / (K + 1)), 60)
    assert f_hb < 1e-12 and f_hb < 1e-6 * f_sgd
    f_wrong = final_loss(refopt.SGD(lr=answer2[0], momentum=0.9), 60)     # a wrong beta fails the check
    assert not (f_wrong < 1e-12 and f_wrong < 1e-6 * f_sgd)


# ---- t09: Adam's bias correction and eps placements ----------------------------------------------------------

@pytest.fixture(scope="module")
def t09(tmp_path_factory):
    return tutorial_runs.run("t09_adam_details", str(tmp_path_factory.mktemp("t")))


def test_t09_writes_its_figure(t09):
    out, _ = t09
    with open(os.path.join(out, "t09_adam_details.png"), "rb") as f:
        assert f.read(8) == PNG_MAGIC


def test_t09_bias_corrected_steps_have_size_lr_from_the_first_step(t09):
    """|step| = lr |g|/(|g| + eps) at every step; without the correction (1 - b1^t)/sqrt(1 - b2^t) lr."""
    _, r = t09
    assert r["step_max_rel_dev"] <= 1e-12
    g = np.array(r["g_const"])
    for key, v in r["step_over_lr_at"].items():
        np.testing.assert_allclose(v, float(key) / (float(key) + 1e-8), rtol=1e-12)
    assert r["t_at"][0] == 1 and r["uncorrected_at"][0] == pytest.approx(0.1 / np.sqrt(0.001), rel=1e-14)  # 3.162
    assert r["uncorrected_max"] > 6.0                                                   # negative control
    assert len(g) == 3


def test_t09_eps_placements(t09):
    """The first step of E1/E2/E3, written here from the equations; refopt is E1; they agree for |g| >> eps."""
    _, r = t09
    grid, f = np.array(r["grid"]), {k: np.array(v) for k, v in r["first"].items()}
    np.testing.assert_allclose(f["E1"], 1e-3 * grid / (grid + 1e-8), rtol=1e-14)
    np.testing.assert_allclose(f["E2"], 1e-3 * grid / (grid + 1e-8 / np.sqrt(1 - 0.999)), rtol=1e-12)
    np.testing.assert_allclose(f["E3"], 1e-3 * grid / np.sqrt(grid ** 2 + 1e-8), rtol=1e-14)
    np.testing.assert_allclose(r["refopt_first"], f["E1"], rtol=1e-12)                  # refopt is E1
    big = grid > 1e-2
    for k in ("E2", "E3"):
        np.testing.assert_allclose(f[k][big], f["E1"][big], rtol=1e-3)                  # agree for |g| >> eps
    assert f["E1"][0] / f["E3"][0] > 1e3                                                # and not for tiny |g|
    assert np.max(np.abs(np.array(r["refopt_first"]) / f["E2"] - 1)) > 1.0             # refopt is not E2


def test_t09_refopt_matches_the_peers(t09):
    """refopt's first step equals torch.optim.Adam's (E1); optax's eps_root is E3 (when installed)."""
    _, r = t09
    for name in ("torch", "optax"):
        try:
            __import__(name)
        except ImportError:
            assert name in r["missing_peers"]
            continue
        key = "torch.optim.Adam (E1)" if name == "torch" else "optax.adam eps_root (E3)"
        assert r["peer_max_rel_diff"][key] < 1e-15
    if "torch.optim.Adam (E1)" in r["peers"]:
        np.testing.assert_allclose(r["refopt_first"], r["peers"]["torch.optim.Adam (E1)"], rtol=1e-15)


def test_t09_exercise_solutions():
    """docs/tutorials/solutions/t09_adam_details.md, each against the tutorial's check; a wrong answer fails."""
    B1, B2, EPS = 0.9, 0.999, 1e-8
    ratio = lambda t: (1 - B1 ** t) / np.sqrt(1 - B2 ** t)  # noqa: E731
    tt = np.arange(1, 100001)
    k = int(np.argmax(ratio(tt)))
    answer1 = (int(tt[k]), float(ratio(tt[k])))
    assert answer1[0] == 12 and answer1[1] == pytest.approx(6.5685, abs=1e-4)
    assert ratio(11) < answer1[1] and ratio(13) < answer1[1]
    answer2 = np.sqrt(EPS / 3)
    assert abs(answer2 / np.sqrt(answer2 ** 2 + EPS) - 0.5) < 1e-9
    assert abs(EPS / np.sqrt(EPS ** 2 + EPS) - 0.5) > 0.4                               # E1's answer is wrong here
    answer3 = int(np.ceil(np.log(1 - 1 / 1.01 ** 2) / np.log(B2)))
    within = lambda k: 1 / np.sqrt(1 - B2 ** k) <= 1.01  # noqa: E731
    assert answer3 == 3925 and within(answer3) and not within(answer3 - 1)


# ---- t10: Newton-Schulz polynomials ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def t10(tmp_path_factory):
    return tutorial_runs.run("t10_newton_schulz", str(tmp_path_factory.mktemp("t")))


def test_t10_writes_its_figure(t10):
    out, _ = t10
    with open(os.path.join(out, "t10_newton_schulz.png"), "rb") as f:
        assert f.read(8) == PNG_MAGIC


def test_t10_msign_singular_values_are_the_scalar_map(t10):
    _, r = t10
    assert set(r["check"]) == {"classic", "jordan", "you", "polar_express"}
    assert max(r["check"].values()) < 1e-13


def test_t10_the_bands(t10):
    _, r = t10
    lo, hi = r["band_0.1"]["jordan"]
    assert 0.68 < lo < 0.69 and 1.13 < hi < 1.14                          # a band around 1, not 1
    assert r["band_0.1"]["classic"][0] > 0.99 and r["band"]["classic"][0] < 0.05   # classic: slow for small x
    assert abs(r["band"]["polar_express"][0] - 1) < 1e-3 and abs(r["band"]["polar_express"][1] - 1) < 1e-3


def test_t10_one_classic_step_is_the_closed_form_polynomial():
    """An independent oracle: the classic map after one step is (15x - 10x^3 + 3x^5)/8."""
    from refopt.linalg import ns_scalar_map
    x = np.linspace(0.01, 1.0, 50)
    np.testing.assert_allclose(ns_scalar_map(x, "classic", 1), (15 * x - 10 * x ** 3 + 3 * x ** 5) / 8, rtol=1e-14)


def test_t10_exercise_solutions():
    """docs/tutorials/solutions/t10_newton_schulz.md, each against the tutorial's check; a wrong answer fails."""
    from refopt.linalg import ns_scalar_map
    a, b, c = 3.4445, -4.7750, 2.0315
    answer1 = a * 1.0 + b * 1.0 ** 3 + c * 1.0 ** 5
    assert abs(answer1 - float(ns_scalar_map(np.array([1.0]), "jordan", 1)[0])) < 1e-12
    assert abs(1.0 - float(ns_scalar_map(np.array([1.0]), "jordan", 1)[0])) > 0.2      # 1 is not a fixed point
    answer2 = next(k for k in range(1, 50) if ns_scalar_map(np.array([0.01]), "classic", k)[0] >= 0.99)
    reached = lambda k: float(ns_scalar_map(np.array([0.01]), "classic", k)[0]) >= 0.99  # noqa: E731
    assert answer2 == 9 and reached(answer2) and not reached(answer2 - 1)
    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.standard_normal((48, 40)))
    V, _ = np.linalg.qr(rng.standard_normal((40, 40)))
    G = (U * np.geomspace(1.0, 1e-3, 40)) @ V.T
    u, _, vt = np.linalg.svd(G, full_matrices=False)
    answer3 = u @ vt
    exact = refopt.msign(G, "svd")
    assert np.linalg.norm(answer3 - exact) < 1e-12 * np.linalg.norm(exact)
    assert np.linalg.norm(u[:, :20] @ vt[:20] - exact) > 0.5 * np.linalg.norm(exact)    # a wrong answer fails


# ---- every tutorial opens as a notebook (jupytext percent format) and is listed in the index ----------------

TUTORIALS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "tutorials")) if f.startswith("t") and f.endswith(".py"))


def test_at_least_eight_tutorials_each_listed_with_its_figure():
    assert len(TUTORIALS) >= 8
    index = open(os.path.join(ROOT, "tutorials", "README.md"), encoding="utf-8").read()
    for name in TUTORIALS:
        assert f"tutorials/{name}.py" in index and f"figures/{name}.png" in index, name
        assert os.path.isfile(os.path.join(ROOT, "tutorials", "figures", f"{name}.png")), name


@pytest.mark.parametrize("name", TUTORIALS)
def test_tutorial_is_a_jupytext_percent_notebook(name):
    jupytext = pytest.importorskip("jupytext")
    nb = jupytext.read(os.path.join(ROOT, "tutorials", f"{name}.py"))
    kinds = [c.cell_type for c in nb.cells]
    assert kinds[0] == "markdown" and kinds.count("markdown") >= 1 and kinds.count("code") >= 2
    assert "parse_script_args(ap" in "".join(c.source for c in nb.cells if c.cell_type == "code")
