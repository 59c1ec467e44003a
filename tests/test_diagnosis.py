"""The diagnosis of `refopt crosscheck --impl`: generated variants, the evidence, the ranking and the naming.

Every mechanism has an implementation (plain numpy, written from the rules' equations here, not from refopt's
code) it must name and a negative control: the correct implementation agrees, or a bug of another kind is not
claimed. 10 steps, the stream and quadratic problems, float64."""
import math

import numpy as np
import pytest

import refopt
from refopt.crosscheck.plugin import check_impl
from refopt.schedules import warmup_cosine

PROBLEMS = ("stream", "quadratic")


def _check(impl, rule, problems=PROBLEMS, steps=10):
    return check_impl(impl, rule, framework="numpy", steps=steps, problems=problems)


class Adam:
    """Adam (Kingma & Ba; torch's eps placement), with one switch per planted bug."""

    def __init__(self, lr=0.01, b1=0.8, b2=0.95, eps=1e-8, wd=0.0, bug=None, schedule=None, nesterov=False):
        self.lr, self.b1, self.b2, self.eps, self.wd, self.bug, self.schedule = lr, b1, b2, eps, wd, bug, schedule
        self.nesterov = nesterov          # optax.nadam's look-ahead b1 m/(1 - b1^(t+1)) + (1 - b1) g/(1 - b1^t)

    def init(self, params):
        return {"t": 0, "exp_avg": [np.zeros_like(x) for x in params], "exp_avg_sq": [np.zeros_like(x) for x in params]}

    def step(self, s, params, grads):
        t = s["t"] + 1
        b1, b2 = (self.b2, self.b1) if self.bug == "betas swapped" else (self.b1, self.b2)
        lr = self.lr * (1.0 if self.schedule is None else self.schedule(t))
        out, ms, vs = [], [], []
        for x, g, m, v in zip(params, grads, s["exp_avg"], s["exp_avg_sq"]):
            m = b1 * m + (1.0 if self.bug == "sum momentum" else 1 - b1) * g
            if self.bug == "v weights swapped":          # (1 - b2) v + b2 g^2, the bias correction kept
                v = (1 - b2) * v + b2 * g * g
            else:
                v = b2 * v + (1 - b2) * (np.abs(g) if self.bug == "abs in v" else g * g)
            t2 = t + 1 if self.bug == "bc2 ahead" else t
            t1 = 1 if self.bug == "frozen" else t
            t2 = 1 if self.bug == "frozen" else t2
            x = x * (1 + lr * self.wd if self.bug == "decay sign" else 1 - lr * self.wd)
            den = np.sqrt(v) / math.sqrt(1 - b2 ** t2) + self.eps
            if self.bug == "eps inside":
                den = np.sqrt(v / (1 - b2 ** t2) + self.eps)
            if self.nesterov:
                tn = t if self.bug == "nadam t" else t + 1
                out.append(x - lr * (b1 * m / (1 - b1 ** tn) + (1 - b1) * g / (1 - b1 ** t1)) / den)
            else:
                out.append(x - lr / (1 - b1 ** t1) * m / den)
            ms.append(m)
            vs.append(v)
        return out, {"t": t, "exp_avg": ms, "exp_avg_sq": vs}


class SGD:
    """torch.optim.SGD's momentum (b_1 = g_1, then b = mu b + (1 - tau) g)."""

    def __init__(self, lr=0.05, mu=0.9, tau=0.3, bug=None):
        self.lr, self.mu, self.tau, self.bug = lr, mu, tau, bug

    def init(self, params):
        return {"t": 0, "momentum_buffer": [np.zeros_like(x) for x in params]}

    def step(self, s, params, grads):
        w = self.tau if self.bug == "dampening inverted" else 1 - self.tau
        bs = [g if s["t"] == 0 else self.mu * b + w * g for b, g in zip(s["momentum_buffer"], grads)]
        return [x - self.lr * b for x, b in zip(params, bs)], {"t": s["t"] + 1, "momentum_buffer": bs}


def _clipped(grads, max_norm, per_leaf):
    groups = [[g] for g in grads] if per_leaf else [grads]
    out = []
    for gs in groups:
        n = math.sqrt(sum(float(np.sum(g * g)) for g in gs))
        out += [g * min(1.0, max_norm / n) if n > 0 else g for g in gs]
    return out


