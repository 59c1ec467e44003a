"""Mechanic (Cutkosky, Defazio & Mehta 2023) written here from Algorithm 1 on a two-leaf tree, with optax's
departures from it as switches: Delta recomputed from x, h clipped in the reward, the reward unclipped in the
state, eps in |h| + eps and ||x|| + eps. Negative controls: the algorithm without each departure, one scale per
leaf, no decay term. The rule-wide state is validated, checkpointed and resumed bit for bit; like() maps
optax.contrib.mechanize with its base optimizer."""
import math

import numpy as np
import pytest

import refopt
from refopt import checkpoint
from refopt.rules.dog import DoGGlobal
from refopt.rules.mechanic import Mechanic, MechanicGlobal, optax_betas
from tree_steps import run

OPTAX = dict(recompute=True, clip_h=True, reward_unclipped=True, eps_in=True)


def _tree(seed=7):
    rng = np.random.default_rng(seed)
    x0 = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    gs = [{k: rng.standard_normal(v.shape) for k, v in x0.items()} for _ in range(4)]
    return x0, gs


def _n2(tree):
    return sum(float(np.sum(a ** 2)) for a in tree.values())


def sgd_momentum(lr, mu):
    """The base: u_t = -lr b_t, b_t = mu b_{t-1} + g_t."""
    def step(g, st):
        b = {k: mu * st[k] + g[k] for k in g} if st else {k: v.copy() for k, v in g.items()}
        return {k: -lr * v for k, v in b.items()}, b
    return step


def adam(lr, b1=0.9, b2=0.999, eps=1e-8):
    """The base: optax.adam's u_t = -lr mhat/(sqrt(vhat) + eps)."""
    def step(g, st):
        t, m, v = st or (0, {k: 0 * a for k, a in g.items()}, {k: 0 * a for k, a in g.items()})
        t += 1
        m = {k: b1 * m[k] + (1 - b1) * g[k] for k in g}
        v = {k: b2 * v[k] + (1 - b2) * g[k] ** 2 for k in g}
        u = {k: -lr * (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps) for k in g}
        return u, (t, m, v)
    return step


def mechanic(x0, gs, base, lam, eps, s_init, betas, recompute=False, clip_h=False, reward_unclipped=False,
             eps_in=False, per_leaf=False):
    """Algorithm 1: x_ref = x_1, Delta_1 = 0; per step u_t from the base, Delta_{t+1} = Delta_t + u_t,
    h_t = <Delta_t, g_t + lambda S_t ||g_t|| x_t / ||x_t||>, m_t = max(beta m, |h_t|), v_t = beta^2 v + h_t^2,
    r_t = max(0, beta r - s_t h_t), W_t = s_init/n m_t + r_t, s_{t+1} = W_t/(sqrt(v_t) + eps),
    x_{t+1} = x_ref + S_{t+1} Delta_{t+1}, from s_1 = m_0 = v_0 = r_0 = 0. The switches give optax's form (whose
    s_1 = s_init changes nothing: h_1 = 0)."""
    if per_leaf:
        return {k: mechanic({k: x0[k]}, [{k: g[k]} for g in gs], base, lam, eps, s_init, betas, recompute, clip_h,
                            reward_unclipped, eps_in)[k] for k in x0}
    n = len(betas)
    x, xref = {k: a.copy() for k, a in x0.items()}, {k: a.copy() for k, a in x0.items()}
    delta = {k: np.zeros_like(a) for k, a in x0.items()}
    s = [0.0] * n
    m, v, r = [0.0] * n, [0.0] * n, [0.0] * n
    st = None
    for g in gs:
        u, st = base(g, st)
        S = sum(s)
        if recompute:
            delta = {k: (x[k] - xref[k]) / (S + eps) for k in x}
        gt = {k: g[k] + lam * S * math.sqrt(_n2(g)) / (math.sqrt(_n2(x)) + (eps if eps_in else 0.0)) * x[k]
              for k in x}
        h = sum(float(np.sum(delta[k] * gt[k])) for k in x)
        for i, b in enumerate(betas):
            hc = min(max(h, -m[i]), m[i]) if clip_h else h
            m[i] = max(b * m[i], abs(h) + (eps if eps_in else 0.0))
            v[i] = b * b * v[i] + h * h
            r[i] = b * r[i] - s[i] * hc
            if not reward_unclipped:
                r[i] = max(0.0, r[i])
            s[i] = (s_init / n * m[i] + max(0.0, r[i])) / (math.sqrt(v[i]) + eps)
        delta = {k: delta[k] + u[k] for k in x}
        x = {k: xref[k] + sum(s) * delta[k] for k in x}
    return x


