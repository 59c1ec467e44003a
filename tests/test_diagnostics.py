"""refopt.diagnostics against closed forms, refopt.mup's tables, and the LRTable rule (post 002)."""
import math

import numpy as np
import pytest

import refopt
from refopt import tree as T
from refopt import diagnostics as D
from refopt import mup

RNG = np.random.default_rng(0)


def _orthogonal_to(w, g):
    """g minus its component along w (so <w, u> = 0)."""
    wf = w.reshape(-1)
    return g - w * (wf @ g.reshape(-1)) / (wf @ wf)


# ---- ELR, AUS ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lr", [1e-3, 0.05, 0.7])
def test_hyperball_with_orthogonal_u_turns_by_atan_lr(lr):
    """Hyperball: y = W - lr R N(u), W' = R N(y); with u orthogonal to W the angle is atan(lr), so
    AUS = 2 sin(atan(lr)/2) (closed form); the first-order forms give lr (= ELR of the direction)."""
    w = RNG.standard_normal((7, 5))
    g = _orthogonal_to(w, RNG.standard_normal((7, 5)))
    rule = refopt.Hyperball(refopt.SGD(lr=1.0), lr=lr)
    w_next, _ = refopt.update(rule, refopt.init(rule, w), w, g)
    assert D.aus(w, w_next) == pytest.approx(2 * math.sin(math.atan(lr) / 2), rel=1e-12)
    u = g * (np.linalg.norm(w) / np.linalg.norm(g))       # the direction scaled to ||u|| = ||W||
    assert D.elr(w, u, lr) == pytest.approx(lr, rel=1e-14)
    assert D.aus_first_order(w, u, lr) == pytest.approx(lr, rel=1e-12)
    # first order: AUS = lr + O(lr^3) for orthogonal u
    assert abs(D.aus(w, w_next) - lr) <= lr ** 3


def test_aus_first_order_drops_the_radial_part():
    """The tangent form removes the part of u along w, which does not turn w; negative control: the
    plain ELR does not (it is larger for a u with a radial part)."""
    w = RNG.standard_normal(20)
    u = 3.0 * w + _orthogonal_to(w, RNG.standard_normal(20))
    lr = 1e-4
    exact = D.aus(w, w - lr * u)
    assert D.aus_first_order(w, u, lr, tangent=True) == pytest.approx(exact, rel=1e-3)
    assert D.aus_first_order(w, u, lr, tangent=False) > 1.5 * exact


@pytest.mark.parametrize("base", [refopt.SGD(lr=1.0), refopt.Adam(lr=1.0), refopt.Muon(lr=1.0)])
def test_covariant_logs_exactly_its_lr(base):
    """Covariant: ||W' - W|| / ||W|| = lr (eq. elr-u), so the group ELR is the rule's lr to rounding."""
    params = {"a": RNG.standard_normal((6, 4)), "b": RNG.standard_normal((3, 8))}
    grads = {k: RNG.standard_normal(v.shape) for k, v in params.items()}
    rule = refopt.Covariant(base, lr=0.013)
    new, state = refopt.update(rule, refopt.init(rule, params), params, grads)
    for k in params:
        m = D.group_metrics({k: params[k]}, {k: new[k]}, {"all": 0.013}, {k: "all"})
        assert m["elr[all]"] == pytest.approx(0.013, rel=1e-13)
    labels = D.group_labels(state, params)
    assert labels == {"a": "all", "b": "all"}
    m = D.group_metrics(params, new, {"all": 0.013}, labels)
    assert m["elr[all]"] == pytest.approx(0.013, rel=1e-13)       # every array moved by 1.3 %, so the group too
    assert m["u_rms[all]"] == pytest.approx(D.rms(np.concatenate([params["a"].ravel(), params["b"].ravel()])),
                                            rel=1e-12)            # ||U|| = ||W||: U = step/lr


