"""The plug-in cross-check (refopt.crosscheck.plugin): correct torch / optax implementations agree, and
every deliberately wrong one (tests/wrong_impls.py, one convention bug each) is caught with the first
differing step and leaf and diagnosed by name."""
import numpy as np
import pytest

from refopt.crosscheck.plugin import check_impl

torch = pytest.importorskip("torch", reason="peer torch not installed")
import wrong_impls as W  # noqa: E402  (tests/ is on sys.path under pytest)

PROBLEMS = ("stream", "quadratic")
STEPS = 10


def _check(impl, rule, kwargs, framework=None, layout=None, problems=PROBLEMS):
    return check_impl(impl, rule, kwargs, framework, layout, steps=STEPS, problems=problems)


def test_correct_handwritten_torch_adam_and_sgd_agree():
    r = _check(W.MyAdam, "Adam(lr=0.01, weight_decay=0.01)", {"lr": 0.01, "weight_decay": 0.01})
    assert r.agree and r.exit_code == 0, r.report()
    assert all(p.tier == "exact" and p.params_rel <= 1e-12 for p in r.problems)
    assert r.problems[0].state["m"][0] == "exp_avg" and r.problems[0].state["m"][1] <= 1e-12
    r = _check(W.MySGD, "SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)",
               {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3})
    assert r.agree, r.report()


def test_torch_builtins_agree_including_muon_under_the_bf16_policy():
    r = _check(torch.optim.AdamW, "AdamW(lr=0.01, beta2=0.95, weight_decay=0.1)",
               {"lr": 0.01, "betas": (0.9, 0.95), "weight_decay": 0.1})
    assert r.agree, r.report()
    r = _check(torch.optim.Muon, "Muon.like_torch(lr=0.02)", {"lr": 0.02}, problems=("stream",))
    assert r.agree and "bfloat16" in r.problems[0].tier, r.report()


def test_correct_optax_agrees():
    optax = pytest.importorskip("optax")
    r = _check(optax.adamw, "AdamW(lr=0.01, weight_decay=0.1)", {"learning_rate": 0.01, "weight_decay": 0.1}, "jax")
    assert r.agree, r.report()
    r = _check(optax.lamb, "Covariant(Adam(eps=1e-6), lr=0.01)", {"learning_rate": 0.01}, "jax")
    assert r.agree and max(p.params_rel for p in r.problems) <= 1e-12, r.report()


WRONG_TORCH = [
    (W.adam_eps_inside, "Adam(lr=0.01)", {"lr": 0.01}, "eps inside the sqrt"),
    (W.adam_off_by_one, "Adam(lr=0.01)", {"lr": 0.01}, "bias correction off by one"),
    (W.adamw_decay_after, "AdamW(lr=0.01, weight_decay=0.1)", {"lr": 0.01, "weight_decay": 0.1},
     "decay applied after the update"),
    (W.adamw_as_l2, "AdamW(lr=0.01, weight_decay=0.1)", {"lr": 0.01, "weight_decay": 0.1}, "L2 decay"),
    (W.sgd_dampen_first, "SGD(lr=0.05, momentum=0.9, dampening=0.3)", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3},
     "momentum dampening on step 1"),
    (W.sgd_decoupled_decay, "SGD(lr=0.05, momentum=0.9, weight_decay=0.01)",
     {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}, "decoupled decay"),
]


@pytest.mark.parametrize("impl,rule,kwargs,diagnosis", WRONG_TORCH, ids=[w[3] for w in WRONG_TORCH])
def test_wrong_torch_implementation_caught_and_named(impl, rule, kwargs, diagnosis):
    r = _check(impl, rule, kwargs)
    assert not r.agree and r.exit_code == 1
    assert r.best.name == diagnosis and r.best.reproduces, r.report()
    assert r.best.distance <= 1e-12 and r.rule_distance > 1e-6
    text = r.report()
    assert f"DIAGNOSIS: {diagnosis}" in text and "first difference [stream]: step " in text


def test_wrong_torch_muon_layout_is_diagnosed():
    r = _check(torch.optim.Muon, "Muon.like_torch(lr=0.02)", {"lr": 0.02}, layout="refopt", problems=("stream",))
    assert not r.agree and r.best.name == "layout transposed" and r.best.reproduces, r.report()