class ClipAdam(Adam):
    def __init__(self, max_norm, per_leaf=False, **kw):
        super().__init__(**kw)
        self.max_norm, self.per_leaf = max_norm, per_leaf

    def step(self, s, params, grads):
        return super().step(s, params, _clipped(grads, self.max_norm, self.per_leaf))


ADAM = "Adam(lr=0.01, beta1=0.8, beta2=0.95)"


def test_correct_implementations_agree_and_need_no_diagnosis():
    for impl, rule in [(Adam(), ADAM), (SGD(), "SGD(lr=0.05, momentum=0.9, dampening=0.3)"),
                       (ClipAdam(0.5), f"ClipByGlobalNorm({ADAM}, max_norm=0.5)"),
                       (Adam(wd=0.1), "AdamW(lr=0.01, beta1=0.8, beta2=0.95, weight_decay=0.1)")]:
        r = _check(impl, rule)
        assert r.agree and r.diagnosis == [], r.report()


@pytest.mark.parametrize("impl,rule,name", [
    (Adam(bug="betas swapped"), ADAM, "beta1 and beta2 swapped"),                   # pairs swapped
    (SGD(bug="dampening inverted"), "SGD(lr=0.05, momentum=0.9, dampening=0.3)",
     "dampening read as 1 - dampening"),                                             # a coefficient's complement
    (Adam(bug="bc2 ahead"), ADAM, "the bias correction of v (1 - beta2^t): counter t + 1"),   # one counter place
    (Adam(bug="frozen"), ADAM, "step counter frozen at 1"),                          # the whole counter frozen
    (ClipAdam(0.5, per_leaf=True), f"ClipByGlobalNorm({ADAM}, max_norm=0.5)", "clip per leaf"),   # scope
    (ClipAdam(0.5, bug="eps inside"), f"ClipByGlobalNorm({ADAM}, max_norm=0.5)",
     "eps inside the sqrt (base)"),                                                  # a wrapper's base variant
    (Adam(bug="nadam t", nesterov=True), "Adam(lr=0.01, beta1=0.8, beta2=0.95, nesterov=True)",
     "the NAdam look-ahead's 1 - beta1^(t+1): counter t - 1"),                      # a place defined at t = 1
    (Adam(bug="v weights swapped"), ADAM, "v's EMA weights swapped (beta2, 1 - beta2)"),   # one EMA's weights
], ids=["swap", "complement", "counter-place", "counter-frozen", "clip-scope", "base", "nadam-place", "ema-swap"])
def test_generated_variants_name_the_bug(impl, rule, name):
    r = _check(impl, rule)
    assert not r.agree and r.best.name == name and r.best.reproduces, r.report()
    assert r.diagnosis_line().startswith(f"DIAGNOSIS: {name} -- ")
    # negative control: the same implementation without the bug agrees
    impl.bug = None
    if hasattr(impl, "per_leaf"):
        impl.per_leaf = False
    assert _check(impl, rule).agree


def test_a_refopt_schedule_counted_from_zero_is_named():
    """refopt's schedules refuse t = 0; the variant evaluates the schedule's formula at the virtual step 0, so a
    0-based warmup (lr 0 at the first step) is named. Negative control: the 1-based one agrees."""
    s = warmup_cosine(3, 10, 0.1)
    rule = refopt.Adam(lr=0.01, beta1=0.8, beta2=0.95, schedule=s)
    zero = Adam(schedule=lambda t: s._at(t - 1))
    r = _check(zero, rule)
    assert r.best.name == "schedule counted from 0" and r.best.reproduces and not r.not_run, r.report()
    assert _check(Adam(schedule=s), rule).agree


