"""The public API and the testing toolkit on bad or unusual input, each case with a negative control:
option values equal to True by value only, masked arrays, a non-dict ``info``, a diverging Newton-Schulz
schedule in Muon, and Muon's CUDA backend without a GPU give a clear error before anything is written,
never a silent answer; the crosscheck harness judges unusual implementations (stepping in place, driven by
an LR scheduler, returning another dtype) on their numbers or refuses them with a reason."""
import importlib.util

import numpy as np
import pytest

import refopt
from refopt import tree as T


def _nothing_written(rule, x, g, match, exc, **kw):
    s = refopt.init(rule, x)
    xs, ss = T.copy(x), T.copy(s)
    with pytest.raises(exc, match=match):
        refopt.update_(rule, s, x, g, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(T.leaves(x), T.leaves(xs)))
    assert all(np.array_equal(a, b) for a, b in zip(T.leaves(s), T.leaves(ss)) if isinstance(a, np.ndarray))


@pytest.mark.parametrize("value", [1, 1.0, 1 + 0j, 0, [True], "True", np.True_])
def test_a_bool_or_string_option_takes_only_its_own_kind(value):
    with pytest.raises(ValueError, match="amsgrad must be one of"):
        refopt.Adam(amsgrad=value)


def test_negative_control_the_options_themselves_are_accepted():
    assert refopt.Adam(amsgrad=True).amsgrad is True
    with pytest.raises(ValueError, match="nesterov must be True or False"):   # the same policy as boolean()
        refopt.Adam(nesterov=np.True_)
    assert refopt.Adam(amsgrad="bias_corrected").amsgrad == "bias_corrected"
    assert refopt.AdamW(wd_mode="independent", weight_decay=0.1).wd_mode == "independent"
    with pytest.raises(ValueError, match="msign must be one of"):
        refopt.Muon(msign=["svd"])


def test_masked_array_leaves_are_refused_with_their_path():
    x = {"a": np.ones(3), "b": np.ma.array(np.ones(4), mask=[0, 1, 0, 0])}
    with pytest.raises(TypeError, match="leaf b is a numpy masked array"):
        refopt.init(refopt.SGD(lr=0.1), x)
    s = refopt.init(refopt.SGD(lr=0.1), {"a": np.ones(3), "b": np.ones(4)})
    g = {"a": np.ones(3), "b": np.ma.array(np.ones(4), mask=[0, 1, 0, 0])}
    with pytest.raises(TypeError, match="grads leaf b is a numpy masked array"):
        refopt.update(refopt.SGD(lr=0.1), s, {"a": np.ones(3), "b": np.ones(4)}, g)
    # negative control: a plain ndarray subclass is still an array
    class Sub(np.ndarray):
        pass
    y = {"a": np.ones(3).view(Sub)}
    refopt.update(refopt.SGD(lr=0.1), refopt.init(refopt.SGD(lr=0.1), y), y, {"a": np.ones(3)})


def test_info_must_be_a_dict_and_is_checked_before_anything_is_written():
    x, g = {"w": np.ones(4)}, {"w": np.full(4, 0.5)}
    _nothing_written(refopt.Adam(lr=0.1), x, g, "info must be None or a dict", TypeError, info=[])
    info = {}
    refopt.update_(refopt.Adam(lr=0.1), refopt.init(refopt.Adam(lr=0.1), x), x, g, info=info)
    assert info["t"] == 1


def test_muon_refuses_a_diverging_newton_schulz_schedule_at_construction():
    with pytest.raises(ValueError, match=r"diverges: singular values in \(0, 1\] reach .* at step 2"):
        refopt.Muon(ns_coeffs=(1e3, 1e3, 1e3))
    with pytest.raises(ValueError, match="at step 4"):   # x -> 3x: 27 after 3 steps, then 2.7e6
        refopt.Muon(ns_coeffs=[(3.0, 0.0, 0.0)] * 3 + [(1e5, 0.0, 0.0)], ns_steps=4)
    # negative control: every preset, and a schedule that grows but stays far below the limit
    for name in ("jordan", "classic", "you", "polar_express"):
        refopt.Muon(ns_coeffs=name, ns_steps=8)
    refopt.Muon(ns_coeffs=(3.0, 0.0, 0.0), ns_steps=5)  # 3^5 = 243