def _optax_wrong():
    return [
        (W.optax_adam_no_bias, "Adam(lr=0.01)", {"learning_rate": 0.01}, "no bias correction"),
        (W.optax_adam_eps_hat, "Adam(lr=0.01)", {"learning_rate": 0.01}, "eps-hat"),
        (W.optax_adamw_lr_free_decay, "AdamW(lr=0.01, weight_decay=0.1)",
         {"learning_rate": 0.01, "weight_decay": 0.1}, "lr-independent decay"),
        (W.optax_adam_eps_root, "Adam(lr=0.01, eps=1e-8)", {"learning_rate": 0.01, "eps": 1e-8}, "eps inside the sqrt"),
        (W.optax_sgd_nesterov_missing, "SGD(lr=0.05, momentum=0.9, nesterov=True)",
         {"learning_rate": 0.05, "momentum": 0.9}, "no Nesterov"),
        ("optax.adamw", "AdamW(lr=0.01)", {"learning_rate": 0.01}, "optax adamw default decay 1e-4"),
        ("optax.lars", "Covariant(SGD(momentum=0.9), lr=0.01)",
         {"learning_rate": 0.01, "momentum": 0.9, "trust_coefficient": 1.0}, "momentum after the trust ratio"),
    ]


@pytest.mark.parametrize("case", range(7))
def test_wrong_optax_implementation_caught_and_named(case):
    optax = pytest.importorskip("optax")
    impl, rule, kwargs, diagnosis = _optax_wrong()[case]
    if isinstance(impl, str):
        impl = getattr(optax, impl.split(".")[1])
    r = _check(impl, rule, kwargs, "jax")
    assert not r.agree and r.exit_code == 1
    assert r.best.name == diagnosis and r.best.reproduces, r.report()
    assert r.best.distance <= 1e-10 and r.rule_distance > 1e-6


def test_negative_control_the_diagnosis_does_not_claim_an_unknown_bug():
    """An Adam whose lr is off by 1 % matches no convention variant and none comes clearly closer: no variant
    is named as a lead; the evidence names the constant ratio 1.01 of the updates (the lr 0.0101)."""
    r = _check(torch.optim.Adam, "Adam(lr=0.01)", {"lr": 0.0101})
    assert not r.agree and not r.best.reproduces and not r.best.clearly_closer, r.report()
    line = r.diagnosis_line()
    assert "the closest" not in line and "1.01 x refopt's at every step" in line and "an lr of 0.0101" in line, line


def test_float32_and_arguments():
    r = check_impl(torch.optim.Adam, "Adam(lr=0.01)", {"lr": 0.01}, steps=10, dtype="float32", problems=("stream",))
    assert r.agree and r.problems[0].params_rel <= 2e-5, r.report()
    # the float32 run passes within float32 rounding, and says so (it said 'exact'); float64 is exact
    assert r.problems[0].tier == "float32 rounding" and "float32 rounding (2e-05)" in r.report()
    assert "exact" not in r.report().split("tolerance tier", 1)[1]
    r64 = check_impl(torch.optim.Adam, "Adam(lr=0.01)", {"lr": 0.01}, steps=10, problems="stream")
    assert r64.problems[0].tier == "exact" and "exact (1e-12)" in r64.report(), r64.report()
    with pytest.raises(ValueError, match="dtype"):
        check_impl(torch.optim.Adam, "Adam()", dtype="float16")
    with pytest.raises(ValueError, match="steps"):
        check_impl(torch.optim.Adam, "Adam()", steps=0)
    with pytest.raises(ValueError, match="unknown problem"):
        check_impl(torch.optim.Adam, "Adam()", problems=("nope",))
    with pytest.raises(ValueError, match="unknown constructor 'Adom'"):
        check_impl(torch.optim.Adam, "Adom()")


