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
def digits():
    return load_digits(dtype=np.float64)


#: the tutorials whose tests below read the numbers of their single run (tests/tutorial_runs.py)
RUN_ONCE = ("t01_reparametrization", "t02_averaging_as_schedule", "t03_joint_symmetries", "t04_adamw_elr",
            "t05_weight_decay_sets_lr")


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


# ---- t06 (posts 003, 001): stability metrics, coordinate check ----------------------------------------------

@pytest.fixture(scope="module")
def t06():
    return load_tutorial("t06_stability_and_mup")


def test_t06_linear_layer_metrics_are_attained_by_the_top_singular_direction(t06):
    for r in t06.linear_layer_table(shapes=((96, 24), (24, 96))):
        for metric in ("forward", "dependency", "update"):
            closed, worst = getattr(r["closed"], metric), getattr(r["worst"], metric)
            assert abs(worst - closed) <= 1e-10 * closed
            assert getattr(r["random"], metric) < 0.95 * closed          # random inputs do not find the sup
        assert 0.85 < r["rms_op"] < 1.05                                  # mup_sigma: RMS->RMS norm ~ 1


def test_t06_coordinate_check_is_flat_for_mup_and_muon_not_for_standard(t06, digits):
    widths = (64, 128, 256, 512)
    cc = t06.coordinate_checks(widths, k=5, data=digits)
    slopes = {kind: [t06.slope(widths, [cc[kind][n][f"dact[{layer}]"] for n in widths])
                     for layer in ("z1", "z2", "logits")] for kind in cc}
    assert max(map(abs, slopes["mup"])) < 0.2 and max(map(abs, slopes["muon"])) < 0.2
    assert min(slopes["standard"][1:]) > 0.4                               # negative control: SP grows with n


def test_t06_main_writes_png(t06, tmp_path):
    r = t06.main(["--out", str(tmp_path), "--widths", "16", "32", "--sweep-widths", "16", "--sweep-steps", "3",
                  "--k", "1"])
    assert (tmp_path / "t06_stability_and_mup.png").read_bytes()[:8] == PNG_MAGIC
    assert r["sweep"]["standard"].shape == (1, 7)


# ---- t07 (post 001): independent weight decay -----------------------------------------------------------------

@pytest.fixture(scope="module")
def t07():
    return load_tutorial("t07_independent_weight_decay")


def test_t07_tau_iter_moves_with_lr_for_torch_adamw_and_stays_for_independent(t07, digits):
    lrs = (1e-3, 1e-2, 1e-1)
    sw = t07.lr_sweep(lrs=lrs, steps=30, wd_torch=0.1, wd_indep=3e-3, data=digits)
    # the probe decays by (1 - rate) per step exactly: tau = -1/log(1 - rate)
    np.testing.assert_allclose(sw["tau_decoupled"], [-1 / np.log1p(-lr * 0.1) for lr in lrs], rtol=1e-9)
    np.testing.assert_allclose(sw["tau_independent"], -1 / np.log1p(-3e-3), rtol=1e-9)
    assert sw["tau_decoupled"][0] / sw["tau_decoupled"][-1] > 90             # moves 100x over the sweep


def test_t07_fixed_tau_epoch_gives_the_same_decay_per_epoch_across_data_sizes(t07, digits):
    ds = t07.data_sizes(sizes=(160, 640), epochs=2, tau_epoch=10.0, data=digits)
    for n in (160, 640):
        assert ds[("tau_epoch", n)]["tau_epoch"] == pytest.approx(10.0, rel=0.02)
    assert ds[("fixed", 160)]["tau_epoch"] == pytest.approx(4 * ds[("fixed", 640)]["tau_epoch"], rel=0.02)
    assert t07.tau_iter(np.array([1.0, 1.0])) == np.inf


def test_t07_main_writes_png(t07, tmp_path):
    t07.main(["--out", str(tmp_path), "--steps", "3", "--epochs", "1"])
    assert (tmp_path / "t07_independent_weight_decay.png").read_bytes()[:8] == PNG_MAGIC


# ---- t08: trajectories ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def t08():
    return load_tutorial("t08_trajectories")


def test_t08_sgd_on_the_quadratic_is_the_closed_form(t08):
    """x_t = (1 - eta)^t x_0, y_t = (1 - eta kappa)^t y_0 (eta = 0.07, kappa = 25)."""
    xs, _ = t08.trajectory(refopt.SGD(lr=0.07), t08.quadratic, (-4.0, 1.0), 40)
    t = np.arange(41)
    np.testing.assert_allclose(xs[:, 0], -4.0 * 0.93 ** t, rtol=1e-12)
    np.testing.assert_allclose(xs[:, 1], (1 - 0.07 * 25) ** t, rtol=1e-11)