def test_muon_cuda_backend_without_a_gpu_fails_before_writing():
    if importlib.util.find_spec("numba_cuda") is not None:
        from numba import cuda
        if cuda.is_available():
            pytest.skip("a GPU (or the simulator) is available: nothing to refuse")
    x = {"a": np.ones((3, 4)), "b": np.ones((4, 5))}
    g = {"a": np.full((3, 4), 0.1), "b": np.full((4, 5), 0.2)}
    _nothing_written(refopt.Muon(lr=0.02, msign_backend="cuda"), x, g, "numba-cuda|CUDA GPU",
                     (ImportError, RuntimeError))


def test_adam_l2_weight_decay_whose_square_would_overflow_is_refused_before_writing():
    """L2 adds weight_decay*x to g before it is squared: |g| passes the walk's check (1), but with
    x = 3e18 and weight_decay = 10 in float32 the augmented gradient's square is inf, and v = inf would
    freeze the parameter for good. Refused, naming the leaf, nothing written; negative controls: AdamW
    (decoupled, never squares x) and a weight decay that keeps lambda*|x| in range step normally."""
    x = {"a": np.ones(3, np.float32), "w": np.full(3, 3e18, np.float32)}
    g = {"a": np.ones(3, np.float32), "w": np.ones(3, np.float32)}
    _nothing_written(refopt.Adam(lr=1e-3, weight_decay=10.0), x, g, r"weight_decay \* \|x\| at w reaches 3e\+19",
                     FloatingPointError)
    for rule in (refopt.AdamW(lr=1e-3, weight_decay=10.0), refopt.Adam(lr=1e-3, weight_decay=1.0)):
        p, s = refopt.update_(rule, refopt.init(rule, T.copy(x)), T.copy(x), g)
        assert all(np.isfinite(a).all() for a in T.leaves(s.leaves) if isinstance(a, np.ndarray))


@pytest.mark.parametrize("wrapper", [lambda b: refopt.Hyperball(b, lr=0.1), lambda b: refopt.Covariant(b, lr=0.1)])
def test_a_finite_direction_whose_norm_overflows_is_normalised(wrapper):
    """|g| = 1.5e308 in float64: SGD's direction u = g is finite, but ||u||_F overflows float64. The step
    only needs u/||u|| = (u/max|u|)/||u/max|u|||: the wrappers take it so (before, they raised after
    writing earlier leaves, saying u held nan or inf). Oracle: the same step with g scaled down by 1e300
    (both rules are invariant to the scale of u), bit for bit up to the rounding of that scaling."""
    x = {"a": np.array([[1.0, 2.0], [3.0, 4.0]]), "b": np.array([[0.5, -1.0], [2.0, 1.0]])}
    g = {"a": np.array([[0.1, 0.2], [0.3, -0.1]]), "b": np.array([[1.5e308, -1e308], [0.5e308, 1e308]])}
    small = {"a": g["a"], "b": g["b"] * 1e-300}
    rule = wrapper(refopt.SGD(lr=1.0))
    got, _ = refopt.update(rule, refopt.init(rule, x), x, g)
    want, _ = refopt.update(rule, refopt.init(rule, x), x, small)
    for k in x:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-14, atol=0)
        assert np.isfinite(got[k]).all()
    # negative control: a direction that really holds inf is still refused, naming the leaf
    bad = {"a": g["a"], "b": np.array([[np.inf, 0.0], [0.0, 0.0]])}
    with pytest.raises(FloatingPointError, match="at b"):
        refopt.update(rule, refopt.init(rule, x), x, bad)


class _PureSign:
    def init(self, params):
        return {"t": 0, "b": [np.zeros_like(p) for p in params]}

    def step(self, state, params, grads):
        b = [0.5 * b + g for b, g in zip(state["b"], grads)]
        return [p - 0.01 * np.sign(v) for p, v in zip(params, b)], {"t": state["t"] + 1, "b": b}


class _InPlaceParams(_PureSign):
    def step(self, state, params, grads):
        for p, g in zip(params, grads):
            p -= 0.1 * g
        return params, state


