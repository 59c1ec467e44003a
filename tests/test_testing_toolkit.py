"""refopt.testing: the properties against refopt's own rules and the theory's table (expected.py), a
shrunk counterexample, the adapters' purity and layout, and the README example."""
import os
import re

import numpy as np
import pytest

import refopt
from refopt.testing import RuleAdapter, make_adapter
from refopt.testing import properties as P
from refopt.testing.adapters import from_layout, to_layout
from refopt.testing.expected import expected

README = os.path.join(os.path.dirname(__file__), "..", "README.md")

def _two_labels(path, x):
    return "mat" if x.ndim == 2 else "vec"


#: one refopt rule of every family expected.py knows, wrappers around several bases. ClipByGlobalNorm's
#: max_norm 30 lies inside the drawn gradient norms (entries 1 to 100, times c in [0.1, 10]), so the clip
#: is active at some steps and not at others, which is where Clip(Adam) loses gradient-scale invariance.
RULES = [
    refopt.SGD(lr=0.1, momentum=0.9),
    refopt.SGD(lr=0.1, weight_decay=0.1),
    refopt.Adam(lr=0.01),
    refopt.Adam(lr=0.01, weight_decay=0.1),                       # L2: not scale invariant
    refopt.AdamW(lr=0.01, weight_decay=0.1),                      # decoupled: scale invariant
    refopt.Muon(lr=0.02, msign="svd"),
    refopt.Lion(lr=0.1),
    refopt.Lion(lr=0.1, weight_decay=0.5),
    refopt.ScheduleFreeSGD(lr=0.5),
    refopt.ScheduleFreeAdamW(lr=0.05),
    refopt.Covariant(refopt.SGD(momentum=0.5), lr=0.05),
    refopt.Hyperball(refopt.Adam(), lr=0.05),
    refopt.EMA(refopt.Lion(lr=0.1)),
    refopt.Average(refopt.Muon(lr=0.02, msign="svd")),
    refopt.Partition({"mat": refopt.Adam(lr=0.01), "vec": refopt.Lion(lr=0.01)}, labels=_two_labels),
    refopt.ClipByGlobalNorm(refopt.Adam(lr=0.1), max_norm=30.0),
    refopt.ClipByGlobalNorm(refopt.Lion(lr=0.1, beta1=0.0), max_norm=30.0, eps=1e-6),
    refopt.ClipByGlobalNorm(refopt.SGD(lr=0.1, momentum=0.9), max_norm=30.0),
    refopt.ClipByGlobalNorm(refopt.Muon(lr=0.02, msign="svd"), max_norm=30.0),
    refopt.RMSprop(lr=0.01),
    refopt.RMSprop(lr=0.01, momentum=0.9, centered=True, weight_decay=0.1),   # L2: not scale invariant
    refopt.Adagrad(lr=0.05),
    refopt.Adagrad(lr=0.05, initial_accumulator_value=0.1, eps=1e-7, eps_mode="inside"),   # not stated
    refopt.Adamax(lr=0.05),
    refopt.Adamax(lr=0.05, weight_decay=0.1),   # L2: not scale invariant
    refopt.Adadelta(lr=1.0, eps=1e-10),
    refopt.Adadelta(lr=0.5, eps=1e-4, weight_decay=0.1),   # eps 1e-4 and L2: not stated
    refopt.RMSprop(lr=0.01, alpha=0.9, eps=1e-12, eps_mode="inside", bias_correction=True, momentum=0.9,
                   nesterov=True),
    refopt.Signum(lr=0.01),
    refopt.Signum(lr=0.01, beta=0.0),
    refopt.AdaBelief(lr=0.01, nesterov=True),
    refopt.Yogi(lr=0.01),   # v_0 and eps absolute: not scale invariant
    refopt.RAdam(lr=0.01, beta2=0.9),   # the momentum steps have degree 1 in g
    refopt.RAdam(lr=0.01, beta2=0.9, eps_mode="corrected", nesterov=True, weight_decay=0.1,
                 decoupled_weight_decay=True),
    refopt.Rprop(lr=0.01),
    refopt.Rprop(lr=0.01, form="optax"),
    refopt.OptimisticGradientDescent(lr=0.01, alpha=0.7, beta=0.4),
    refopt.Adan(lr=0.01, eps=1e-12, eps_root=0.0),
    refopt.ASGD(lr=0.01, lambd=0.1, t0=0.0),
    refopt.NovoGrad(lr=0.01, eps=1e-12),
    refopt.LARS(lr=0.1, momentum=0.9, trust_coefficient=0.02),
    refopt.LARS(lr=0.1, weight_decay=0.01, eps=1e-3, nesterov=True),   # decay and eps: not scale invariant
    refopt.LAMB(lr=0.01, eps=1e-12),
    refopt.LAMB(lr=0.01, weight_decay=0.05),
    refopt.Fromage(lr=0.05, min_norm=0.0),
    refopt.OptimisticAdam(lr=0.01, eps=1e-12),
    refopt.SM3(lr=0.01, eps=1e-12),
    refopt.Fromage(lr=0.05, min_norm=100.0),   # the floor: not scale invariant
    refopt.Adafactor(lr=0.01),   # factored: not permutation equivariant; the parameter scale: covariant
    refopt.Adafactor(lr=0.01, factored=False, beta1=0.9, momentum_dtype="float64", form="optax"),
    refopt.ADOPT(lr=0.01, eps=1e-12),
    refopt.AdEMAMix(lr=0.01, eps=1e-12),
    refopt.SimplifiedAdEMAMix(lr=0.01, eps=1e-12),
    refopt.ACProp(lr=0.01, eps=1e-12),
    refopt.MADGRAD(lr=0.01),
    refopt.DoG(init_step="distance", init_value=0.1),
    refopt.DoWG(init_sq_dist=1e-2, eps=1e-12),
    refopt.COCOB(eps=1e-12),
    refopt.COCOB(alpha=20.0, weight_decay=0.1),   # L2: not scale invariant
    refopt.Prodigy(d0=1e-3, eps=1e-12),
    refopt.Cautious(refopt.Lion(), lr=1e-3),
    refopt.Cautious(refopt.Adam(eps=1e-12), lr=1e-3, mask="signbit"),
    refopt.DAdaptAdam(d0=1e-3, eps=1e-12),
    refopt.DAdaptAdam(d0=1e-3, weight_decay=0.1),   # L2: not scale invariant
    refopt.MARS(lr=1e-2, max_norm=None, eps=1e-12),   # no clip: degree 0 in g
    refopt.MARS(lr=1e-2, kind="lion", max_norm=None, weight_decay=0.1),   # decoupled decay: scale invariant
    refopt.MARS(lr=1e-2, eps=1e-12, max_norm=3.0),   # the clip acts at some scales only: not scale invariant
    refopt.NorMuon(lr=0.02, msign="svd", eps=1e-30),   # degree 0 in g; v per neuron: not orthogonally equivariant
    refopt.Dion(lr=0.02, rank=2, eps=1e-12),   # degree 0 in g; a fixed Q_0: not orthogonally equivariant
    refopt.SOAP(lr=0.01, eps=1e-12, precondition_frequency=2),   # degree 0 in g; rotations mix the entries
    refopt.Shampoo(lr=0.01, eps=1e-12),   # matrix roots: degree 0 in g, rotations followed
    refopt.Shampoo(lr=0.01, momentum=0.5, eps=1e-12),   # momentum mixes g and a degree-0 update: not scale invariant
    refopt.Scion(lr=0.01, msign="svd"),   # msign and d / RMS(d): degree 0 in g; msign follows rotations
    refopt.Scion(lr=0.01, lmo="sign", constraint=True, scale=2.0),   # sign(d) / fan_in: elementwise
    refopt.AdamMini(lr=0.01, weight_decay=0.1),   # one v per array: its mean square, kept by rotations and permutations
    refopt.AdamMini(lr=0.01, block="fan_out", eps=1e-12),   # v per output neuron: degree 0 in g, neither symmetry
    refopt.PSGDKron(lr=0.01),   # a fit of finitely many steps from Q_0 = I and a clip: no invariance stated
    refopt.Prodigy(d0=1e-3, weight_decay=0.1, decoupled=False),   # L2: not scale invariant
    refopt.Mechanic(refopt.Adam(lr=0.01), eps=1e-3),   # eps in |h| + eps: not scale invariant
    refopt.PolyakSGD(),   # the loss value drawn per step; the cap s_max keeps gradient scale unstated
    refopt.Momo(weight_decay=0.1),   # <g, x> and ||d||: rotations and permutations kept
    refopt.MomoAdam(lr=0.05),   # D_t per entry: permutations only
    refopt.LBFGS(),   # evaluates the loss itself: the random gradient streams give none (not applicable)
]
CHEAP = ["gradient_scale_invariance", "parameter_scale_covariance", "orthogonal_equivariance",
         "permutation_equivariance", "reparametrization_covariance", "mup_step_size"]