def test_a_partition_group_rule_applied_to_every_leaf_is_named():
    """Decay meant for the matrices applied to every leaf: the group's rule on every leaf, naming the option.
    Negative control: decay on the matrices only agrees."""
    rule = refopt.Partition({"hidden": refopt.AdamW(lr=0.01, beta1=0.8, beta2=0.95, weight_decay=0.1),
                             "other": refopt.AdamW(lr=0.01, beta1=0.8, beta2=0.95, weight_decay=0.0)},
                            labels=refopt.rules.partition.matrix_labels)

    class Grouped(Adam):
        def __init__(self, everywhere):
            super().__init__(wd=0.1)
            self.everywhere = everywhere

        def step(self, s, params, grads):
            wd = [0.1 if (self.everywhere or np.ndim(x) >= 2) else 0.0 for x in params]
            outs = [Adam(wd=w).step(s, params, grads) for w in (0.0, 0.1)]
            return [outs[w > 0][0][i] for i, w in enumerate(wd)], outs[0][1]

    r = _check(Grouped(True), rule)
    assert r.best.name == "group 'hidden''s rule on every leaf" and r.best.reproduces, r.report()
    assert "weight_decay=0.1 on the other groups' leaves too" in r.best.detail
    assert any("only the leaves of Partition group(s) ['other'] differ" in e for e in r.evidence), r.evidence
    assert _check(Grouped(False), rule).agree


def test_an_adapter_variant_runs_inside_its_partition_group():
    """A variant that is not a refopt rule (here the frozen step counter) runs on its group's leaves with the
    rule on the others: a counter stuck only in the matrices' group is named there. Negative control: the
    counter stuck everywhere is the whole rule's variant, not the group's."""
    rule = refopt.Partition({"hidden": refopt.Adam(lr=0.01, beta1=0.8, beta2=0.95),
                             "other": refopt.Adam(lr=0.02, beta1=0.8, beta2=0.95)},
                            labels=refopt.rules.partition.matrix_labels)

    class Groups:
        def __init__(self, frozen_everywhere):
            self.sides = [Adam(bug="frozen"), Adam(lr=0.02, bug="frozen" if frozen_everywhere else None)]

        def init(self, params):
            return [a.init(params) for a in self.sides]

        def step(self, s, params, grads):
            outs = [a.step(si, params, grads) for a, si in zip(self.sides, s)]
            return [outs[0 if np.ndim(x) >= 2 else 1][0][i] for i, x in enumerate(params)], [o[1] for o in outs]

    r = _check(Groups(False), rule)
    assert r.best.name == "step counter frozen at 1 (group 'hidden')" and r.best.reproduces, r.report()
    r = _check(Groups(True), rule)
    assert r.best.name == "step counter frozen at 1" and r.best.reproduces, r.report()


class EMA:
    """SGD (no momentum) with a debiased zero-init EMA of the iterates beside it (optax.ema(debias=True) on
    the iterates): e_t = d e_{t-1} + (1 - d) x_t, mu_t = e_t / (1 - d^t); the params are the SGD iterate."""

    def __init__(self, lr=0.05, decay=0.9, bug=None):
        self.lr, self.d, self.bug = lr, decay, bug

    def init(self, params):
        return {"t": 0, "e": [np.zeros_like(x) for x in params], "mu": [x.copy() for x in params]}

    def step(self, s, params, grads):
        t = s["t"] + 1
        xs = [x - self.lr * g for x, g in zip(params, grads)]
        es = [self.d * e + (1 - self.d) * x for e, x in zip(s["e"], xs)]
        tb = t + 1 if self.bug == "debias ahead" else t
        return xs, {"t": t, "e": es, "mu": [e / (1 - self.d ** tb) for e in es]}


def test_a_difference_in_the_state_alone_is_ranked_on_the_state():
    """The params agree and only the EMA differs: every variant that leaves the params alone has params
    distance 0, so the variants are ranked on the state (the EMA's debias read at t + 1 is named, and no
    variant that leaves the EMA alone "reproduces" it). Negative control: the correct EMA agrees."""
    rule = "EMA(SGD(lr=0.05), decay=0.9)"
    r = _check(EMA(bug="debias ahead"), rule)
    assert not r.agree and r.metric == "state" and r.best.reproduces, r.report()
    assert r.best.name == "the averaging weight (1 - decay)/(1 - decay^t): counter t + 1", r.report()
    assert r.problems[0].first[:3] == (1, "w", "state mu (~mu)"), r.problems[0].first
    assert "only the state differs" in r.report()
    assert not any(d.reproduces for d in r.diagnosis[1:]), [d.name for d in r.diagnosis if d.reproduces]
    assert _check(EMA(), rule).agree