def test_group_metrics_use_partition_labels_and_sgd_closed_form():
    """SGD: the step is lr*g, so elr = lr ||g||/||w||, u_rms = rms(g) per Partition group."""
    params = {"w": RNG.standard_normal((4, 4)), "b": RNG.standard_normal(4)}
    grads = {k: RNG.standard_normal(v.shape) for k, v in params.items()}
    rule = refopt.Partition(rules={"hidden": refopt.SGD(lr=0.1), "other": refopt.SGD(lr=0.02)},
                            labels=lambda p, x: "hidden" if x.ndim == 2 else "other")
    new, state = refopt.update(rule, refopt.init(rule, params), params, grads)
    m = D.group_metrics(params, new, {"hidden": 0.1, "other": 0.02}, D.group_labels(state, params))
    assert sorted(m) == ["aus[hidden]", "aus[other]", "elr[hidden]", "elr[other]", "u_rms[hidden]",
                         "u_rms[other]", "w_rms[hidden]", "w_rms[other]"]
    for g, k, lr in (("hidden", "w", 0.1), ("other", "b", 0.02)):
        assert m[f"elr[{g}]"] == pytest.approx(lr * np.linalg.norm(grads[k]) / np.linalg.norm(params[k]), rel=1e-12)
        assert m[f"u_rms[{g}]"] == pytest.approx(D.rms(grads[k]), rel=1e-12)
        assert m[f"w_rms[{g}]"] == pytest.approx(np.sqrt(np.mean(params[k] ** 2)), rel=1e-14)
    with pytest.raises(ValueError, match="no learning rate for group 'other'"):
        D.group_metrics(params, new, {"hidden": 0.1}, D.group_labels(state, params))


def test_zero_norms_are_finite_and_documented():
    z, w = np.zeros((3, 3)), np.ones((3, 3))
    assert D.elr(z, w, 0.1) == 0.0 and D.elr(w, z, 0.1) == 0.0 and D.elr(w, w, 0.0) == 0.0
    assert D.aus(z, z) == 0.0 and D.aus(z, w) == pytest.approx(1.0, rel=1e-15) == D.aus(w, z)
    assert D.aus_first_order(z, w, 0.1) == 0.0 and D.eta_eff(z, 0.1) == 0.0
    assert D.rms(np.zeros(0)) == 0.0 and D.rms_operator_norm(np.zeros((0, 3))) == 0.0
    m = D.group_metrics({"a": z}, {"a": z}, {"all": 0.0}, {"a": "all"})
    assert all(np.isfinite(v) for v in m.values()) and m["u_rms[all]"] == 0.0
    with pytest.raises(ValueError, match="lr must be >= 0"):
        D.elr(w, w, -1.0)
    with pytest.raises(ValueError, match="different shapes"):
        D.aus(w, np.ones(9))


def test_float32_inputs_accumulate_in_float64():
    w32 = RNG.standard_normal((50, 30)).astype(np.float32)
    w64 = w32.astype(np.float64)
    assert D.rms(w32) == D.rms(w64)
    assert D.rms_operator_norm(w32) == pytest.approx(D.rms_operator_norm(w64), rel=1e-14)
    with pytest.raises(TypeError, match="floating-point"):
        D.rms(np.ones(3, dtype=np.int64))


# ---- post 003: stability metrics of a linear layer ----------------------------------------------------------

@pytest.mark.parametrize("shape", [(32, 8), (8, 32), (20, 20)])
def test_linear_metrics_against_the_svd(shape):
    """Closed forms sqrt(d_in/d_out) ||W||_2, twice that, sqrt(d_in/d_out) ||dW||_2; attained by
    x = sqrt(d_in) * (top left singular vector) and -x, which the empirical maxima find to 1e-10."""
    d_in, d_out = shape
    W, dW = RNG.standard_normal(shape), 1e-2 * RNG.standard_normal(shape)
    s = np.linalg.svd(W, compute_uv=False)[0]
    closed = D.linear_stability(W, dW)
    assert closed.forward == pytest.approx(math.sqrt(d_in / d_out) * s, rel=1e-13)
    assert closed.dependency == pytest.approx(2 * closed.forward, rel=1e-15)
    U, _, _ = np.linalg.svd(W)
    Ud, _, _ = np.linalg.svd(dW)
    x = math.sqrt(d_in) * np.stack([U[:, 0], -U[:, 0], Ud[:, 0], RNG.standard_normal(d_in)])
    x[3] *= math.sqrt(d_in) / np.linalg.norm(x[3])                  # every input on the RMS-1 sphere
    emp = D.empirical_stability(lambda p, xb: xb @ p, W, x, dW)
    assert abs(emp.forward - closed.forward) <= 1e-10 * closed.forward
    assert abs(emp.dependency - closed.dependency) <= 1e-10 * closed.dependency
    assert abs(emp.update - closed.update) <= 1e-10 * closed.update
    # negative control: random inputs only bound the suprema from below (strictly, here)
    emp_rand = D.empirical_stability(lambda p, xb: xb @ p, W, x[3:], dW)
    assert emp_rand.forward < closed.forward * (1 - 1e-3)