def _rule_id(rule):
    base = getattr(rule, "base", None)
    return type(rule).__name__ + ("" if base is None else f"({type(base).__name__})")


def _theory_vs_measured(rule, exp):
    """[(property, stated, measured Outcome)] where the table states an outcome the rule does not have."""
    mo = P._matrix_only(rule)
    bad = []
    for prop in P.PROPERTIES:
        if prop.name not in CHEAP or exp[prop.name] is None:
            continue
        o = prop.run(RuleAdapter(rule), max_examples=4, rtol=1e-5, matrix_only=mo, lr=getattr(rule, "lr", None))
        if o.holds is not None and o.holds != exp[prop.name]:
            bad.append((prop.name, exp[prop.name], o))
    return bad


@pytest.mark.filterwarnings("ignore:Partition. no parameter has the label")
@pytest.mark.parametrize("rule", RULES, ids=[f"{i}-{_rule_id(r)}" for i, r in enumerate(RULES)])
def test_refopt_rules_behave_as_the_theory_says(rule):
    """The theory's table (expected.py) against the measured outcome of each refopt rule."""
    assert _theory_vs_measured(rule, expected(rule)) == []


def test_theory_table_families_and_a_wrong_entry_is_caught():
    """RULES covers every rule whose conventions file states invariance facts (LRTable states none: its
    table is tied to one run's arrays); flipping one entry (negative control) fails the check."""
    from refopt.conventions import registry

    named = {c.__name__ for conv in registry().values() if conv.facts is not None for c in conv.rules} - {"LRTable"}
    assert {"Lion", "ClipByGlobalNorm", "SGD", "Partition", "RMSprop"} <= named
    assert named - {type(r).__name__ for r in RULES} == set()
    lion = refopt.Lion(lr=0.1)
    exp = expected(lion)
    assert exp["gradient_scale_invariance"] is True and exp["permutation_equivariance"] is True
    for prop in ("gradient_scale_invariance", "permutation_equivariance", "orthogonal_equivariance"):
        wrong = {**exp, prop: not exp[prop]}
        assert [b[0] for b in _theory_vs_measured(lion, wrong)] == [prop]
    clip = refopt.ClipByGlobalNorm(refopt.Adam(lr=0.1), max_norm=30.0)   # a wrong entry: scale invariant
    assert [b[0] for b in _theory_vs_measured(clip, {**expected(clip), "gradient_scale_invariance": True})] \
        == ["gradient_scale_invariance"]