class _InPlaceState(_PureSign):
    def step(self, state, params, grads):
        for b, g in zip(state["b"], grads):
            b *= 0.5
            b += g
        return [p - 0.01 * np.sign(v) for p, v in zip(params, state["b"])], state


class _WritesGrads(_PureSign):
    def step(self, state, params, grads):
        out = super().step(state, params, grads)
        grads[0][...] = 0
        return out


def test_purity_catches_a_numpy_step_that_writes_its_params_or_its_state():
    """The numpy adapter hands the implementation the arrays themselves (on copies no write could be seen),
    and purity compares the state too; a failure names what the step wrote into. Negative control: the pure variant holds; torch implementations (in place by design) are
    n/a."""
    pytest.importorskip("hypothesis")
    from refopt.testing import properties as P
    from refopt.testing.adapters import make_adapter

    out = {k: P.purity(make_adapter(impl, framework="numpy"), max_examples=3)
           for k, impl in (("pure", _PureSign()), ("params", _InPlaceParams()), ("state", _InPlaceState()),
                           ("grads", _WritesGrads()))}
    assert {k: o.holds for k, o in out.items()} == {"pure": True, "params": False, "state": False, "grads": False}
    assert out["pure"].note == "" and out["params"].note.startswith("the step wrote into params [0]")
    assert "grads" not in out["params"].note and out["grads"].note == "the step wrote into grads [0]"
    assert out["state"].note == "the step wrote into the state it was given"
    assert "FAILS (err inf; the step wrote into params [0]" in out["params"].describe()
    torch = pytest.importorskip("torch")
    assert P.purity(make_adapter(torch.optim.SGD, {"lr": 0.1})).holds is None


class _NormSGD:
    """x - lr g/||g||: orthogonally equivariant exactly (a numpy implementation)."""

    def init(self, params):
        return {}

    def step(self, state, params, grads):
        return [p - 0.1 * g / np.linalg.norm(g) for p, g in zip(params, grads)], state


def test_property_functions_scale_their_default_tolerance_to_float32():
    """rtol=None: 1e-6 in float64, 1e-3 in float32 (a correct float32 rule's rounding reaches 1.2e-6,
    above a fixed 1e-6). Negative control: an explicit rtol=1e-9 in float32 still fails it, and a
    coordinatewise (not equivariant) variant fails at the float32 default."""
    pytest.importorskip("hypothesis")
    from refopt.testing import properties as P
    from refopt.testing.adapters import make_adapter

    ad = make_adapter(_NormSGD(), framework="numpy")
    assert P.orthogonal_equivariance(ad, dtype=np.float32, max_examples=5).holds is True
    assert P.orthogonal_equivariance(ad, dtype=np.float64, max_examples=5).holds is True
    assert P.orthogonal_equivariance(ad, dtype=np.float32, rtol=1e-9, max_examples=5).holds is False
    sign = make_adapter(type("SignSGD", (), {"init": lambda self, p: {},
                                             "step": lambda self, s, p, g: ([a - 0.1 * np.sign(b) for a, b in
                                                                            zip(p, g)], s)})(), framework="numpy")
    assert P.orthogonal_equivariance(sign, dtype=np.float32, max_examples=5).holds is False


def test_the_documented_partition_expression_parses_and_inits():
    """The example of refopt.crosscheck.expr's label_functions docstring runs as written."""
    import warnings

    from refopt.crosscheck import expr

    doc = expr.label_functions.__doc__
    example = doc[doc.index("``Partition(") + 2:doc.index(")``", doc.index("``Partition(")) + 1]
    rule = expr.parse_rule(example)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # both labels are used: no 'unused rule' warning
        refopt.init(rule, {"w": np.ones((3, 2)), "b": np.ones(2)})


class _Upcast:
    def init(self, params):
        return {}

    def step(self, state, params, grads):
        return [p.astype(np.float64) - 0.1 * g for p, g in zip(params, grads)], state