def test_problem_selection_is_checked_before_any_work_and_never_agrees_empty(monkeypatch):
    """problems=() compared nothing and reported agreement for a wrong Adam (all() over nothing); an
    unknown name or a non-str entry is refused listing the known problems; one name as a str is one
    problem (not its characters). Nothing runs before the check (make_adapter would be called first)."""
    import refopt.crosscheck.plugin as plugin

    called = []
    real = plugin.make_adapter
    monkeypatch.setattr(plugin, "make_adapter", lambda *a, **k: called.append(1) or real(*a, **k))
    wrong = W.adam_off_by_one                                  # a wrong Adam: must never agree
    for bad, msg in [((), "problems is empty"), ([], "problems is empty"), (iter(()), "problems is empty"),
                     (["stream", "streem"], r"unknown problem 'streem' in problems; choose from \['stream'"),
                     ([1], "unknown problem 1"), (None, "a name or a sequence of names"), ("", "unknown problem ''")]:
        with pytest.raises(ValueError, match=msg):
            check_impl(wrong, "Adam(lr=0.01)", {"lr": 0.01}, steps=3, problems=bad)
    assert called == []
    one = check_impl(wrong, "Adam(lr=0.01)", {"lr": 0.01}, steps=3, problems="stream")
    assert [p.problem for p in one.problems] == ["stream"] and not one.agree and one.exit_code == 1
    ok = check_impl(torch.optim.Adam, "Adam(lr=0.01)", {"lr": 0.01}, steps=3, problems=["stream", "stream"])
    assert [p.problem for p in ok.problems] == ["stream"] and ok.agree, ok.report()
    # a result with no problem (built by hand) does not agree, and its report does not crash
    empty = plugin.PluginResult("x", "Adam()", "torch", "torch", "float64", 3, [])
    assert not empty.agree and empty.exit_code == 1 and "no problem was compared" in empty.report()


def test_numpy_kind_and_user_errors():
    from refopt.testing.adapters import UserCodeError

    class Plain:
        """a numpy SGD: init/step pair"""
        def init(self, params):
            return None

        def step(self, state, params, grads):
            return [p - 0.1 * g for p, g in zip(params, grads)], state

    r = check_impl(Plain(), "SGD(lr=0.1)", framework="numpy", steps=5, problems=("quadratic",))
    assert r.agree, r.report()

    class Broken(Plain):
        def step(self, state, params, grads):
            raise KeyError("oops")

    with pytest.raises(UserCodeError, match="KeyError: 'oops'"):
        check_impl(Broken(), "SGD(lr=0.1)", framework="numpy", steps=2, problems=("quadratic",))
    x = [np.ones(3)]
    assert np.array_equal(x[0], np.ones(3))


def test_lamb_zero_norm_gap_is_named():
    """optax.lamb on the MLP (zero-initialised biases): optax's trust ratio is 1 at a zero norm, refopt's
    Covariant makes no step -- the documented gap, diagnosed by name."""
    optax = pytest.importorskip("optax")
    r = check_impl(optax.lamb, "Covariant(Adam(eps=1e-6), lr=0.01)", {"learning_rate": 0.01}, "jax", steps=5,
                   problems=("mlp",))
    assert not r.agree and r.best.name == "trust ratio 1 at a zero norm" and r.best.reproduces, r.report()
    assert r.problems[0].first[1].endswith(".b")


def test_known_gap_preset_is_reported_not_run():
    from refopt.crosscheck.presets import KNOWN_GAPS
    from refopt.crosscheck.run import run_preset
    r = run_preset(KNOWN_GAPS[0], "mlp", 3)
    assert r.status == "gap" and "ratio 1" in r.message


def test_a_nan_from_the_implementation_is_named_not_ranked_among_variants():
    """An implementation that returns NaN at step 3 (0/0 on leaf 0): the report names the step, the leaf
    and NaN, and does not rank convention variants by an infinite distance (it said 'params rel inf' and
    'closest variants: momentum 0.9 inf'). Negative control: the same step off by a finite amount gets
    the ordinary first difference and no NaN diagnosis."""
    class NaNAt3:
        def init(self, params):
            return 0

        def step(self, state, params, grads):
            out = [p - 0.1 * g for p, g in zip(params, grads)]
            if state + 1 == 3:
                out[0] = out[0] * np.nan
            return out, state + 1

    r = check_impl(NaNAt3(), "SGD(lr=0.1)", framework="numpy", steps=5, problems=("quadratic",))
    assert not r.agree and r.exit_code == 1
    assert r.problems[0].nonfinite[0] == 3 and r.problems[0].nonfinite[2] == "NaN"
    text = r.report()
    assert "DIAGNOSIS: your implementation returned NaN params at step 3, leaf" in text
    assert "closest variants" not in text and r.diagnosis == []

    class OffAt3(NaNAt3):
        def step(self, state, params, grads):
            out = [p - 0.1 * g for p, g in zip(params, grads)]
            if state + 1 == 3:
                out[0] = out[0] + 1e-3
            return out, state + 1

    r = check_impl(OffAt3(), "SGD(lr=0.1)", framework="numpy", steps=5, problems=("quadratic",))
    assert not r.agree and r.problems[0].nonfinite is None
    assert "returned NaN" not in r.report() and "first difference [quadratic]: step 3" in r.report()