def test_empirical_stability_rejects_a_batch_reducing_function():
    with pytest.raises(ValueError, match="one row"):
        D.empirical_stability(lambda p, xb: (xb @ p).sum(0, keepdims=True), np.eye(3), np.ones((4, 3)))


def test_mup_sigma_gives_unit_rms_operator_norm():
    """post 003: sigma = sqrt(d_out/d_in)/(sqrt(d_in)+sqrt(d_out)) makes ||sigma Z||_{RMS->RMS} about 1."""
    for d_in, d_out in [(256, 64), (64, 256), (512, 512)]:
        W = mup.mup_sigma(d_in, d_out) * np.random.default_rng(1).standard_normal((d_in, d_out))
        assert 0.85 < D.rms_operator_norm(W) < 1.05


def test_mup_lrs_table_of_seed_001():
    assert mup.mup_lrs(0.1, 256, 64, "adam") == pytest.approx({"first": 0.1, "hidden": 0.025, "last": 0.025})
    assert mup.mup_lrs(0.1, 256, 64, "sgd") == pytest.approx({"first": 0.4, "hidden": 0.1, "last": 0.025})
    assert mup.mup_lrs(0.1, 64, 64, "sgd") == {"first": 0.1, "hidden": 0.1, "last": 0.1}
    params = {"layers": [{"w": np.ones((3, 4)), "b": np.ones(4)}, {"w": np.ones((4, 4)), "b": np.ones(4)},
                         {"w": np.ones((4, 2)), "b": np.ones(2)}]}
    rule = mup.mup_partition(params, 0.1, 256, 64, "adam", beta1=0.8)
    st = refopt.init(rule, params)
    assert [s.label for s in refopt.tree.leaves(st.leaves, is_leaf=lambda s: hasattr(s, "label"))] == \
        ["first", "first", "first", "hidden", "first", "last"]
    assert rule.rules["hidden"].lr == pytest.approx(0.025) and rule.rules["hidden"].beta1 == 0.8
    with pytest.raises(ValueError, match="optimizer"):
        mup.mup_lrs(0.1, 4, 4, "lion")


# ---- LRTable (post 002) ----------------------------------------------------------------------------------------

def _muon_params():
    return {"w1": RNG.standard_normal((6, 5)), "w2": RNG.standard_normal((5, 4))}


def test_lr_table_equals_muon_with_that_lr_per_step():
    """A table row (lr_1, lr_2, lr_3) gives, step by step, Muon's step with lr = lr_t (an independent run
    per step: Muon(lr=lr_t) from the same momentum); rows not in the table use the base's own lr."""
    params = _muon_params()
    rows = (0.03, 0.01, 0.02)
    rule = refopt.LRTable(refopt.Muon(lr=0.005), {"w1": rows})
    state = refopt.init(rule, params)
    p = params
    ref_p = {k: v.copy() for k, v in params.items()}
    ref_m = {k: np.zeros_like(v) for k, v in params.items()}
    for t, lr in enumerate(rows, start=1):
        g = {k: RNG.standard_normal(v.shape) for k, v in params.items()}
        p, state = refopt.update(rule, state, p, g)
        for k, lr_k in (("w1", lr), ("w2", 0.005)):
            m = refopt.Muon(lr=lr_k)
            st = refopt.OptState(t - 1, None, refopt.rules.muon.MuonState(ref_m[k]))
            ref_p[k], st = refopt.update(m, st, ref_p[k], g[k])
            ref_m[k] = st.leaves.m
            np.testing.assert_allclose(p[k], ref_p[k], rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="has 3 steps, step 4"):
        refopt.update(rule, state, p, g)


def test_lr_table_round_trips_through_a_checkpoint(tmp_path):
    params = _muon_params()
    rule = refopt.LRTable(refopt.Muon(lr=0.01), {"w1": (0.1 / 3, 1e-300, 0.0), "w2": (1.0, 2.0, 3.0)})
    state = refopt.init(rule, params)
    refopt.save(tmp_path / "c.npz", params, state, rule)
    back = refopt.load(tmp_path / "c.npz")
    assert back.rule == rule and back.rule.lrs["w1"][0] == 0.1 / 3     # bit for bit
    assert refopt.checkpoint.rule_to_json(back.rule) == refopt.checkpoint.rule_to_json(rule)


@pytest.mark.parametrize("lrs, match", [({}, "non-empty"), ({"w1": ()}, "non-empty sequence"),
                                        ({"w1": (0.1, -1.0)}, ">= 0"), ({"w1": (math.nan,)}, "finite"),
                                        ({3: (0.1,)}, "strings"), ({"w1": 0.1}, "sequence")])