def test_wrapped_state_fields_are_paired_by_name():
    """ClipByGlobalNorm(Adam)'s base.m and base.v pair with exp_avg and exp_avg_sq by name (they were paired by
    value, base.m with the user's second moment). Negative control: a plain Adam pairs m with exp_avg too."""
    r = _check(ClipAdam(0.5, bug="eps inside"), f"ClipByGlobalNorm({ADAM}, max_norm=0.5)")
    st = r.problems[0].state
    assert st["base.m"][0].endswith("exp_avg") and st["base.v"][0].endswith("exp_avg_sq"), st
    assert _check(Adam(), ADAM).problems[0].state["m"][0].endswith("exp_avg")


@pytest.mark.parametrize("bug,finding", [
    ("decay sign", "the decay has the opposite sign"),
    ("no decay", "the decay is missing"),
    ("sum momentum", "the state m is 5 x refopt's at every step and leaf (= 1/(1 - beta1))"),
    ("abs in v", "the state v differs from step 1, where its update sees the same params and gradient on both "
                 "sides, while m agrees at step 1"),
], ids=["decay-term", "decay-missing", "state-ratio", "first-state"])
def test_the_evidence_names_what_no_variant_reproduces(bug, finding):
    decay = bug in ("decay sign", "no decay")
    rule = "AdamW(lr=0.01, beta1=0.8, beta2=0.95, weight_decay=0.1)" if decay else ADAM
    r = _check(Adam(bug=bug, wd=0.1 if bug == "decay sign" else 0.0), rule)
    if bug == "no decay":    # the named variant 'no weight decay' reproduces it; the evidence says the same
        assert r.best.reproduces and "decay is missing" in "\n".join(r.evidence), r.report()
        return
    assert not r.best.reproduces and r.lead and finding in r.lead, r.report()
    assert r.diagnosis_line() == f"DIAGNOSIS: {r.lead}."
    assert "the closest" not in r.diagnosis_line()