def test_an_implementation_returning_another_dtype_is_named_as_its_result():
    """float32 params stepped into float64 is the implementation's bug, reported as such (UserCodeError,
    exit 3 in the CLI) naming the leaf, not a usage error blaming the inputs. Negative control: the same
    step keeping float32 passes."""
    from refopt.testing.adapters import UserCodeError, make_adapter

    ad = make_adapter(_Upcast(), framework="numpy")
    x = [np.ones(3, np.float32), np.ones((2, 2), np.float32)]
    g = [np.full(3, 0.5, np.float32), np.full((2, 2), 0.5, np.float32)]
    with pytest.raises(UserCodeError, match=r"returned float64 \(3,\) params for float32 \(3,\) inputs at leaf \[0\]"):
        ad.step(ad.init(x), x, g)
    keep = make_adapter(type("Keep", (_Upcast,), {"step": lambda self, s, p, g: ([a - 0.1 * b for a, b in zip(p, g)],
                                                                                  s)})(), framework="numpy")
    new, _ = keep.step(keep.init(x), x, g)
    assert [a.dtype for a in new] == [np.float32, np.float32]


def test_compare_summary_takes_the_time_per_step_from_the_timing_rounds():
    """summary.csv's ms_per_step (and its min / max) is the median of the timing rounds measured apart from the
    run (compare.time_steps), never the run's own wall time, whose first step compiles the kernels;
    first_step_s reports that first step. Negative control: the whole run's average would be ten times
    larger than the rounds' median here."""
    from refopt.cli.compare import summary_row

    rows = [{"step": k + 1, "loss": 1.0, "_seconds": 1.0 + 0.01 * k} for k in range(100)]   # 1 s, then 10 ms
    timing = {"median": 10.0, "min": 9.5, "max": 12.0}
    row = summary_row("sgd", {"rows": rows, "lr": 0.1, "final": {"val_loss": 0.5}, "seconds": rows[-1]["_seconds"],
                              "timing": timing})
    assert row["first_step_s"] == 1.0
    assert (row["ms_per_step"], row["ms_per_step_min"], row["ms_per_step_max"]) == (10.0, 9.5, 12.0)
    assert row["val_loss"] == 0.5 and row["steps"] == 100
    assert abs(1000 * row["seconds"] / len(rows) - row["ms_per_step"]) > 5                 # the whole-run average


def test_rule_expressions_offer_only_path_array_label_functions():
    """mlp_labels(params) builds a labels tree from the whole params: offered bare in a --rule expression it
    cannot work (init would fail on it). Only (path, array) functions are names there; an
    expression naming mlp_labels is a clear ValueError at parse time. Negative control: matrix_labels,
    at_least_2d_labels and gpt_labels still parse."""
    from refopt.crosscheck import expr

    assert set(expr.label_functions()) == {"matrix_labels", "at_least_2d_labels", "gpt_labels"}
    with pytest.raises(ValueError, match="mlp_labels"):
        expr.parse_rule('Partition(rules={"hidden": AdamW(), "other": AdamW()}, labels=mlp_labels)')
    for name in ("matrix_labels", "at_least_2d_labels", "gpt_labels"):
        expr.parse_rule(f'Partition(rules={{"hidden": Muon(), "other": AdamW()}}, labels={name})')


def _user_torch_muon(lr_factor):
    """A user's torch Muon with torch.optim.Muon's conventions (EMA momentum, Nesterov lerp, decoupled decay
    with the unadjusted lr, sqrt(max(1, A/B)) scale) but Newton-Schulz in the params' dtype."""
    import math

    import torch

    def ns(G, a=3.4445, b=-4.7750, c=2.0315):
        X = G / G.norm().clamp(min=1e-7)
        tall = G.size(0) > G.size(1)
        X = X.T if tall else X
        for _ in range(5):
            A = X @ X.T
            X = a * X + (b * A + c * A @ A) @ X
        return X.T if tall else X

    class UserMuon(torch.optim.Optimizer):
        def __init__(self, params, lr=0.02, momentum=0.95, weight_decay=0.1):
            super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

        @torch.no_grad()
        def step(self, closure=None):
            for gr in self.param_groups:
                for p in gr["params"]:
                    buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                    buf.lerp_(p.grad, 1 - gr["momentum"])
                    o = ns(p.grad.lerp(buf, gr["momentum"]))
                    p.mul_(1 - gr["lr"] * gr["weight_decay"])
                    p.add_(o, alpha=-gr["lr"] * lr_factor * math.sqrt(max(1, p.shape[0] / p.shape[1])))
    return UserMuon