def test_mup_step_size_exact_for_svd_spectral_not_for_newton_schulz():
    good = P.mup_step_size(RuleAdapter(refopt.Muon(lr=0.02, msign="svd")), max_examples=5, rtol=1e-10, lr=0.02)
    assert good.holds and good.err <= 1e-12
    ns = P.mup_step_size(RuleAdapter(refopt.Muon(lr=0.02)), max_examples=5, rtol=1e-3, lr=0.02)
    assert ns.holds is False


def test_counterexample_is_shrunk_torch_sgd_covariance():
    """torch SGD is not covariant (post 000, eq. phi); hypothesis shrinks the failing input to one tiny array."""
    torch = pytest.importorskip("torch")
    o = P.parameter_scale_covariance(make_adapter(torch.optim.SGD, {"lr": 0.1}), max_examples=10, rtol=1e-5)
    assert o.holds is False and o.err > 0.1
    x0 = re.search(r"x0=\[(.*?)\], grads", o.counterexample, re.S).group(1)
    assert x0.count("[") <= 2 and len(re.findall(r"-?\d+\.\d+", x0)) <= 2, o.counterexample


def test_invariants_report_torch_adam_and_wrong_claim():
    torch = pytest.importorskip("torch")
    props = ["gradient_scale_invariance", "permutation_equivariance", "purity", "bit_identical_resume"]
    rep = P.invariants(torch.optim.Adam, "Adam(lr=0.01)", {"lr": 0.01}, properties=props, max_examples=3)
    # purity is n/a for torch (in place by design; the adapter hands it copies): no verdict, no failure
    assert rep.exit_code == 0 and rep.outcomes() == {**{p: "holds" for p in props}, "purity": "n/a"}, rep.table()
    assert [r[4] for r in rep.rows if r[0] == "purity"] == ["n/a"]
    rep = P.invariants(torch.optim.SGD, "Adam(lr=0.01)", {"lr": 0.01}, properties=props[:1], max_examples=3)
    assert rep.exit_code == 1 and rep.failures[0][0] == "gradient_scale_invariance"
    rep = P.invariants(torch.optim.SGD, "SGD(lr=0.01)", {"lr": 0.01}, properties=props[:1], max_examples=3)
    assert rep.exit_code == 0 and rep.rows[0][4] == "expected"      # an expected failure is not an error