def test_t08_sign_descent_moves_every_coordinate_by_exactly_lr(t08):
    rule = t08.rules("quadratic")["sign descent"]
    xs, _ = t08.trajectory(rule, t08.quadratic, (-4.0, 1.0), 30)
    np.testing.assert_allclose(np.abs(np.diff(xs, axis=0)), rule.lr, rtol=1e-12)
    xa, _ = t08.trajectory(t08.rules("quadratic")["Adam"], t08.quadratic, (-4.0, 1.0), 30)
    assert np.max(np.abs(np.abs(np.diff(xa, axis=0)) - 0.15)) > 1e-3        # Adam (beta1 > 0) is not sign descent


def test_t08_muon_direction_is_orthogonal_and_wins_on_the_ill_conditioned_matrix_problem(t08):
    m = t08.matrix_runs(steps=150)
    np.testing.assert_allclose(m["sv_muon_direction"], 1.0, rtol=1e-12)
    assert m["sv_gradient"].max() / m["sv_gradient"].min() > 1e3
    assert m["Muon (msign, svd)"][-1] < 1e-2 * min(m["SGD"][-1], m["Adam"][-1])


def test_t08_main_writes_png(t08, tmp_path):
    t08.main(["--out", str(tmp_path), "--steps", "5", "--rosen-steps", "5", "--matrix-steps", "5"])
    assert (tmp_path / "t08_trajectories.png").read_bytes()[:8] == PNG_MAGIC


# ---- t09: Adam's bias correction and eps placements ----------------------------------------------------------

@pytest.fixture(scope="module")
def t09():
    return load_tutorial("t09_adam_details")


def test_t09_bias_corrected_steps_have_size_lr_from_the_first_step(t09):
    g = np.array([1.0, 1e-3, 1e-6])
    st = t09.steps_refopt(g, 50)
    np.testing.assert_allclose(st, np.broadcast_to(1e-3 * g / (g + 1e-8), st.shape), rtol=1e-12)
    assert t09.uncorrected_ratio(1) == pytest.approx(0.1 / np.sqrt(0.001), rel=1e-14)   # 3.162
    assert t09.uncorrected_ratio(np.arange(1, 200)).max() > 6.0                         # negative control


def test_t09_eps_placements(t09):
    grid = np.geomspace(1e-12, 1.0, 25)
    f = t09.first_step(grid)
    np.testing.assert_allclose(t09.steps_refopt(grid, 1)[0], f["E1"], rtol=1e-12)        # refopt is E1
    # E2 is E1 with eps / sqrt(1 - beta2^t)
    np.testing.assert_allclose(f["E2"], 1e-3 * grid / (grid + 1e-8 / np.sqrt(1 - 0.999)), rtol=1e-12)
    big = grid > 1e-2
    for k in ("E2", "E3"):
        np.testing.assert_allclose(f[k][big], f["E1"][big], rtol=1e-3)                  # agree for |g| >> eps
    assert f["E1"][0] / f["E3"][0] > 1e3                                                # and not for tiny |g|


def test_t09_refopt_matches_torch_adam(t09):
    pytest.importorskip("torch")
    grid = np.geomspace(1e-12, 1.0, 13)
    import torch
    p = torch.zeros(len(grid), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    p.grad = torch.tensor(grid)
    opt.step()
    np.testing.assert_allclose(t09.steps_refopt(grid, 1)[0], np.abs(p.detach().numpy()), rtol=1e-15)


def test_t09_main_writes_png(t09, tmp_path):
    r = t09.main(["--out", str(tmp_path), "--steps", "20", "--no-peers"])
    assert r["peers"] == {}
    assert (tmp_path / "t09_adam_details.png").read_bytes()[:8] == PNG_MAGIC


# ---- t10: Newton-Schulz polynomials ---------------------------------------------------------------------------

def test_t10_msign_singular_values_are_the_scalar_map_and_the_bands(tmp_path):
    t10 = load_tutorial("t10_newton_schulz")
    r = t10.main(["--out", str(tmp_path)])
    assert (tmp_path / "t10_newton_schulz.png").read_bytes()[:8] == PNG_MAGIC
    assert max(r["check"].values()) < 1e-13
    lo, hi = r["band_0.1"]["jordan"]
    assert 0.68 < lo < 0.69 and 1.13 < hi < 1.14                          # a band around 1, not 1
    assert r["band_0.1"]["classic"][0] > 0.99 and r["band"]["classic"][0] < 0.05   # classic: slow for small x
    assert abs(r["band"]["polar_express"][0] - 1) < 1e-3 and abs(r["band"]["polar_express"][1] - 1) < 1e-3


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