def test_lr_table_rejects_bad_tables(lrs, match):
    with pytest.raises(ValueError, match=match):
        refopt.LRTable(refopt.Muon(), lrs)


def test_lr_table_rejects_a_path_params_lack_and_a_decaying_base():
    with pytest.raises(ValueError, match="w9, which params lacks"):
        refopt.init(refopt.LRTable(refopt.Muon(), {"w9": (0.1,)}), _muon_params())
    with pytest.raises(ValueError, match="weight_decay"):
        refopt.LRTable(refopt.Muon(weight_decay=0.1), {"w1": (0.1,)})


def test_lr_table_relative_mode_replays_eta_eff():
    """relative=True: the step's lr is lrs[p][t-1] * ||W_{t-1}||_F, so eta/||W|| of the step is the table's
    value (post 002's eta_eff); checked against Muon with that lr computed by hand."""
    params = _muon_params()
    rule = refopt.LRTable(refopt.Muon(lr=0.0), {"w1": (0.01, 0.02)}, relative=True)
    state = refopt.init(rule, params)
    g = {k: RNG.standard_normal(v.shape) for k, v in params.items()}
    new, _ = refopt.update(rule, state, params, g)
    lr = 0.01 * np.linalg.norm(params["w1"])
    m = refopt.Muon(lr=lr)
    ref, _ = refopt.update(m, refopt.init(m, params["w1"]), params["w1"], g["w1"])
    np.testing.assert_allclose(new["w1"], ref, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(new["w2"], params["w2"])                # lr 0 outside the table


# ---- refopt train --diagnostics ------------------------------------------------------------------------------

def test_train_diagnostics_columns_and_covariant_elr_is_its_lr(tmp_path):
    """metrics.csv gets elr/aus/w_rms/u_rms per Partition group; the Covariant group's elr is its lr_t
    (constant schedule) to rounding, and diagnostics.png is written. Without the flag: no such columns."""
    import csv

    from refopt.cli import main

    out = tmp_path / "d"
    argv = ["train", "--model", "mlp", "--steps", "4", "--batch-size", "16", "--hidden", "12", "--no-progress",
            "--dtype", "float64", "--eval-interval", "2", "--optimizer", "covariant", "--lr", "0.01",
            "--schedule", "constant"]
    assert main([*argv, "--out", str(out), "--diagnostics"]) == 0
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    for col in ("elr[hidden]", "elr[other]", "aus[hidden]", "aus[other]", "w_rms[hidden]", "w_rms[other]",
                "u_rms[hidden]", "u_rms[other]"):
        assert col in rows[0], col
    for r in rows:
        assert float(r["elr[hidden]"]) == pytest.approx(0.01, rel=1e-12)
        assert 0 < float(r["aus[hidden]"]) < 0.02 and float(r["w_rms[other]"]) > 0
    assert (out / "diagnostics.png").read_bytes()[:4] == b"\x89PNG"
    assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
    assert "elr[hidden]" not in open(tmp_path / "plain" / "metrics.csv").readline()
    assert not (tmp_path / "plain" / "diagnostics.png").exists()


def _lrs_at(rule, params, t):
    """info["lr"] of step t (what --diagnostics divides the step by)."""
    s = refopt.init(rule, params)
    for _ in range(t):
        info = {}
        params, s = refopt.update(rule, s, params, T.tree_map(np.ones_like, params), info=info)
    return info["lr"]


def test_group_lrs_follow_the_rule_schedule():
    sched = refopt.schedules.LinearDecay(10)
    rule = refopt.Partition(rules={"hidden": refopt.Covariant(refopt.SGD(lr=1.0), lr=0.02, schedule=sched),
                                   "other": refopt.EMA(refopt.AdamW(lr=1e-3, schedule=sched))},
                            labels=refopt.matrix_labels)
    p = {"w": np.ones((2, 3)), "b": np.ones(3)}
    assert _lrs_at(rule, p, 5) == pytest.approx({"hidden": 0.02 * 0.5, "other": 1e-3 * 0.5})
    assert _lrs_at(refopt.ScheduleFreeSGD(lr=0.1, warmup_steps=4), np.ones(2), 1) == {"all": pytest.approx(0.025)}


def test_coordinate_check_against_a_hand_computed_sgd_step():
    """One SGD step on a linear least-squares 'network' f(x) = x W: dW = -lr * x^T (x W - y) / N exactly, so
    dact = rms(x dW) and dw = rms(dW); with no steps every change is 0 and act is the init's RMS."""
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((8, 3)), rng.standard_normal((8, 2))

    def init(n):
        return {"w": np.full((3, 2), 0.1 * n)}

    def loss(p, xb, yb):
        r = xb @ p["w"] - yb
        return (r * r).sum() * (0.5 / len(xb))

    feats = lambda p, xb: {"out": xb @ p["w"]}  # noqa: E731
    lr = 0.05
    got = D.coordinate_check([1, 2], init, lambda n: refopt.SGD(lr=lr), loss, feats, [(x, y)], x)
    for n in (1, 2):
        w0 = init(n)["w"]
        dW = -lr * x.T @ (x @ w0 - y) / len(x)
        assert got[n]["dw[w]"] == pytest.approx(D.rms(dW), rel=1e-12)
        assert got[n]["dact[out]"] == pytest.approx(D.rms(x @ dW), rel=1e-12)
        assert got[n]["act[out]"] == pytest.approx(D.rms(x @ (w0 + dW)), rel=1e-12)
    none = D.coordinate_check([1], init, lambda n: refopt.SGD(lr=lr), loss, feats, [], x)
    assert none[1]["dw[w]"] == 0.0 and none[1]["dact[out]"] == 0.0


def test_diagnostics_figure_series_ratio_and_lr_zero_step():
    """diagnostics.png's curves: AUS / ELR per group (the informative quantity: AUS alone nearly repeats ELR
    when the step is orthogonal to w), w_rms as logged, and the lr = 0 step (the schedule's last, where
    elr, aus and u_rms are 0 by definition) left out of every panel but w_rms and listed."""
    from refopt.cli import diagnostics as cli_diagnostics

    rows = [{"step": 1, "lr[all]": 0.1, "elr[all]": 0.02, "aus[all]": 0.015, "w_rms[all]": 1.0, "u_rms[all]": 0.3},
            {"step": 2, "lr[all]": 0.05, "elr[all]": 0.01, "aus[all]": 0.01, "w_rms[all]": 1.1, "u_rms[all]": 0.2},
            {"step": 3, "lr[all]": 0.0, "elr[all]": 0.0, "aus[all]": 0.0, "w_rms[all]": 1.2, "u_rms[all]": 0.0}]
    data, skipped = cli_diagnostics.series(rows)
    assert skipped == [3]
    steps, ratio = data["aus/elr"]["all"]
    assert steps == [1, 2, 3] and ratio[:2] == [0.75, 1.0] and np.isnan(ratio[2])
    for panel, expect in (("elr", [0.02, 0.01]), ("u_rms", [0.3, 0.2])):
        assert data[panel]["all"][1][:2] == expect and np.isnan(data[panel]["all"][1][2])
    assert data["w_rms"]["all"][1] == [1.0, 1.1, 1.2]
    # negative control: the same rows with a nonzero last lr keep every value
    rows[2]["lr[all]"] = 0.01
    data, skipped = cli_diagnostics.series(rows)
    assert skipped == [] and data["u_rms"]["all"][1] == [0.3, 0.2, 0.0]


def test_diagnostics_figure_defines_its_symbols(tmp_path, monkeypatch):
    """The titles are mathtext (rendered, not raw TeX), the footnote defines w, Δ, lr_t, U, the norm, RMS and
    AUS (cited as post 000, never 'seed 000'), and names the step left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from refopt.cli import diagnostics as cli_diagnostics

    texts, savefig = [], plt.Figure.savefig        # saved for real: a mathtext error fails the drawing

    def keep_texts(fig, *a, **k):
        texts.extend(t.get_text() for t in fig.findobj(matplotlib.text.Text))
        return savefig(fig, *a, **k)

    monkeypatch.setattr(plt.Figure, "savefig", keep_texts)
    rows = [{"step": s, "lr[all]": lr, "elr[all]": 0.01 * lr, "aus[all]": 0.009 * lr, "w_rms[all]": 1.0,
             "u_rms[all]": 0.2 if lr else 0.0} for s, lr in ((1, 1.0), (2, 0.5), (3, 0.0))]
    cli_diagnostics.plot(str(tmp_path / "d.png"), rows, "mlp: AdamW")
    text = "\n".join(texts)
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"
    for needle in (r"$\mathrm{ELR} = \mathrm{lr}_t\,\|U\| / \|w\|$", r"$\Delta = w_{t+1} - w_t$",
                   r"$\mathrm{lr}_t$: the group's learning rate", r"$\mathrm{RMS}(x) = \|x\| / \sqrt{n}$",
                   "(angular update size, post 000)", "step 3.", "group all"):
        assert needle in text, needle
    assert "seed" not in text