class _CubedSGD:
    """x - lr g |g|^2: fails gradient-scale invariance as SGD does, but by c^3 where SGD's error is c."""

    def init(self, params):
        return None

    def step(self, state, params, grads):
        return [x - 0.1 * g * np.abs(g) ** 2 for x, g in zip(params, grads)], state


def test_an_expected_failure_far_worse_than_the_rules_own_is_a_fail(tmp_path):
    """SGD is not gradient-scale invariant, so an SGD implementation failing it is 'expected'; one whose error
    is more than 10x the rule's own on the same input (the rule replayed on the implementation's
    counterexample) is a FAIL, with the input saved in full and replayable. Negative control: a correct SGD
    stays 'expected' (exit 0) and saves nothing."""
    prop = ["gradient_scale_invariance"]
    rep = P.invariants(_CubedSGD(), "SGD(lr=0.1)", framework="numpy", properties=prop, max_examples=5,
                       save_dir=str(tmp_path), command="refopt invariants --impl my.py:cubed --rule 'SGD(lr=0.1)'")
    (name, _, ref, mine, verdict, why) = rep.rows[0]
    assert verdict == "FAIL" and rep.exit_code == 1 and "x the rule's own" in why, rep.table()
    assert ref.holds is False and mine.holds is False
    saved = tmp_path / "gradient_scale_invariance.npz"
    assert mine.replay_file == str(saved) and saved.exists()
    assert f"replay: refopt invariants --impl my.py:cubed --rule 'SGD(lr=0.1)' --replay {saved}" in rep.table()
    case, meta = P.load_case(str(saved))
    assert meta["property"] == "gradient_scale_invariance" and meta["rule"] == "SGD(lr=0.1)"
    assert case["c"] == mine.case["c"] and all(np.array_equal(a, b) for a, b in zip(case["x0"], mine.case["x0"]))
    again, rule_there = P.replay(str(saved), _CubedSGD(), framework="numpy")
    assert again.err == mine.err and again.holds is False and rule_there.err * 10 < again.err
    with pytest.raises(AssertionError, match="gradient_scale_invariance"):
        rep.check()
    ok = P.invariants(_PlainSGD(), "SGD(lr=0.1)", framework="numpy", properties=prop, max_examples=5,
                      save_dir=str(tmp_path / "none"))
    assert ok.rows[0][4] == "expected" and ok.exit_code == 0 and not (tmp_path / "none").exists(), ok.table()
    assert "counterexample" not in ok.table() and ok.check() is ok