def test_a_users_torch_muon_gets_no_bfloat16_tolerance():
    """The 6 % update tolerance exists for torch.optim.Muon's bfloat16 Newton-Schulz; a user's own torch Muon
    computing in float64 is judged as any implementation, so a 2.5 % lr error is a DIFFER (it passed before
    under the bfloat16 tier). Negative control: the correct user Muon agrees, and torch.optim.Muon keeps its
    tier."""
    torch = pytest.importorskip("torch")
    from refopt.crosscheck.plugin import bf16_newton_schulz, check_impl
    from refopt.testing.adapters import make_adapter

    kw = dict(rule="Muon.like_torch(lr=0.02)", kwargs={"lr": 0.02}, steps=10, problems=("stream", "quadratic"))
    assert check_impl(_user_torch_muon(1.0), **kw).agree
    off = check_impl(_user_torch_muon(1.025), **kw)
    assert not off.agree and off.exit_code == 1
    assert not bf16_newton_schulz(make_adapter(_user_torch_muon(1.0), {"lr": 0.02}))
    if hasattr(torch.optim, "Muon"):
        assert bf16_newton_schulz(make_adapter(torch.optim.Muon, {"lr": 0.02}))


def _scheduled(base, f):
    """``base`` (a torch optimizer class) with a LambdaLR of ``f`` stepped in its own step(): the torch way
    (LambdaLR's epoch e = 0 at the first step)."""
    import torch

    class Scheduled(base):
        def __init__(self, params, **kw):
            super().__init__(params, **kw)
            self.sched = torch.optim.lr_scheduler.LambdaLR(self, f)

        def step(self, closure=None):
            out = super().step(closure)
            self.sched.step()
            return out
    return Scheduled


def test_a_torch_optimizer_driven_by_an_lr_scheduler_steps_through_the_adapter():
    """A torch LR scheduler replaces optimizer.step by a wrapper bound to the original optimizer; a per-step
    clone calling that wrapper would step the original, so the clone would never move and every property
    would 'hold'. With a constant LambdaLR the implementation is plain AdamW: it must agree with AdamW
    exactly; with a cosine LambdaLR it must agree with the rule's schedule. Negative control: the schedule
    counted one step off is a DIFFER."""
    torch = pytest.importorskip("torch")
    import math

    from refopt.crosscheck.plugin import check_impl

    def scheduled(f):
        return _scheduled(torch.optim.AdamW, f)

    kw = dict(kwargs={"lr": 0.01}, steps=6, problems=("stream",))
    assert check_impl(scheduled(lambda e: 1.0), rule="AdamW(lr=0.01)", **kw).agree
    cos = lambda t: 0.5 * (1 + math.cos(math.pi * min(t, 10) / 10))      # noqa: E731 (gamma of step t + 1)
    rule = refopt.AdamW(lr=0.01, schedule=lambda t: 0.5 * (1 + math.cos(math.pi * min(t - 1, 10) / 10)))
    assert check_impl(scheduled(cos), rule=rule, **kw).agree
    assert not check_impl(scheduled(lambda e: cos(e + 1)), rule=rule, **kw).agree