def test_the_evidence_reads_the_update_ratio_and_the_first_step():
    """A schedule read one step late (by a function refopt cannot shift: a table) is seen in c_t as the
    schedule's index; the lr scaled is a constant c_t with the lr it implies. Negative controls: the correct
    scheduled run agrees; the lr case names no schedule."""
    table = [0.2, 0.4, 0.6, 0.8, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    rule = refopt.Adam(lr=0.01, beta1=0.8, beta2=0.95, schedule=lambda t: table[t - 1])
    late = _check(Adam(schedule=lambda t: table[t]), rule)
    assert "schedule's index" in late.lead and "read at t + 1" in late.lead, late.report()
    assert "the params differ from step 1" in late.evidence[0]
    assert _check(Adam(schedule=lambda t: table[t - 1]), rule).agree
    lr = _check(Adam(lr=0.0125), ADAM)
    assert "1.25 x refopt's at every step: an lr of 0.0125 in place of 0.01" in lr.lead and "schedule" not in lr.lead


def test_a_lead_is_named_only_when_clearly_closer():
    """The ranking reads the earliest differing steps of every differing problem: eps inside the sqrt with a
    small extra error is clearly closer than the rule (named as the closest when the evidence has no lead) but
    does not reproduce the numbers. Negative control: an lr 1 % off has no variant clearly closer."""
    near = _check(Adam(bug="eps inside", lr=0.01 * (1 + 1e-7)), ADAM)
    best = near.best
    assert best.name == "eps inside the sqrt" and not best.reproduces and best.clearly_closer, near.report()
    near.lead = None
    assert "the closest" in near.diagnosis_line() and "eps inside the sqrt" in near.diagnosis_line()
    off = _check(Adam(lr=0.0101), ADAM)
    assert not any(d.clearly_closer for d in off.diagnosis), off.report()
    off.lead = None
    assert "the closest" not in off.diagnosis_line() and "no variant reproduces" in off.diagnosis_line()


def test_generated_variants_come_from_the_rule_record():
    """Every categorical option's other values, integer options +-1, swaps, complements; fields that cannot
    change the numbers (msign_backend) are skipped; a variant the rule refuses is not generated."""
    from refopt.conventions._generated import choices, generated

    names = [v.name for v in generated(refopt.Muon(lr=0.02, momentum=0.9, weight_decay=0.05))]
    for want in ["ns_steps=4", "ns_steps=6", "scale='jordan'", "wd_mode='independent'", "nesterov=False",
                 "momentum read as 1 - momentum", "lr and weight_decay swapped", "step counter frozen at 1"]:
        assert want in names, names
    assert not any("msign_backend" in n for n in names)
    assert set(choices(refopt.Adam(), "amsgrad")) == {False, True, "bias_corrected"}
    assert choices(refopt.Adam(), "lr") is None
    assert "m's EMA weights swapped (beta1, 1 - beta1)" in [v.name for v in generated(refopt.Adam())]
    # one array for the whole tree: generated where per-array norms make it another step (LARS), not for an
    # elementwise rule (Adam), whose step it does not change
    assert "the whole tree as one array" in [v.name for v in generated(refopt.LARS(lr=0.1))]
    assert "the whole tree as one array" not in [v.name for v in generated(refopt.Adam())]
    refused = [v.name for v in generated(refopt.Adam(lr=2.0))]        # beta1 = 2.0 is refused by Adam
    assert "lr and beta1 swapped" not in refused and "lr and eps swapped" in refused


class Lion:
    """Lion (Chen et al. 2023): c = b1 m + (1 - b1) g, x -= lr sign(c), then m = b2 m + (1 - b2) g."""

    def __init__(self, lr=0.01, b1=0.9, b2=0.99, bug=None):
        self.lr, self.b1, self.b2, self.bug = lr, b1, b2, bug

    def init(self, params):
        return {"exp_avg": [np.zeros_like(x) for x in params]}

    def step(self, s, params, grads):
        out, ms = [], []
        for x, g, m in zip(params, grads, s["exp_avg"]):
            new = self.b2 * m + (1 - self.b2) * g
            c = self.b1 * (new if self.bug == "new m" else m) + (1 - self.b1) * g
            out.append(x - self.lr * np.sign(c))
            ms.append(new)
        return out, {"exp_avg": ms}


def test_a_state_read_after_its_update_is_named():
    """Lion's interpolation with the momentum already updated (m_t in place of m_{t-1}): the read-order variant
    'm read after its update'. Negative control: the correct order agrees."""
    rule = "Lion(lr=0.01, beta1=0.9, beta2=0.99)"
    r = _check(Lion(bug="new m"), rule)
    assert r.best.name == "m read after its update" and r.best.reproduces, r.report()
    assert _check(Lion(), rule).agree


def test_a_read_order_switch_reads_the_old_value_and_keeps_the_rule_s_state():
    """The oracle under reads={'m': 'before'}: Adam's step reads m_0 = 0 at step 1, so x does not move (closed
    form), while the state keeps the rule's m_1 = (1 - beta1) g; 'after' is the rule itself for Adam (its
    formula reads the updated m). Negative control: without the switch x moves."""
    from refopt.conventions import oracle

    rule = refopt.Adam(lr=0.1, beta1=0.8, beta2=0.95)
    x, g = [np.array([1.0, -2.0, 0.5])], [np.array([0.5, 0.25, -4.0])]
    stale = oracle(rule, reads={"m": "before"})
    x1, s1 = stale.step(stale.init(x), x, g)
    assert np.array_equal(x1[0], x[0])
    assert np.array_equal(stale.state_arrays(s1)["m"][0], (1 - 0.8) * g[0])
    after, plain = oracle(rule, reads={"m": "after"}), oracle(rule)
    xa, _ = after.step(after.init(x), x, g)
    xp, _ = plain.step(plain.init(x), x, g)
    assert np.array_equal(xa[0], xp[0]) and not np.array_equal(xp[0], x[0])


def _warmup_cosine(t, w, total, floor, over_total=False):
    """Linear warmup t/w to 1, then a cosine to floor over the decay phase's total - w steps (or, the bug,
    with its progress divided by the whole run's total)."""
    if t <= w:
        return t / w
    d = total if over_total else total - w
    return floor + (1 - floor) * (1 + math.cos(math.pi * min(t - w, d) / d)) / 2


def test_a_schedule_phase_over_the_whole_run_is_named():
    """A cosine whose progress is divided by the total steps, not its phase's length: the schedule record's
    variant names phase 2 over the whole run. Negative control: the phase's own length agrees."""
    rule = refopt.Adam(lr=0.01, beta1=0.8, beta2=0.95, schedule=warmup_cosine(3, 10, 0.1))
    r = _check(Adam(schedule=lambda t: _warmup_cosine(t, 3, 10, 0.1, over_total=True)), rule)
    assert r.best.name == "schedule phase 2 (CosineDecay, steps 4..10) over the whole run" and r.best.reproduces, \
        r.report()
    assert _check(Adam(schedule=lambda t: _warmup_cosine(t, 3, 10, 0.1)), rule).agree


class ShapeScaled(Adam):
    """Adam(W) whose step of a leaf is scaled by ``scale(shape)`` (the decay term left as it is)."""

    def __init__(self, scale, **kw):
        super().__init__(**kw)
        self.scale = scale

    def step(self, s, params, grads):
        decayed = [x * (1 - self.lr * self.wd) for x in params]
        new, s2 = Adam(lr=self.lr, b1=self.b1, b2=self.b2, eps=self.eps).step(s, params, grads)
        return [d + self.scale(x.shape) * (n - x) for d, n, x in zip(decayed, new, params)], s2


def test_a_scale_that_is_another_function_of_the_shape_is_named():
    """A mean in place of a sum (every leaf's step / sqrt(size)) and a muP-style 1/fan_in on the matrices'
    direction only (the decay kept): the step-1 ratio per leaf is fitted to a function of the shape.
    Negative controls: a constant scale on every leaf is the lr, not a shape function; the scale 1 agrees."""
    r = _check(ShapeScaled(lambda shape: 1 / math.sqrt(math.prod(shape))), ADAM)
    assert "at step 1 your update is refopt's times 1/sqrt(size) on each leaf" in r.lead, r.report()
    wd = "AdamW(lr=0.01, beta1=0.8, beta2=0.95, weight_decay=0.1)"
    r = _check(ShapeScaled(lambda shape: 1 / shape[0] if len(shape) == 2 else 1.0, wd=0.1), wd)
    assert ("at step 1 your update's direction (your update less refopt's decay term) is refopt's times 1/fan_in"
            in r.lead), r.report()
    r = _check(ShapeScaled(lambda shape: 1.25), ADAM)
    assert not any("function of the shape" in e for e in r.evidence) and "1.25 x refopt's" in r.lead, r.report()
    assert _check(ShapeScaled(lambda shape: 1.0, wd=0.1), wd).agree


def test_a_decay_with_another_group_s_lr_is_named():
    """A Partition whose 'other' group decays with the 'hidden' group's lr: the decay term of one group,
    tested against that group's rule and the other groups' lrs. Negative control: its own lr agrees."""
    rule = refopt.Partition({"hidden": refopt.Adam(lr=0.02, beta1=0.8, beta2=0.95),
                             "other": refopt.AdamW(lr=0.005, beta1=0.8, beta2=0.95, weight_decay=0.1)},
                            labels=refopt.rules.partition.matrix_labels)

    class Groups:
        def __init__(self, decay_lr):
            self.sides = [Adam(lr=0.02), Adam(lr=0.005)]
            self.decay_lr = decay_lr

        def init(self, params):
            return [a.init(params) for a in self.sides]

        def step(self, s, params, grads):
            outs = [a.step(si, params, grads) for a, si in zip(self.sides, s)]
            xs = [outs[0][0][i] if np.ndim(x) >= 2 else outs[1][0][i] - self.decay_lr * 0.1 * x
                  for i, x in enumerate(params)]
            return xs, [o[1] for o in outs]

    r = _check(Groups(0.02), rule)
    assert "a decay term differs (group 'other'): the decay uses the lr of group 'hidden' (0.02)" in r.lead, r.report()
    assert _check(Groups(0.005), rule).agree