class _PlainSGD:
    def init(self, params):
        return None

    def step(self, state, params, grads):
        return [x - 0.1 * g for x, g in zip(params, grads)], state


def test_every_property_has_a_raising_form_for_pytest():
    """P.check(name, impl) and assert_<name>(impl) raise AssertionError with the description and the
    counterexample when the property fails, and return the Outcome when it holds (negative control)."""
    for p in P.PROPERTIES:
        assert callable(getattr(P, f"assert_{p.name}")) and f"assert_{p.name}" in P.__all__
    with pytest.raises(AssertionError, match=r"gradient_scale_invariance FAILS \(err .*counterexample \{x0="):
        P.assert_gradient_scale_invariance(_PlainSGD(), framework="numpy", max_examples=3)
    out = P.assert_permutation_equivariance(_PlainSGD(), framework="numpy", max_examples=3)
    assert out.holds is True
    assert P.check("determinism", refopt.Adam(lr=0.01), max_examples=2).holds is True
    with pytest.raises(ValueError, match="unknown property 'nope'"):
        P.check("nope", _PlainSGD(), framework="numpy")


def test_counterexamples_print_full_precision_on_one_line():
    """A counterexample is one line (no array layout), floats in full precision (replayable by hand), larger
    arrays by shape."""
    v = 0.1 + 1e-12
    assert P._fmt({"x0": [np.array([v])], "c": 2.718281828459045}) == f"{{x0=[[{v!r}]], c=2.718281828459045}}"
    assert float(repr(v)) == v
    assert P._fmt(np.zeros((3, 4))) == "<(3, 4) float64>"


def test_invariants_property_selection_checked_before_any_work():
    """properties=[] or a misspelt name is a ValueError naming the known properties (never a run that
    checks nothing and exits 0), raised before anything runs (the implementation here raises if it is ever called); one
    name as a str is one property; a report without rows prints instead of crashing."""
    class Untouchable:
        def init(self, params):
            raise AssertionError("ran before the selection was checked")
        step = init

    for bad, msg in [([], "properties is empty"), ((), "properties is empty"),
                     (["gradient_scale_invariants"], r"unknown property 'gradient_scale_invariants' in "
                                                     r"properties; choose from \['gradient_scale_invariance'"),
                     ([None], "unknown property None"), (3, "a name or a sequence of names")]:
        with pytest.raises(ValueError, match=msg):
            P.invariants(Untouchable(), "SGD(lr=0.1)", framework="numpy", properties=bad, max_examples=2)

    class SqrtSign:                                  # negative control: the str selection runs and catches it
        def init(self, params):
            return None

        def step(self, state, params, grads):        # lr sign(g) sqrt|g|: scales with c^(1/2), Adam does not
            return [x - 0.1 * np.sign(g) * np.abs(g) ** 0.5 for x, g in zip(params, grads)], state
    rep = P.invariants(SqrtSign(), "Adam(lr=0.1)", framework="numpy", properties="gradient_scale_invariance",
                       max_examples=3)
    assert [r[0] for r in rep.rows] == ["gradient_scale_invariance"] and rep.exit_code == 1, rep.table()
    empty = P.InvariantsReport("x", "SGD()", 1e-5)
    assert "no property was checked" in empty.table()


