"""Tutorials (tutorials/*.py) reproduce the claims they state: each runs once per test session (the docs
build's notebook execution when it ran, else the script; tests/tutorial_runs.py) and its claims are tested on
the numbers it saved, with real numerical assertions (closed forms, exact identities, negative controls);
each exercise's solution is checked against the tutorial's check. See tutorials/README.md for the claims.
Every tutorial is a jupytext percent file that opens as a notebook with markdown and code cells.
"""
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


@pytest.fixture(scope="module")
def digits():
    return load_digits(dtype=np.float64)


#: the tutorials whose tests below read the numbers of their single run (tests/tutorial_runs.py)
RUN_ONCE = ("t01_reparametrization", "t02_averaging_as_schedule", "t03_joint_symmetries", "t04_adamw_elr",
            "t05_weight_decay_sets_lr", "t06_stability_and_mup", "t07_independent_weight_decay", "t08_trajectories",
            "t09_adam_details", "t10_newton_schulz")


@pytest.mark.parametrize("name", RUN_ONCE)
def test_tutorial_writes_its_figure_and_numbers(name, tmp_path_factory):
    out, results = tutorial_runs.run(name, str(tmp_path_factory.mktemp("t")))
    with open(os.path.join(out, f"{name}.png"), "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert results


# ---- t01 (post 000): reparametrization -------------------------------------------------------------------------

SCALED = "layers[0].w"


def reparam_loss(c):
    """l_hat(params_hat) = l(params_hat with the first layer's weight divided by c), written here from the
    equations (independent of the tutorial's code)."""
    def loss(params_hat, x, y):
        layers = list(params_hat["layers"])
        layers[0] = {"w": layers[0]["w"] / c, "b": layers[0]["b"]}
        return mlp.loss({"layers": layers}, x, y)
    return loss


def scale_first(params, c):
    layers = [dict(layer) for layer in params["layers"]]
    layers[0]["w"] = layers[0]["w"] * c
    return {"layers": layers}


def per_leaf(scaled_rule, other_rule):
    return refopt.Partition(rules={"scaled": scaled_rule, "other": other_rule},
                            labels=lambda path, x: "scaled" if path == SCALED else "other")


def max_dev_mapped_back(rule_ref, rule_hat, c, digits, steps=20, seed=0):
    """max over steps and arrays of the relative distance between the run of rule_ref on w and the run of
    rule_hat on w_hat = c w, mapped back."""
    params = mlp.init(seed, [64, 16, 10], dtype=np.float64)
    rng = np.random.default_rng(seed)
    vg, vg_hat = refopt.value_and_grad(mlp.loss), refopt.value_and_grad(reparam_loss(c))
    p, s = params, refopt.init(rule_ref, params)
    ph = scale_first(params, c)
    sh = refopt.init(rule_hat, ph)
    worst = 0.0
    for _ in range(steps):
        idx = rng.choice(len(digits.y_train), 64, replace=False)
        x, y = digits.x_train[idx], digits.y_train[idx]
        p, s = refopt.update(rule_ref, s, p, vg(p, x, y)[1])
        ph, sh = refopt.update(rule_hat, sh, ph, vg_hat(ph, x, y)[1])
        back = scale_first(ph, 1.0 / c)
        for a, b in zip(refopt.tree.flatten(back)[0], refopt.tree.flatten(p)[0]):
            if np.linalg.norm(b) > 0:
                worst = max(worst, float(np.linalg.norm(a - b) / np.linalg.norm(b)))
    return worst


@pytest.fixture(scope="module")
def t01(tmp_path_factory):
    return tutorial_runs.run("t01_reparametrization", str(tmp_path_factory.mktemp("t")))


def test_t01_reparam_gradient_is_grad_over_c(t01):
    """grad l_hat(c w) = grad l(w) / c on the scaled leaf (chain rule), measured by the tutorial at c = 10."""
    _, r = t01
    assert r["grad_rel_err"] <= 1e-14


def test_t01_one_sgd_step_on_w_hat_is_lr_over_c2_on_w(digits):
    """One SGD step of lr eta on w_hat, mapped back, equals w - (eta/c^2) grad l(w) (plain-numpy step)."""
    c, eta = 0.1, 0.05
    params = mlp.init(4, [64, 8, 10], dtype=np.float64)
    x, y = digits.x_train[:40], digits.y_train[:40]
    _, g = refopt.value_and_grad(mlp.loss)(params, x, y)
    p_hat = scale_first(params, c)
    _, g_hat = refopt.value_and_grad(reparam_loss(c))(p_hat, x, y)
    new_hat, _ = refopt.update(refopt.SGD(lr=eta), refopt.init(refopt.SGD(lr=eta), p_hat), p_hat, g_hat)
    w_back = new_hat["layers"][0]["w"] / c
    expect = params["layers"][0]["w"] - (eta / c ** 2) * g["layers"][0]["w"]
    assert np.linalg.norm(w_back - expect) <= 1e-12 * np.linalg.norm(expect)


@pytest.mark.parametrize("c", ["c=10", "c=0.1"])
def test_t01_sgd_with_lr_times_c2_reproduces_sgd_on_w(t01, c):
    _, r = t01
    assert r[c]["max_dev_scaled_lr"] <= 1e-12
    np.testing.assert_allclose(r[c]["loss_scaled_lr"], r["loss_sgd"], rtol=1e-12)


@pytest.mark.parametrize("c", ["c=10", "c=0.1"])
def test_t01_sgd_with_the_same_lr_differs(t01, c):
    """Negative control: SGD is not covariant, the same lr on w_hat gives another trajectory."""
    _, r = t01
    assert r[c]["max_dev_same_lr"] > 1e-1
    loss_b, loss_a = np.array(r[c]["loss_same_lr"], dtype=float), np.array(r["loss_sgd"])
    assert np.nanmax(np.abs(loss_b[1:] - loss_a[1:])) > 1e-2


@pytest.mark.parametrize("c", ["c=10", "c=0.1"])
def test_t01_covariant_trajectory_does_not_depend_on_c(t01, c):
    _, r = t01
    assert r[c]["max_dev_cov"] <= 1e-10
    np.testing.assert_allclose(r[c]["loss_cov"], r["c=1"]["loss_cov"], rtol=1e-10)
    np.testing.assert_allclose(r["c=1"]["loss_cov"], r["loss_cov_ref"], rtol=0, atol=0)
    # and it is the Covariant trajectory, not SGD's: eq. (elr-g) takes other steps than SGD
    assert np.max(np.abs(np.array(r[c]["loss_cov"][1:]) - np.array(r["loss_sgd"][1:]))) > 1e-4


def test_t01_c_equal_one_is_exactly_the_reference(t01):
    _, r = t01
    one = r["c=1"]
    assert one["max_dev_same_lr"] == 0.0 and one["max_dev_scaled_lr"] == 0.0 and one["max_dev_cov"] == 0.0
    assert np.all(np.isfinite(r["loss_sgd"])) and r["loss_sgd"][-1] < r["loss_sgd"][0]


def test_t01_exercise_1_solution(digits):
    """Solution (docs/tutorials/solutions/t01_reparametrization.md): lr_hat = lr c^2; a wrong answer fails."""
    lr, c = 0.1, 3.0
    answer1 = lr * c ** 2
    assert max_dev_mapped_back(refopt.SGD(lr=lr), per_leaf(refopt.SGD(lr=answer1), refopt.SGD(lr=lr)), c,
                               digits) < 1e-12
    assert max_dev_mapped_back(refopt.SGD(lr=lr), per_leaf(refopt.SGD(lr=lr * c), refopt.SGD(lr=lr)), c,
                               digits) > 1e-3


def test_t01_exercise_2_solution(digits):
    """Solution: Adam's lr on w_hat scales like c (not c^2); eps = 1e-16 barely breaks the invariance."""
    def answer2(c):
        return 1e-3 * c

    def adam(lr):
        return refopt.Adam(lr=lr, eps=1e-16)

    c = 10.0
    assert max_dev_mapped_back(adam(1e-3), per_leaf(adam(answer2(c)), adam(1e-3)), c, digits) < 1e-10
    assert max_dev_mapped_back(adam(1e-3), per_leaf(adam(1e-3 * c * c), adam(1e-3)), c, digits) > 1e-3


# ---- t02 (post 004): averaging as a schedule, the EMA preview, Schedule-Free ---------------------------------

def lr_multiplier(v):
    """gamma_t = v_{t+1:T} / v_{1:T}, t = 1..T (post 004, eq. (10)), written here as explicit tail sums."""
    v = np.asarray(v, dtype=np.float64)
    return np.array([v[t:].sum() for t in range(1, len(v) + 1)]) / v.sum()


@pytest.fixture(scope="module")
def t02(tmp_path_factory):
    return tutorial_runs.run("t02_averaging_as_schedule", str(tmp_path_factory.mktemp("t")))


def test_t02_eq10_multiplier_uniform_is_linear_decay_and_ema_is_eq17(t02):
    _, r = t02
    assert r["err_uniform"] < 1e-15 and r["err_ema"] < 1e-13
    # the closed forms themselves, from the explicit tail sums; negative control: an EMA is not the linear decay
    T, g = 50, 0.9
    t = np.arange(1, T + 1)
    np.testing.assert_allclose(lr_multiplier(np.ones(T)), 1 - t / T, rtol=0, atol=1e-15)
    np.testing.assert_allclose(lr_multiplier(g ** (T - t)), (1 - g ** (T - t)) / (1 - g ** T), rtol=1e-12, atol=1e-15)
    assert np.max(np.abs(lr_multiplier(g ** (T - t)) - (1 - t / T))) > 0.3


def test_t02_averaging_leaves_the_trajectory_unchanged(t02):
    _, r = t02
    assert r["bitwise"]
    # before any step the average is the init, after it it is not the iterate
    assert r["loss_average"][0] == r["loss_const"][0] == r["loss_linear"][0] == r["loss_ema"][0]
    assert abs(r["loss_average"][-1] - r["loss_const"][-1]) > 1e-4
    assert r["loss_linear"][-1] != r["loss_const"][-1]


def test_t02_branches_start_on_the_constant_lr_run(t02):
    _, r = t02
    assert r["window"] == 100 and len(r["branch_end"]) == 8
    for start, const in zip(r["branch_start_loss"], r["const_at_branch_start"]):
        if const is not None:
            assert start == const


def test_t02_ema_previews_the_end_of_a_short_linear_decay(t02):
    """At the branch points the EMA (gamma = 0.98) is closer to the endpoint of a linear decay over the last
    W = 2/(1 - gamma) = 100 steps than the raw constant-lr iterate is (mean over 8 points)."""
    _, r = t02
    ema_gap = np.abs(np.array(r["ema_at_branch"]) - np.array(r["branch_loss"]))
    raw_gap = np.abs(np.array(r["raw_at_branch"]) - np.array(r["branch_loss"]))
    assert np.mean(ema_gap) < 0.5 * np.mean(raw_gap)
    assert r["ema_closer"] >= 6


def test_t02_schedule_free_and_warmup(t02):
    _, r = t02
    assert min(r["sf_schedule_free"]) < min(r["sf_linear"])            # as good as the best linear decay of the grid
    assert r["big_warmup"] < 0.7 * r["big_no_warmup"]                    # warmup helps at lr 3


def test_t02_exercise_1_solution():
    """Solution: 1 - gamma^50 = 1/2, gamma = 2^(-1/50); a decay tuned for 100 steps fails."""
    T = 2000
    t = np.arange(1, T + 1)
    answer1 = 0.5 ** (1 / 50)
    assert abs(lr_multiplier(answer1 ** (T - t))[T - 50 - 1] - 0.5) < 1e-3
    assert abs(lr_multiplier(0.5 ** (1 / 100) ** (T - t))[T - 50 - 1] - 0.5) > 1e-2


def test_t02_exercise_2_solution():
    """Solution: v_t = 2(T - t) + 1 (tail sums (T - t)^2); uniform weights fail."""
    def answer2(T):
        return 2.0 * (T - np.arange(1, T + 1)) + 1

    T = 300
    t = np.arange(1, T + 1)
    assert np.max(np.abs(lr_multiplier(answer2(T)) - (1 - t / T) ** 2)) < 1e-12
    assert np.max(np.abs(lr_multiplier(np.ones(T)) - (1 - t / T) ** 2)) > 0.1


# ---- t03 (post 000): joint symmetries and the gradient identity -------------------------------------------

@pytest.fixture(scope="module")
def t03(tmp_path_factory):
    return tutorial_runs.run("t03_joint_symmetries", str(tmp_path_factory.mktemp("t")))


def test_t03_joint_symmetries_keep_the_loss_single_weights_do_not(t03):
    _, r = t03
    assert len(r["joint"]) == 8                                         # reglu, untied: every symmetry of the list
    assert max(r["joint"].values()) < 1e-13 and max(r["per_channel"].values()) < 1e-13
    assert r["embedding"]["untied, eps=0"] < 1e-13
    assert 1e-9 < r["embedding"]["untied, eps=1e-6"] < 1e-4             # eps breaks it, slightly
    assert r["embedding"]["tied head, eps=0"] > 1e-4                    # the tied head scales the logits
    assert min(r["single"].values()) > 1e3 * max(r["joint"].values(), default=0) + 1e-7  # one weight alone


def test_t03_gradient_identity_holds_along_training_but_per_weight_terms_do_not_vanish(t03):
    _, r = t03
    assert r["step"] == list(range(0, r["steps"] + 1, 5))
    assert r["max_residual"] < 1e-12
    assert max(r["median_cosine"].values()) > 1e-2                      # <w, g> != 0 for single weights


@pytest.fixture(scope="module")
def tiny_gpt():
    from refopt.models import gpt
    from refopt.models.data import CharVocab, get_batch, load_text
    corpus = load_text()
    vocab = CharVocab(corpus.text)
    ids = vocab.encode(corpus.text[:20_000])
    config = gpt.GPTConfig(vocab_size=vocab.size, block_size=16, n_layer=2, n_head=4, n_embd=32, ffn="reglu",
                           tie_head=False, norm_eps=0.0)
    x, y = get_batch(ids, 16, 4, np.random.default_rng(1))
    return gpt, config, gpt.init(config, seed=1, dtype=np.float64), x, y


def test_t03_exercise_1_solution(tiny_gpt):
    """Solution: W_q * c and W_k / c in block 0 keep the loss; W_q * c alone does not (negative control)."""
    gpt, config, params, x, y = tiny_gpt

    def answer1(params, c):
        blocks = [dict(b) for b in params["blocks"]]
        attn = dict(blocks[0]["attn"])
        attn["w_q"], attn["w_k"] = attn["w_q"] * c, attn["w_k"] / c
        blocks[0] = {**blocks[0], "attn": attn}
        return {**params, "blocks": blocks}

    l0 = float(gpt.loss(params, x, y, config))
    assert abs(float(gpt.loss(answer1(params, 3.0), x, y, config)) - l0) <= 1e-13 * l0
    new = answer1(params, 3.0)
    assert np.array_equal(new["blocks"][0]["attn"]["w_q"], 3.0 * params["blocks"][0]["attn"]["w_q"])
    alone = answer1(params, 3.0)
    alone["blocks"][0]["attn"]["w_k"] = params["blocks"][0]["attn"]["w_k"]
    assert abs(float(gpt.loss(alone, x, y, config)) - l0) > 1e-9 * l0


def test_t03_exercise_2_solution(tiny_gpt):
    """Solution: with the tied head the logits scale by c (eps = 0), not 1."""
    import dataclasses
    gpt, config, params, x, _ = tiny_gpt
    cfg = dataclasses.replace(config, tie_head=True)
    tied = {k: v for k, v in params.items() if k != "lm_head"}
    c = 2.5
    scaled = {**tied, "wte": tied["wte"] * c, "wpe": tied["wpe"] * c,
              "blocks": [{**b, "attn": {**b["attn"], "w_o": b["attn"]["w_o"] * c},
                          "mlp": {**b["mlp"], "w_down": b["mlp"]["w_down"] * c}} for b in tied["blocks"]]}
    logits, logits_scaled = gpt.apply(tied, x, cfg), gpt.apply(scaled, x, cfg)

    def answer2(c):
        return c

    scale = np.max(np.abs(logits))
    assert np.max(np.abs(logits_scaled - answer2(c) * logits)) < 1e-12 * scale
    assert np.max(np.abs(logits_scaled - logits)) > 0.1 * scale


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
def t04(tmp_path_factory):
    return tutorial_runs.run("t04_adamw_elr", str(tmp_path_factory.mktemp("t")))


def test_t04_update_rms_and_the_plateau_of_the_weight_norm(t04):
    """u_rms = sqrt((1-b1)/(1+b1)); constant lr: ||w||^2 -> eta/(2 lambda), not post 000's eta/(3 lambda);
    at lambda eta t = 0.5 the e^{-2 lambda eta t} model fits, the post's e^{-lambda eta t} / 3 does not."""
    _, r = t04
    assert r["u_rms_measured"] == pytest.approx(np.sqrt(0.1 / 1.9), rel=0.02)
    assert r["plateau"] == pytest.approx(0.5, rel=0.06)
    assert abs(r["plateau"] - 1 / 3) > 0.1
    assert r["w2_mid"] == pytest.approx(r["w2_mid_ar1"], rel=0.06)
    assert abs(r["w2_mid"] - r["w2_mid_post"]) > 0.1


def test_t04_linear_decay_follows_the_variance_recursion(t04):
    """The recursion s_{t+1} = (1 - lambda eta_t)^2 s_t + eta_t^2, written here from the equation, follows the
    measured ||w||_RMS^2 under linear decay once Adam's first, larger steps are forgotten; the peak is post 000's
    1/3 level near T/3, well below the constant-lr plateau."""
    _, r = t04
    T, lr, wd = r["steps"], r["lr"], r["wd"]
    sched = refopt.schedules.LinearDecay(T)
    s = np.empty(T)
    s[0] = r["init_rms"] ** 2
    for i in range(1, T):
        lr_t = lr * sched(i)
        s[i] = (1 - wd * lr_t) ** 2 * s[i - 1] + lr_t ** 2
    measured = np.array(r["w2_linear"])                  # every 10th step
    late = slice(T // 100, None)
    np.testing.assert_allclose(measured[late], s[::10][late], rtol=0.08)
    assert 0.2 < r["peak_linear"] < 0.45 and abs(r["peak_linear_at"] - T / 3) < 0.15 * T
    assert r["rec_err_lin"] < 0.08 and r["rec_err_const"] < 0.08


def test_t04_exercise_1_solution():
    """Solution: without momentum the plateau is still eta/(2 lambda) (S = 1); post 000's 1/3 is refuted."""
    answer1 = 0.5
    d, steps, lr = 10_000, 3000, 1e-3
    rule = refopt.AdamW(lr=lr, weight_decay=1.0, beta1=0.0, beta2=0.999)
    rng = np.random.default_rng(0)
    w = 0.005 * rng.standard_normal(d)
    state, w2 = refopt.init(rule, w), []
    for _ in range(steps):
        w2.append(np.mean(w ** 2))
        w, state = refopt.update(rule, state, w, rng.standard_normal(d))
    measured = np.mean(w2[int(0.8 * steps):]) / lr
    assert abs(answer1 / measured - 1) < 0.05
    assert abs((1 / 3) / measured - 1) > 0.05


def test_t04_exercise_2_solution(t04):
    """Solution: the AR(1) model with the init, P = eta/(2 lambda): half-plateau crossing at
    t = -log((P/2 - P)/(rms0^2 - P)) / (2 lambda eta); the model without the init's rate ln 2/(lambda eta) fails."""
    _, r = t04
    lr, wd, rms0 = r["lr"], r["wd"], r["init_rms"]
    P = 0.5 * lr / wd
    answer2 = -np.log((0.5 * P - P) / (rms0 ** 2 - P)) / (2 * wd * lr)
    assert abs(answer2 / r["half_crossing"] - 1) < 0.10
    assert abs(np.log(2) / (wd * lr) / r["half_crossing"] - 1) > 0.10


# ---- t05 (post 002): weight decay only sets the learning rate ------------------------------------------------

@pytest.fixture(scope="module")
def t05(tmp_path_factory):
    return tutorial_runs.run("t05_weight_decay_sets_lr", str(tmp_path_factory.mktemp("t")))


def test_t05_hidden_matrices_are_scale_invariant(t05):
    _, r = t05
    assert r["normed"] and r["scale_change"] < 1e-14


def test_t05_without_momentum_the_replay_stays_closer_than_the_unmatched_run(t05):
    _, r = t05
    assert r["angle_plain_matched"][-1] < 0.5 * r["angle_plain_nowd"][-1]


def test_t05_with_momentum_the_replay_does_not_follow_the_trajectory(t05):
    """The honest part: with momentum 0.95 the replay ends as far (in angle) from MuonWD as the unmatched run."""
    _, r = t05
    assert min(r["angle_end"]["matched"]) > 20.0
    assert np.mean(r["angle_end"]["matched"]) > 0.8 * np.mean(r["angle_end"]["nowd"])


def test_t05_the_replay_and_muonh_reach_muonwds_loss_level_the_unmatched_run_does_not(t05):
    _, r = t05
    pl = {k: np.array(v) for k, v in r["plateau"].items()}
    assert r["log_gap_max"]["matched"] < 0.5 and r["log_gap_max"]["muonh"] < 0.5
    assert np.all(pl["nowd"] < 0.5 * pl["wd"])                # negative control, seed by seed
    assert r["log_gap_max"]["nowd"] > 2 * max(r["log_gap_max"]["matched"], r["log_gap_max"]["muonh"])
    # the mechanism: the unmatched run's eta_eff = lr/||W|| decays, MuonWD's does not
    assert np.all(np.array(r["eta_eff_end"]["nowd"]) < 0.7 * np.array(r["eta_eff_end"]["wd"]))


def test_t05_muonh_turns_by_muonwds_angles(t05):
    _, r = t05
    assert r["theta_ratio"] == pytest.approx(1.0, abs=0.05)


def t05_normed_loss(params, x, y):
    """The tutorial's model, written here from its definition: h <- relu(rmsnorm(h W) + b), then the head."""
    from refopt import autograd as ag
    h = np.asarray(x, dtype=np.float64)
    for layer in params["layers"][:-1]:
        h = ag.relu(ag.rms_norm(h @ layer["w"], None, 0.0) + layer["b"])
    return ag.cross_entropy(h @ params["layers"][-1]["w"] + params["layers"][-1]["b"], y)


def t05_replay_angle(eta_eff, digits, steps=30, lr=0.02, wd=0.2):
    """Largest angle (degrees) between the Muon matrices of MuonWD (momentum 0) and of Muon without decay
    replaying eta_eff(lr, wd, ||W_t||) through LRTable(relative=True), after `steps` steps."""
    mats = ("layers[0].w", "layers[1].w")

    def rules(rule_for):
        rs = {p: rule_for(p) for p in mats}
        rs["other"] = refopt.AdamW(lr=3e-3, weight_decay=0.0)
        return refopt.Partition(rules=rs, labels=lambda path, x: path if path in mats else "other")

    params0 = mlp.init(5, [64, 16, 16, 10], dtype=np.float64)
    rng = np.random.default_rng(5)
    batches = [rng.choice(len(digits.y_train), 32, replace=False) for _ in range(steps)]
    vg = refopt.value_and_grad(t05_normed_loss)

    def train(rule):
        p, s, norms = params0, refopt.init(rule, params0), {q: [] for q in mats}
        for idx in batches:
            for i, q in enumerate(mats):
                norms[q].append(np.linalg.norm(p["layers"][i]["w"]))
            p, s = refopt.update(rule, s, p, vg(p, digits.x_train[idx], digits.y_train[idx])[1])
        return p, norms

    p_wd, norms = train(rules(lambda q: refopt.Muon(lr=lr, momentum=0.0, weight_decay=wd)))
    table = {q: tuple(float(eta_eff(lr, wd, n)) for n in norms[q]) for q in mats}
    p_rep, _ = train(rules(lambda q: refopt.LRTable(refopt.Muon(lr=0.0, momentum=0.0), {q: table[q]}, relative=True)))
    unit = [p["layers"][i]["w"] / np.linalg.norm(p["layers"][i]["w"]) for p in (p_wd, p_rep) for i in (0, 1)]
    return max(np.degrees(2 * np.arcsin(np.linalg.norm(unit[i] - unit[i + 2]) / 2)) for i in (0, 1))


def test_t05_exercise_1_solution(digits):
    """Solution: eta_eff = lr / ((1 - lr wd) ||W_t||) makes the replay MuonWD to rounding (momentum 0); the
    post's lr / ||W_t|| does not (negative control)."""
    def answer1(lr, wd, norm):
        return lr / ((1 - lr * wd) * norm)

    assert t05_replay_angle(answer1, digits) < 1e-6
    assert t05_replay_angle(lambda lr, wd, norm: lr / norm, digits) > 1e-3


def test_t05_exercise_2_solution(t05):
    """Solution: the largest paired |log(plateau ratio)|, from the saved plateaus."""
    _, r = t05
    pl = {k: np.array(v) for k, v in r["plateau"].items()}
    answer2 = float(np.max(np.abs(np.log(pl["matched"] / pl["wd"]))))
    assert abs(answer2 - r["log_gap_max"]["matched"]) < 1e-9
    assert abs(float(np.max(np.abs(np.log(pl["nowd"] / pl["wd"])))) - r["log_gap_max"]["matched"]) > 1e-3


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