class _AdamNoOneMinusBeta1:
    """A numpy Adam whose first moment lacks the (1 - beta1) factor (m 10x too large); state {'m', 'v'}."""

    def init(self, params):
        return {"t": 0, "m": [np.zeros_like(p) for p in params], "v": [np.zeros_like(p) for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        m = [0.9 * m + g for m, g in zip(state["m"], grads)]
        v = [0.999 * v + 0.001 * g * g for v, g in zip(state["v"], grads)]
        new = [p - 0.01 * (a / (1 - 0.9 ** t)) / (np.sqrt(b / (1 - 0.999 ** t)) + 1e-8)
               for p, a, b in zip(params, m, v)]
        return new, {"t": t, "m": m, "v": v}


def test_the_state_report_pairs_fields_by_name_first():
    """refopt's m is compared with the implementation's m (10x off), not paired by value with its v (which
    happened to be closer); v against v agrees. Negative control: the names of torch and optax map too."""
    from refopt.crosscheck.plugin import _named, check_impl

    res = check_impl(_AdamNoOneMinusBeta1(), rule="Adam(lr=0.01)", framework="numpy", steps=5, problems=("stream",))
    state = res.problems[0].state
    assert state["m"][0].startswith("m") and state["m"][1] > 1.0
    assert state["v"][0].startswith("v") and state["v"][1] < 1e-12
    assert _named("m", "exp_avg") and _named("v", "[0].nu") and not _named("m", "exp_avg_sq")


def test_loading_a_checkpoint_with_another_rule_warns(tmp_path):
    """An Adam checkpoint continued as AdamW (the state fits both) or with another lr is loaded, with a
    RefoptWarning naming both rules; negative control: the same rule, or no rule, loads silently."""
    import warnings

    p = {"w": np.ones(3)}
    rule = refopt.Adam(lr=0.1)
    path = str(tmp_path / "ck.npz")
    refopt.save(path, p, refopt.init(rule, p), rule)
    for other in (refopt.AdamW(lr=0.1), refopt.Adam(lr=0.2)):
        with pytest.warns(refopt.RefoptWarning, match=rf"given to load \({type(other).__name__}\) differs .*\(Adam"):
            ck = refopt.load(path, rule=other)
        assert ck.rule is other
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refopt.load(path, rule=refopt.Adam(lr=0.1))
        refopt.load(path)


def test_the_tables_of_frozen_rules_cannot_be_changed_under_a_state():
    """Partition.rules and LRTable.lrs are tables inside frozen rules: a change after init would skip the
    rule's validation and fail in numba after writes, so they refuse changes; copies (deepcopy, pickle, a
    checkpoint) keep the table, and dataclasses.replace builds a new rule."""
    import copy
    import dataclasses
    import pickle

    part = refopt.Partition({"hidden": refopt.AdamW(lr=1e-2), "other": refopt.Lion(lr=1e-2)},
                            labels=refopt.matrix_labels)
    with pytest.raises(TypeError, match="frozen rule"):
        part.rules["other"] = refopt.SGD(lr=0.1)
    with pytest.raises(TypeError, match="frozen rule"):
        part.rules.update(other=refopt.SGD(lr=0.1))
    for c in (copy.deepcopy(part), pickle.loads(pickle.dumps(part))):
        assert c == part and dict(c.rules) == dict(part.rules)
    new = dataclasses.replace(part, rules={**part.rules, "other": refopt.SGD(lr=0.1)})
    assert type(new.rules["other"]).__name__ == "SGD" and type(part.rules["other"]).__name__ == "Lion"
    table = refopt.LRTable(refopt.SGD(lr=1.0), lrs={"w": (0.1, 0.2)})
    with pytest.raises(TypeError, match="frozen rule"):
        table.lrs["w"] = (-1.0,)
    # negative control: the rules still step, save and load
    p = {"w": np.ones((3, 2)), "b": np.ones(2)}
    s = refopt.init(part, p)
    p, s = refopt.update(part, s, p, {"w": np.full((3, 2), 0.5), "b": np.full(2, 0.5)})
    assert s.t == 1


def test_diagnosis_names_no_decay_on_vectors_and_a_schedule_counted_from_zero():
    """Two conventions docs/divergences.md describes, named by the diagnosis: weight decay only on
    matrices (a parameter group without decay for biases and gains), and the schedule read one step early.
    Negative control: the correct implementations agree (no diagnosis needed)."""
    torch = pytest.importorskip("torch")
    import math

    from refopt.crosscheck.plugin import check_impl

    def groups(params, lr=0.01, weight_decay=0.1):
        ps = list(params)
        return torch.optim.AdamW([{"params": [p for p in ps if p.ndim >= 2]},
                                  {"params": [p for p in ps if p.ndim < 2], "weight_decay": 0.0}],
                                 lr=lr, weight_decay=weight_decay)

    kw = dict(kwargs={"lr": 0.01, "weight_decay": 0.1}, steps=6, problems=("stream",))
    res = check_impl(groups, rule="AdamW(lr=0.01, weight_decay=0.1)", **kw)
    assert not res.agree and res.diagnosis[0].name == "no weight decay on vectors" and res.diagnosis[0].reproduces

    def cosine(t):
        return 0.5 * (1 + math.cos(math.pi * min(t, 8) / 8))

    def scheduled(shift):
        return _scheduled(torch.optim.Adam, lambda e: cosine(e + shift))

    rule = refopt.Adam(lr=0.01, schedule=lambda t: cosine(t))
    kw = dict(kwargs={"lr": 0.01}, steps=6, problems=("stream",))
    late = check_impl(scheduled(0), rule=rule, **kw)
    assert not late.agree and late.diagnosis[0].name == "schedule counted from 0" and late.diagnosis[0].reproduces
    assert check_impl(scheduled(1), rule=rule, **kw).agree


def test_diagnosis_names_no_closest_variant_farther_than_the_rule():
    """An AdamW with its lr 0.1 % off: no variant explains it, and naming a 'closest' variant that is
    farther from the numbers than the rule itself would mislead; the report says to look for a plain
    error. Negative control: a variant closer than the rule is still named as the closest."""
    torch = pytest.importorskip("torch")
    from refopt.crosscheck.plugin import check_impl

    def off(params, lr=0.01, weight_decay=0.01):
        return torch.optim.AdamW(params, lr=lr * 1.001, weight_decay=weight_decay)

    res = check_impl(off, rule="AdamW(lr=0.01, weight_decay=0.01)", kwargs={"lr": 0.01, "weight_decay": 0.01},
                     steps=6, problems=("stream",))
    line = res.diagnosis_line()
    assert not res.agree and "the closest" not in line and "1.001 x refopt's at every step" in line, line
    near = check_impl(torch.optim.AdamW, rule="Adam(lr=0.01, weight_decay=0.01)",
                      kwargs={"lr": 0.01, "weight_decay": 0.01}, steps=6, problems=("stream",))
    assert "reproduces your numbers (" in near.report() or "the closest" in near.report()


class _InPlaceMomentumSGD:
    """A correct momentum SGD that steps its arrays in place (the common hand-written numpy optimizer)."""

    def init(self, params):
        return {"buf": [np.zeros_like(p) for p in params]}

    def step(self, state, params, grads):
        for p, g, b in zip(params, grads, state["buf"]):
            b *= 0.9
            b += g
            p -= 0.1 * b
        return params, state


def test_an_in_place_numpy_optimizer_is_judged_on_its_numbers():
    """The harness records a copy of what each step returns: an implementation stepping in place agrees (recording
    the returned arrays themselves would alias every step to the final params: a DIFFER with a made-up
    diagnosis), while purity catches the in-place writes."""
    pytest.importorskip("hypothesis")
    from refopt.crosscheck.plugin import check_impl
    from refopt.testing import properties as P
    from refopt.testing.adapters import make_adapter

    res = check_impl(_InPlaceMomentumSGD(), "SGD(lr=0.1, momentum=0.9)", framework="numpy", steps=5,
                     problems=("stream", "quadratic"))
    assert res.agree, res.report()
    assert P.purity(make_adapter(_InPlaceMomentumSGD(), framework="numpy"), max_examples=2).holds is False
    assert P.determinism(make_adapter(_InPlaceMomentumSGD(), framework="numpy"), max_examples=2).holds is True


def test_the_bfloat16_tier_follows_the_built_optimizer_not_the_factory():
    """A partial or a factory returning torch.optim.Muon is torch.optim.Muon (bfloat16 Newton-Schulz): it
    keeps the tier; a user's Optimizer does not."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch without torch.optim.Muon")
    import functools

    from refopt.crosscheck.plugin import bf16_newton_schulz
    from refopt.testing.adapters import make_adapter

    def factory(params, **kw):
        return torch.optim.Muon(params, **kw)
    for impl in (torch.optim.Muon, functools.partial(torch.optim.Muon), factory):
        assert bf16_newton_schulz(make_adapter(impl, {"lr": 0.02}))
    assert not bf16_newton_schulz(make_adapter(_user_torch_muon(1.0), {"lr": 0.02}))
    assert not bf16_newton_schulz(make_adapter(torch.optim.AdamW, {"lr": 0.02}))


def test_covariant_with_a_user_norm_rescales_an_overflowing_direction():
    """norm=np.linalg.norm overflows float32 for |u| ~ 1e20 (finite): the ratio is taken on u/max|u| as for
    the named norms: a finite step, with no error raised after earlier leaves are written."""
    rng = np.random.default_rng(0)
    rule = refopt.Covariant(refopt.SGD(lr=0.1), norm=np.linalg.norm)
    p = {"a": rng.standard_normal((4, 3)).astype(np.float32), "z": rng.standard_normal((4, 3)).astype(np.float32)}
    g = {"a": np.ones((4, 3), np.float32), "z": (rng.standard_normal((4, 3)) * 1e20).astype(np.float32)}
    small = {"a": g["a"], "z": g["z"] * np.float32(1e-20)}
    got, _ = refopt.update(rule, refopt.init(rule, p), p, g)
    want, _ = refopt.update(rule, refopt.init(rule, p), p, small)
    for k in p:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=0)


def test_loading_with_an_equal_rule_of_numpy_scalars_does_not_warn(tmp_path):
    import warnings

    p = {"w": np.ones((4, 3))}
    path = str(tmp_path / "ck.npz")
    refopt.save(path, p, refopt.init(refopt.Adam(lr=1e-3), p), refopt.Adam(lr=1e-3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refopt.load(path, rule=refopt.Adam(lr=np.float64(1e-3)))
    with pytest.warns(refopt.RefoptWarning):
        refopt.load(path, rule=refopt.Adam(lr=np.float64(2e-3)))


def test_a_schedule_table_covering_only_the_run_does_not_break_the_diagnosis():
    """The schedule-shift variants read the table one step past its end: they cannot run, the report is made
    (no IndexError) and says so; --debug (``report(debug=True)``) names each with its error."""
    torch = pytest.importorskip("torch")
    from refopt.crosscheck.plugin import check_impl

    table = [1.0, 0.8, 0.6, 0.4]
    rule = refopt.Adam(lr=0.01, schedule=lambda t: table[t - 1])
    res = check_impl(torch.optim.Adam, rule=rule, kwargs={"lr": 0.01}, steps=4, problems=("stream",))
    assert not res.agree and "DIAGNOSIS" in res.report()
    assert [n for n, _, _ in res.not_run] == ["schedule one step ahead", "step counter one ahead"], res.not_run
    assert "2 variant(s) could not run (--debug lists them)" in res.report()
    assert "schedule one step ahead [stream]: IndexError: list index out of range" in res.report(debug=True)


def test_an_optimizer_the_adapter_cannot_replay_is_refused_not_judged():
    """Two ways a torch optimizer holds itself so that refopt's per-step copy would step the original: an LR
    scheduler stepped from a step post-hook (the copy's lr never moves: a cosine schedule agrees with a constant
    rule), and opt.step replaced by a closure over the original's step (the copy never moves). Both are the
    implementation's error (UserCodeError, exit 3) with a way out; negative control: the same schedule
    stepped in a subclass's step() agrees with the cosine rule."""
    torch = pytest.importorskip("torch")
    import math

    from refopt.crosscheck.plugin import check_impl
    from refopt.testing.adapters import UserCodeError

    cos = lambda e: 0.5 * (1 + math.cos(math.pi * min(e, 10) / 10))   # noqa: E731
    rule = refopt.AdamW(lr=0.01, schedule=lambda t: cos(t - 1))
    kw = dict(kwargs={"lr": 0.01}, steps=6, problems=("stream",))

    def hooked(params, **k):
        opt = torch.optim.AdamW(params, **k)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, cos)
        opt.register_step_post_hook(lambda o, a, kk: sched.step())
        return opt

    def closure(params, **k):
        opt = torch.optim.AdamW(params, **k)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0)
        orig = opt.step

        def step(c=None):
            out = orig(c)
            sched.step()
            return out
        opt.step = step
        return opt

    import warnings

    with warnings.catch_warnings():   # torch's own warnings about the order of scheduler and optimizer steps
        warnings.simplefilter("ignore")
        with pytest.raises(UserCodeError, match="changed the learning rate of the original"):
            check_impl(hooked, rule=rule, **kw)
        with pytest.raises(UserCodeError, match="closure over the optimizer object itself"):
            check_impl(closure, rule="AdamW(lr=0.01)", **kw)

    assert check_impl(_scheduled(torch.optim.AdamW, cos), rule=rule, **kw).agree