def test_optax_lamb_table_row():
    optax = pytest.importorskip("optax")
    rep = P.invariants(optax.lamb, "Covariant(Adam(eps=1e-6), lr=0.01)", {"learning_rate": 0.01}, framework="jax",
                       properties=["parameter_scale_covariance", "orthogonal_equivariance"], max_examples=3)
    assert rep.outcomes() == {"parameter_scale_covariance": "holds", "orthogonal_equivariance": "fails"}, rep.table()
    assert rep.exit_code == 0


def test_adapters_pure_and_layout():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 4, 5))
    t = to_layout(a, "torch")
    assert t.shape == (5, 4, 2, 3) and np.array_equal(from_layout(t, "torch"), a)
    assert to_layout(rng.standard_normal((4, 5)), "torch").shape == (5, 4)
    ad = make_adapter(torch.optim.Adam, {"lr": 0.1})
    x, g = [rng.standard_normal((3, 4))], [rng.standard_normal((3, 4))]
    x_keep, g_keep = x[0].copy(), g[0].copy()
    s0 = ad.init(x)
    x1, s1 = ad.step(s0, x, g)
    x1b, _ = ad.step(s0, x, g)                     # the same state again: the step did not mutate it
    assert np.array_equal(x1[0], x1b[0]) and np.array_equal(x[0], x_keep) and np.array_equal(g[0], g_keep)
    assert set(ad.state_arrays(s1)) == {"exp_avg", "exp_avg_sq"} and not ad.state_arrays(s0)
    with pytest.raises(ValueError, match="layout"):
        make_adapter(torch.optim.Adam, layout="tf")


def test_jax_x64_is_scoped():
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    before = jax.config.jax_enable_x64
    ad = make_adapter(optax.adam, {"learning_rate": 0.1}, framework="jax")
    x, _ = ad.step(ad.init([np.ones(3)]), [np.ones(3)], [np.ones(3)])
    assert x[0].dtype == np.float64 and jax.config.jax_enable_x64 == before


def test_readme_example_runs():
    pytest.importorskip("torch")
    code = re.search(r"## Check your own optimizer.*?```python\n(.*?)```", open(README).read(), re.S).group(1)
    assert len(code.strip().splitlines()) <= 20
    ns = {}
    exec(code, ns)
    assert not ns["result"].agree and ns["result"].best.name == "decoupled decay (lr-coupled)"
    assert ns["report"].exit_code == 0


def test_averaging_identities_seed004_and_negative_control():
    for rule in (refopt.Average(refopt.Adam(lr=0.01)), refopt.ScheduleFreeSGD(lr=0.5, beta=0.9),
                 refopt.ScheduleFreeAdamW(lr=0.05)):
        o = P.averaging_identities(RuleAdapter(rule), max_examples=3)
        assert o.holds and o.err <= 1e-12 and expected(rule)["averaging_identities"] is True

    class OffAverage(RuleAdapter):          # an average that is 0.1 % off must be caught
        def state_arrays(self, state):
            d = super().state_arrays(state)
            return {**d, "mu": [None if a is None else a * 1.001 for a in d["mu"]]}
    o = P.averaging_identities(OffAverage(refopt.Average(refopt.SGD(lr=0.1))), max_examples=3)
    assert o.holds is False and o.err > 1e-4
    assert P.averaging_identities(RuleAdapter(refopt.SGD()), max_examples=2).holds is None