def test_dtype_as_numpy_type_or_name():
    """dtype takes 'float32', np.float32 or np.dtype('float32') alike (not only the name), in
    check_impl and in invariants; anything else is a ValueError naming the choices."""
    from refopt.crosscheck.plugin import dtype_name

    assert {dtype_name(d) for d in ("float32", np.float32, np.dtype("float32"))} == {"float32"}
    assert dtype_name(np.float64) == "float64"
    for bad in ("float16", np.int32, np.float16, None, "f8x"):
        with pytest.raises(ValueError, match="dtype must be float64 or float32"):
            dtype_name(bad)

    class Plain:
        def init(self, params):
            return None

        def step(self, state, params, grads):
            return [p - p.dtype.type(0.1) * g for p, g in zip(params, grads)], state

    a = check_impl(Plain(), "SGD(lr=0.1)", framework="numpy", steps=3, dtype=np.float32, problems="quadratic")
    b = check_impl(Plain(), "SGD(lr=0.1)", framework="numpy", steps=3, dtype="float32", problems="quadratic")
    assert a.agree and a.dtype == b.dtype == "float32" and a.problems[0].params_rel == b.problems[0].params_rel
    with pytest.raises(ValueError, match="dtype must be float64 or float32"):
        check_impl(Plain(), "SGD(lr=0.1)", framework="numpy", steps=3, dtype=np.int64, problems="quadratic")


def test_torch_nadam_keeps_its_scalars_in_the_run_dtype():
    """torch.optim.NAdam keeps mu_product in torch's default dtype: the torch adapter sets it to float64
    while a float64 run builds and steps the optimizer, so NAdam agrees at the exact tier (1e-12) under
    check_impl as under the presets, and the caller's default dtype is left as it was. Negative controls:
    the same NAdam with the default dtype forced to float32 inside its step (a float32 mu_product), and a
    wrong momentum_decay, are caught."""
    rule = "Adam(lr=0.01, nesterov=True, momentum_decay=4e-3)"
    before = torch.get_default_dtype()
    r = check_impl(torch.optim.NAdam, rule, {"lr": 0.01}, steps=50, problems=("stream", "mlp"))
    assert r.agree and all(p.tier == "exact" and p.params_rel <= 1e-12 for p in r.problems), r.report()
    assert torch.get_default_dtype() == before

    class NAdamFloat32Scalars(torch.optim.NAdam):
        def step(self, closure=None):
            old = torch.get_default_dtype()
            torch.set_default_dtype(torch.float32)
            try:
                return super().step(closure)
            finally:
                torch.set_default_dtype(old)

    f32 = check_impl(NAdamFloat32Scalars, rule, {"lr": 0.01}, steps=50, problems=("stream", "mlp"), diagnose=False)
    assert not f32.agree and all(1e-12 < p.params_rel < 1e-6 for p in f32.problems), f32.report()
    wrong = check_impl(torch.optim.NAdam, rule, {"lr": 0.01, "momentum_decay": 5e-3}, steps=50,
                       problems=("stream",), diagnose=False)
    assert not wrong.agree and wrong.problems[0].params_rel > 1e-6, wrong.report()


def test_like_pairs_the_state_as_the_peer_names_it():
    """optax.rmsprop keeps its momentum as the trace of the lr-scaled step (-lr b): with the rule written as
    like("optax.rmsprop", ...) the state is paired by the mapping (v ~ nu; b compared through the params), so
    the peer itself agrees; negative control: the peer with another momentum differs on the params."""
    optax = pytest.importorskip("optax")
    kw = {"learning_rate": 0.01, "decay": 0.95, "eps": 1e-4, "momentum": 0.5, "bias_correction": True}
    rule = 'like("optax.rmsprop", learning_rate=0.01, decay=0.95, eps=1e-4, momentum=0.5, bias_correction=True)'
    r = _check(optax.rmsprop, rule, kw, "jax", problems=("stream", "mlp"))
    assert r.agree, r.report()
    assert all(p.state["v"][0].endswith("nu") and p.state["b"][0] is None for p in r.problems)
    bad = check_impl(optax.rmsprop, rule, {**kw, "momentum": 0.6}, "jax", steps=STEPS, problems=("stream",),
                     diagnose=False)
    assert not bad.agree and bad.problems[0].params_rel > 1e-3