def _close(a, b, tol=1e-14):
    return all(np.allclose(a[k], b[k], rtol=tol, atol=tol) for k in a)


def _gap(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


HP = dict(lam=0.05, eps=1e-4, s_init=0.1, betas=(0.9, 0.99, 0.999))


def _sgd_rule():
    return Mechanic(refopt.SGD(lr=0.1, momentum=0.9), weight_decay=HP["lam"], eps=HP["eps"], s_init=HP["s_init"],
                    betas=HP["betas"])


def test_four_steps_from_algorithm_1_with_optax_s_departures():
    x0, gs = _tree()
    x, s = run(_sgd_rule(), x0, gs)
    assert _close(x, mechanic(x0, gs, sgd_momentum(0.1, 0.9), **HP, **OPTAX))
    assert isinstance(s.glob, MechanicGlobal) and len(s.glob.s) == 3 and all(type(a) is float for a in s.glob.s)
    assert abs(sum(s.glob.s) - HP["s_init"] * 3) > 1e-3          # the scale has moved


@pytest.mark.parametrize("off", sorted(OPTAX))
def test_each_departure_of_optax_from_algorithm_1_is_visible(off):
    """Negative controls: the algorithm with one of optax's departures undone is caught."""
    x0, gs = _tree()
    x, _ = run(_sgd_rule(), x0, gs)
    other = mechanic(x0, gs, sgd_momentum(0.1, 0.9), **HP, **{**OPTAX, off: False})
    assert _gap(other, x) > 1e-5


def test_one_scale_over_the_tree_not_per_leaf_and_the_decay_term_counts():
    x0, gs = _tree()
    x, _ = run(_sgd_rule(), x0, gs)
    assert _gap(mechanic(x0, gs, sgd_momentum(0.1, 0.9), **HP, **OPTAX, per_leaf=True), x) > 1e-3
    assert _gap(mechanic(x0, gs, sgd_momentum(0.1, 0.9), **{**HP, "lam": 0.0}, **OPTAX), x) > 1e-5


def test_adam_base_at_optax_s_defaults():
    x0, gs = _tree(7)
    x, _ = run(Mechanic(refopt.like("optax.adam", learning_rate=0.05)), x0, gs)
    want = mechanic(x0, gs, adam(0.05), 1e-2, 1e-8, 1e-6, optax_betas(6), **OPTAX)
    assert _close(x, want)
    assert optax_betas(6) == tuple(1.0 - 0.1 ** i for i in range(1, 7)) and Mechanic(refopt.SGD()).betas[0] == 0.9


def test_the_first_step_is_s_init_times_the_base_update():
    """h_1 = 0 (Delta_1 = 0): m_1 = eps, v_1 = 0, s_2 = s_init/n each, so x_2 = x_1 + s_init u_1."""
    x0, gs = _tree()
    rule = Mechanic(refopt.SGD(lr=0.1), s_init=1e-3)
    x, s = refopt.update(rule, refopt.init(rule, x0), x0, gs[0])
    assert _close(x, {k: x0[k] - 1e-3 * 0.1 * gs[0][k] for k in x0}, 1e-15)
    assert s.glob.m == (1e-8,) * 6 and s.glob.v == (0.0,) * 6


def test_the_reference_point_is_the_params_of_the_first_update():
    """optax sets x_ref at its first update (count 0): params swapped in after init are the reference."""
    x0, gs = _tree()
    rule = _sgd_rule()
    x1 = {k: v + 1.0 for k, v in x0.items()}
    _, s = refopt.update(rule, refopt.init(rule, x0), x1, gs[0])
    assert all(np.array_equal(s.leaves[k].x0, x1[k]) for k in x1)


def test_mechanic_inside_a_partition_tunes_each_group():
    """optax.multi_transform gives each group its own mechanize: refopt.Partition does the same."""
    x0, gs = _tree(9)
    rule = refopt.Partition({"w": _sgd_rule(), "b": _sgd_rule()}, lambda path, x: path)
    x, _ = run(rule, x0, gs)
    assert _close(x, mechanic(x0, gs, sgd_momentum(0.1, 0.9), **HP, **OPTAX, per_leaf=True))


@pytest.mark.parametrize("make", [_sgd_rule, lambda: Mechanic(refopt.Partition(
    {"hidden": refopt.Adam(lr=0.05), "other": refopt.DoG(init_step="distance", init_value=1e-2)},
    labels=refopt.matrix_labels), betas=(0.9, 0.999))])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_global_state_checkpoint_resume_bit_identical(make, dtype, tmp_path):
    rule = make()
    x0, gs = _tree(11)
    x0 = {k: v.astype(dtype) for k, v in x0.items()}
    gs = [{k: v.astype(dtype) for k, v in g.items()} for g in gs]
    x, s = run(rule, x0, gs[:3])
    assert all(a.dtype == dtype for a in refopt.tree.leaves(x)) and all(
        a.dtype == dtype for a in refopt.tree.leaves(s.leaves) if isinstance(a, np.ndarray))
    path = str(tmp_path / "ck")
    checkpoint.save(path, x, s, rule)
    x2, s2, rule2 = checkpoint.load(path)[:3]
    assert rule2 == rule and s2.glob == s.glob and type(s2.glob) is type(s.glob)
    assert all(type(a) is float for a in s2.glob.r + s2.glob.m + s2.glob.v + s2.glob.s)
    xa, sa = refopt.update(rule, s, x, gs[3])
    xb, sb = refopt.update_(rule2, s2, x2, gs[3])
    assert all(np.array_equal(xa[k], xb[k]) for k in xa) and sa.glob == sb.glob


def test_a_foreign_global_state_is_refused_before_anything_is_written():
    rule = _sgd_rule()
    x0, gs = _tree()
    s = refopt.init(rule, x0)
    g0 = s.glob
    bad = [None, DoGGlobal(0.0, 0.0), (g0.r, g0.m, g0.v, g0.s, None), g0._replace(s=(0.1, 0.1)),
           g0._replace(m=(-1.0, 0.0, 0.0)), g0._replace(v=(float("nan"), 0.0, 0.0)), g0._replace(s=[0.1, 0.1, 0.1]),
           g0._replace(r=(1, 0.0, 0.0))]
    for glob in bad:
        before = {k: v.copy() for k, v in x0.items()}
        with pytest.raises(ValueError, match="global state"):
            refopt.update_(rule, s._replace(glob=glob), x0, gs[0])
        assert all(np.array_equal(before[k], x0[k]) for k in x0)
    refopt.update(rule, s._replace(glob=g0._replace(r=(-1.0, 0.0, 0.0))), x0, gs[0])    # r may be negative


@pytest.mark.parametrize("kw,match", [
    (dict(weight_decay=-0.1), "weight_decay"), (dict(eps=0.0), "eps"), (dict(s_init=0.0), "s_init"),
    (dict(betas=()), "betas"), (dict(betas=[0.9]), "betas"), (dict(betas=(0.9, 1.0)), "betas"),
    (dict(betas=(-0.1,)), "betas"), (dict(eps=float("nan")), "eps")])
def test_bad_hyperparameters_raise_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        Mechanic(refopt.SGD(), **kw)


def test_bases_mechanic_cannot_take():
    with pytest.raises(ValueError, match="refopt rule"):
        Mechanic("sgd")
    for base in (refopt.ClipByGlobalNorm(refopt.Adam(), max_norm=1.0),
                 refopt.Partition({"hidden": refopt.ClipByGlobalNorm(refopt.SGD(), 1.0), "other": refopt.SGD()},
                                  labels=refopt.matrix_labels)):
        with pytest.raises(ValueError, match="ClipByGlobalNorm"):
            Mechanic(base)

    class Doubled(refopt.SGD):      # a user rule whose whole-tree pre-pass hands the leaves other gradients
        def prepare(self, ctx, ss, xs, gs, paths):
            return [2 * g for g in gs]

    x0, gs = _tree()
    rule = Mechanic(Doubled(lr=0.1))
    with pytest.raises(ValueError, match="changed the gradient at"):
        refopt.update(rule, refopt.init(rule, x0), x0, gs[0])
    bad = {**x0, "b": np.full(5, np.inf)}
    rule = _sgd_rule()
    with pytest.raises(FloatingPointError, match="weights at"):
        refopt.update(rule, refopt.init(rule, x0), bad, gs[0])
    with pytest.raises(NotImplementedError):
        refopt.direction(rule, refopt.init(rule, x0), x0, gs[0])


def test_like_maps_mechanize_with_its_base_optimizer():
    like = refopt.like
    want = Mechanic(refopt.Adam(lr=1e-2), weight_decay=0.05, eps=1e-6, s_init=1e-4, betas=optax_betas(3))
    kw = dict(weight_decay=0.05, eps=1e-6, s_init=1e-4, num_betas=3)
    assert like("optax.contrib.mechanize", base_optimizer=("adam", {"learning_rate": 1e-2}), **kw) == want
    assert like("optax.contrib.mechanize", base_optimizer=["optax.adam", {"learning_rate": 1e-2}], **kw) == want
    assert like("optax.contrib.mechanize", base_optimizer=like("optax.adam", learning_rate=1e-2), **kw) == want
    assert like("optax.contrib.mechanize", base_optimizer=("sgd", {"learning_rate": 0.1})) == Mechanic(
        refopt.SGD(lr=0.1))
    for bad, words in ((dict(), "needs the argument(s) base_optimizer"),
                       (dict(base_optimizer=("adamm", {})), "base_optimizer must be"),
                       (dict(base_optimizer=("optax.chain(clip_by_global_norm, adam)", {"learning_rate": 1.0,
                                                                                        "max_norm": 1.0})), "chain"),
                       (dict(base_optimizer=("adam", {"learning_rate": 1e-2}), num_betas=0), "num_betas"),
                       (dict(base_optimizer=("adam", {"learning_rate": 1e-2}), num_betas=True), "num_betas"),
                       (dict(base_optimizer=("adam", {"learning_rate": 1e-2, "eps_root": 1e-8})), "eps_root")):
        with pytest.raises(ValueError) as e:
            like("optax.contrib.mechanize", **bad)
        assert words in str(e.value)
    from refopt.crosscheck.expr import parse_rule, to_expr
    assert parse_rule('like("optax.contrib.mechanize", base_optimizer=like("optax.adam", learning_rate=0.01), '
                      'num_betas=3, weight_decay=0.05, eps=1e-6, s_init=1e-4)') == want
    assert parse_rule(to_expr(want)) == want


def test_the_rows_name_the_state_keys_the_mapping_gives():
    """The cross-check rows write their optax state keys out (they are made while the registry loads): they
    are the mapping's, and the matched call of a rule is the row's call."""
    from refopt.conventions import mechanic as conv
    from refopt.crosscheck.match import preset_for
    for p in conv.CONVENTIONS.presets + conv.CONVENTIONS.wrong[1:]:
        assert p.state == conv.OPTAX_MECHANIZE.state_map(p.peer_call[1]), p.name
    for p in conv.CONVENTIONS.presets:
        got = preset_for(p.make_rule(), "optax")
        kw = conv.OPTAX_MECHANIZE.arguments(p.peer_call[1])
        assert got.peer_call[0] == "contrib.mechanize" and got.state == p.state
        assert conv.OPTAX_MECHANIZE.arguments(got.peer_call[1]) == {**kw, "base_optimizer": tuple(
            kw["base_optimizer"])}
    assert preset_for(Mechanic(refopt.Adam(lr=0.1), betas=(0.9, 0.5)), "optax") is None     # not optax's betas


def test_against_optax_mechanize_over_ten_steps():
    pytest.importorskip("optax", reason="peer optax not installed")
    from refopt.conventions.mechanic import optax_mechanize
    from refopt.testing.adapters import OptaxAdapter
    x0, _ = _tree(13)
    rng = np.random.default_rng(0)
    xs = [x0["w"], x0["b"]]
    rule = refopt.like("optax.contrib.mechanize", base_optimizer=("adam", {"learning_rate": 0.05, "b1": 0.8}),
                       weight_decay=0.1, s_init=1e-2, num_betas=4)
    peer = OptaxAdapter(optax_mechanize, dict(base_optimizer=("adam", {"learning_rate": 0.05, "b1": 0.8}),
                                              weight_decay=0.1, s_init=1e-2, num_betas=4))
    a, sa, b, sb = xs, refopt.init(rule, xs), xs, peer.init(xs)
    for _ in range(10):
        g = [rng.standard_normal(x.shape) for x in xs]
        a, sa = refopt.update(rule, sa, a, g)
        b, sb = peer.step(sb, b, g)
        assert max(float(np.max(np.abs(p - q)) / np.max(np.abs(q))) for p, q in zip(b, a)) <= 1e-12
    assert abs(float(np.sum(np.asarray(sb.s))) - sum(sa.glob.s)) <= 1e-12 * sum(sa.glob.s)