def test_documented_table_torch_sgd():
    """The whole `refopt invariants` table of torch.optim.SGD matches EXPECTED_TABLES (docs/crosscheck.md)."""
    torch = pytest.importorskip("torch")
    from refopt.testing.expected import EXPECTED_TABLES
    row = EXPECTED_TABLES["torch.optim.SGD"]
    rep = P.invariants(torch.optim.SGD, row["rule"], row["kwargs"], max_examples=3,
                       properties=[p for p in row["outcomes"] if p != "gpt_symmetry_equivariance"])
    assert rep.exit_code == 0
    got = rep.outcomes()
    assert {k: got[k] for k in got} == {k: v for k, v in row["outcomes"].items() if k in got}, rep.table()


def test_strategies_draw_what_they_promise():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from refopt.testing import strategies as S

    @settings(max_examples=15, deadline=None, derandomize=True, database=None)
    @given(m=S.matrices(), kind=st.sampled_from(["well", "ill", "rank_deficient"]), data=st.data())
    def check(m, kind, data):
        a = data.draw(S.matrices(kind))
        sv = np.linalg.svd(a, compute_uv=False)
        if kind == "well":
            assert sv.min() >= 0.5 - 1e-12 and sv.max() <= 2 + 1e-12
        elif kind == "rank_deficient" and min(a.shape) > 1:
            assert sv.min() <= 1e-12 * sv.max()
        n = data.draw(st.integers(1, 6))
        q = data.draw(S.orthogonal(n))
        assert np.allclose(q.T @ q, np.eye(n), atol=1e-13)
        c = data.draw(S.positive_scales(1e-2, 1e2, 2.0))
        assert 1e-2 * (1 - 1e-12) <= c <= 1e2 * (1 + 1e-12) and (c >= 2 - 1e-12 or c <= 0.5 + 1e-12)
        tree = data.draw(S.pytrees(matrix=True))
        assert all(x.ndim == 2 and min(x.shape) >= 2 for x in tree)
        rule = data.draw(S.rule_configs())
        assert isinstance(rule, refopt.Rule)
        stream = data.draw(S.gradient_streams([(2, 3)], steps=2))
        assert len(stream) == 2 and stream[0][0].shape == (2, 3) and np.abs(stream[0][0]).min() > 0
    check()


def test_missing_hypothesis_message(monkeypatch):
    import builtins
    import sys

    import refopt.testing as T
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "hypothesis" or name.startswith("hypothesis."):
            raise ImportError("No module named 'hypothesis'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", fake)
    monkeypatch.delitem(sys.modules, "refopt.testing.properties", raising=False)
    with pytest.raises(ImportError, match=r'pip install "refopt\[testing\]"'):
        T.invariants


def test_msign_equivariance_and_its_negative_control():
    """post 003: msign(U G V^T) = U msign(G) V^T (exact SVD and Newton-Schulz alike); an elementwise sign
    is not orthogonally equivariant and is caught."""
    for method in ("svd", "newton_schulz"):
        o = P.msign_equivariance(lambda g, m=method: refopt.msign(g, method=m), max_examples=8)
        assert o.holds and o.err <= 1e-10, (method, o)
    bad = P.msign_equivariance(np.sign, max_examples=8)
    assert bad.holds is False and bad.err > 0.1


def test_table_puts_long_not_applicable_reasons_below_it():
    """A long 'n/a (why)' inline would make the table ~220 characters wide: the cell says n/a [k] and the
    reason follows the table, numbered; short cells stay inline."""
    from refopt.testing.properties import InvariantsReport, Outcome

    why = "a torch implementation receives converted copies (torch steps in place by design)"
    rep = InvariantsReport("Impl", "Adam(lr=0.01)", 1e-5, [
        ("purity", True, Outcome("purity", True, 0.0), Outcome("purity", None, note=why, by_design=True), "n/a"),
        ("gradient_scale_invariance", True, Outcome("g", True, 1e-9), Outcome("g", None, note="short"), "-")])
    t = rep.table()
    assert "n/a [1]" in t and f"[1] {why}" in t and "n/a (short)" in t
    assert max(len(line) for line in t.splitlines()) <= len(f"[1] {why}")

