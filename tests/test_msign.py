"""msign: PITFALLS B08 numbers, an independent Newton-Schulz oracle, and hypothesis properties."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refopt.linalg import NS_PRESETS, msign, ns_band, ns_coefficients, ns_scalar_map

JORDAN = (3.4445, -4.7750, 2.0315)
G2 = np.array([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0]])


# ---- an independent plain-numpy oracle (written from the equations, not from refopt) ---------------
def oracle_ns(G, rows, eps=None, mode="add", factor=1.0):
    """Textbook NS: transpose if tall, X = G/||G||_F (or the peers' eps forms), X <- aX + (bA + cA^2)X."""
    G = np.asarray(G, dtype=np.float64)
    tall = G.shape[0] > G.shape[1]
    X = G.T if tall else G
    nrm = factor * np.linalg.norm(X)
    if eps is None:
        X = X / nrm
    elif mode == "add":
        X = X / (nrm + eps)
    else:
        X = X / max(nrm, eps)
    for a, b, c in rows:
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


def oracle_polar(G):
    """U V^T by the eigen-decomposition of G^T G (full-rank wide or tall G)."""
    if G.shape[0] > G.shape[1]:
        return oracle_polar(G.T).T
    w, Q = np.linalg.eigh(G @ G.T)          # G G^T = U S^2 U^T
    return Q @ np.diag(w ** -0.5) @ Q.T @ G  # (G G^T)^{-1/2} G = U V^T


def random_with_singular_values(rng, m, n, s):
    """U diag(s) V^T with Haar-random U, V (s has min(m, n) entries)."""
    k = min(m, n)
    U, _ = np.linalg.qr(rng.standard_normal((m, k)))
    V, _ = np.linalg.qr(rng.standard_normal((n, k)))
    return (U * np.asarray(s, dtype=np.float64)) @ V.T


# ---- PITFALLS B08 -------------------------------------------------------------------------------------
def test_b08_ns5_diag():
    out = msign(np.diag([3.0, 1.0]), coeffs="jordan", steps=5, eps_mode="add", norm_eps=1e-7)
    np.testing.assert_allclose(out, np.diag([0.7530334508, 1.1337062227]), atol=1e-9)


def test_b08_ns5_g2_and_its_singular_values():
    out = msign(G2, eps_mode="add", norm_eps=1e-7)
    want = [[0.4468292687, 0.5926885626, -0.3009699748], [-0.3009699748, 0.2963442813, 0.8982842310]]
    np.testing.assert_allclose(out, want, atol=1e-9)
    np.testing.assert_allclose(np.linalg.svd(out, compute_uv=False), [1.0487692184, 0.7258922774], atol=1e-9)
    # the exact-normalisation default differs from the +1e-7 form only at ~1e-7 relative
    np.testing.assert_allclose(msign(G2), out, atol=1e-6)


def test_b08_exact_polar_factor_of_g2():
    want = [[0.5265986324, 0.8164965809, -0.2367006838], [-0.2367006838, 0.4082482905, 0.8816496581]]
    np.testing.assert_allclose(msign(G2, "svd"), want, atol=1e-9)
    np.testing.assert_allclose(msign(G2, "svd"), oracle_polar(G2), atol=1e-13)
    # NS5 is not the polar factor (B08): they differ by > 0.1 somewhere
    assert np.abs(msign(G2) - msign(G2, "svd")).max() > 0.1


def test_b08_scalar_band():
    lo, hi = ns_band(0.1, 1.0)
    assert round(lo, 4) == 0.6818
    # PITFALLS' upper end 1.2024 is the sup over all of (0, 1] (reached near x = 0.004);
    # on [0.1, 1] the tight maximum is 1.1344, inside the stated band.
    assert 1.1343 < hi < 1.1344 <= 1.2024
    assert round(ns_band(1e-4, 1.0)[1], 4) == 1.2024
    assert round(float(ns_scalar_map(1e-3)), 4) == 0.4705
    # the scalar map is p5(p4(...p1(x))) with p(x) = a x + b x^3 + c x^5
    x = np.linspace(0.01, 1, 7)
    y = x.copy()
    for _ in range(5):
        y = 3.4445 * y - 4.7750 * y ** 3 + 2.0315 * y ** 5
    np.testing.assert_allclose(ns_scalar_map(x), y, rtol=1e-14)


# ---- coefficient schedules ------------------------------------------------------------------------------
def test_presets():
    assert ns_coefficients("jordan", 3) == (JORDAN,) * 3
    assert ns_coefficients("classic", 2) == ((1.875, -1.25, 0.375),) * 2
    you = ns_coefficients("you", 7)
    assert you[0] == (4.0848, -6.8946, 2.9270) and you[4] == you[5] == you[6] == (2.8366, -3.0525, 1.2012)
    pe = ns_coefficients("polar_express", 10)
    # Amsel et al. 2025 Alg. 1: row 1 raw (8.28721201814563, -23.595886519098837, 17.300387312530933)
    # scaled as p(x/1.01); the last raw row (15/8, -10/8, 3/8) unscaled and repeated beyond row 8
    np.testing.assert_allclose(pe[0], (8.28721201814563 / 1.01, -23.595886519098837 / 1.01 ** 3,
                                       17.300387312530933 / 1.01 ** 5), rtol=1e-15)
    np.testing.assert_allclose(pe[6], (1.8750014808534479 / 1.01, -1.2500016453999487 / 1.0303010,
                                       0.3750001645474248 / 1.01 ** 5), rtol=1e-7)
    assert pe[7] == pe[8] == pe[9] == (1.875, -1.25, 0.375)
    # user lists: truncated to steps, or last row repeated
    rows = [(1.0, 2.0, 3.0), (4.0, 5.0, 6.0)]
    assert ns_coefficients(rows, 1) == ((1.0, 2.0, 3.0),)
    assert ns_coefficients(rows, 3) == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0), (4.0, 5.0, 6.0))
    assert ns_coefficients((2, -1.5, 0.5), 2) == ((2.0, -1.5, 0.5),) * 2
    assert set(NS_PRESETS) == {"jordan", "classic", "you", "polar_express"}


@pytest.mark.parametrize("bad", ["nope", (1.0, 2.0), [], [(1.0, 2.0, 3.0), (1.0,)], (1.0, float("nan"), 0.0),
                                 (True, 1.0, 1.0)])
def test_bad_coefficients(bad):
    with pytest.raises(ValueError):
        ns_coefficients(bad, 5)


def test_classic_converges_and_polar_express_beats_jordan():
    rng = np.random.default_rng(1)
    G = random_with_singular_values(rng, 8, 12, np.geomspace(1e-3, 1, 8))
    exact = oracle_polar(G)
    err = {name: np.abs(msign(G, coeffs=name, steps=s) - exact).max()
           for name, s in [("classic", 40), ("jordan", 5), ("polar_express", 8)]}
    assert err["classic"] < 1e-10
    assert err["polar_express"] < 0.05 < err["jordan"]


@pytest.mark.parametrize("coeffs,steps", [("jordan", 5), ("classic", 7), ("you", 5), ("polar_express", 8),
                                          ([(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)], 4)])
@pytest.mark.parametrize("shape", [(5, 9), (9, 5), (6, 6), (1, 4)])
def test_newton_schulz_matches_oracle(coeffs, steps, shape):
    G = np.random.default_rng(2).standard_normal(shape)
    rows = ns_coefficients(coeffs, steps)  # the schedule itself is checked in test_presets
    np.testing.assert_allclose(msign(G, coeffs=coeffs, steps=steps), oracle_ns(G, rows), rtol=0, atol=1e-12)
    np.testing.assert_allclose(msign(G, coeffs=coeffs, steps=steps, eps_mode="add", norm_eps=1e-3),
                               oracle_ns(G, rows, 1e-3, "add"), rtol=0, atol=1e-12)
    np.testing.assert_allclose(msign(G, coeffs=coeffs, steps=steps, eps_mode="clamp", norm_eps=1e3),
                               oracle_ns(G, rows, 1e3, "clamp"), rtol=0, atol=1e-12)


def test_norm_factor_is_a_prescale():
    G = np.random.default_rng(3).standard_normal((4, 6))
    np.testing.assert_allclose(msign(G, norm_factor=1.01), oracle_ns(G, ns_coefficients("jordan", 5), factor=1.01),
                               atol=1e-12)


def test_peer_eps_forms_break_scale_invariance_but_default_does_not():
    G = np.random.default_rng(4).standard_normal((4, 6))
    tiny = 1e-9 * G
    assert np.abs(msign(tiny, eps_mode="add", norm_eps=1e-7) - msign(G)).max() > 0.1
    assert np.abs(msign(tiny, eps_mode="clamp", norm_eps=1e-7) - msign(G)).max() > 0.1
    np.testing.assert_allclose(msign(tiny), msign(G), atol=1e-13)


def test_zero_input_is_exact_zero():
    for shape in [(3, 5), (5, 3), (0, 4), (4, 0), (1, 1)]:
        for dt in (np.float32, np.float64):
            Z = np.zeros(shape, dt)
            for kw in [{}, {"method": "svd"}, {"eps_mode": "add", "norm_eps": 1e-7},
                       {"eps_mode": "clamp", "norm_eps": 1e-7}]:
                out = msign(Z, **kw)
                assert out.shape == shape and out.dtype == dt and not np.any(out)


def test_no_overflow_or_underflow_in_the_norm():
    G = np.random.default_rng(5).standard_normal((4, 6))
    for c in (1e300, 1e-300, 1e-310):
        np.testing.assert_allclose(msign(c * G), msign(G), atol=1e-12)
    G32 = G.astype(np.float32)
    for c in (np.float32(1e30), np.float32(1e-30)):   # ||c G||^2 overflows / underflows float32
        out = msign(c * G32)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, msign(G32), atol=5e-6)


def test_float32_stays_float32_and_is_accurate():
    G = np.random.default_rng(6).standard_normal((16, 24))
    for method in ("newton_schulz", "svd"):
        out32 = msign(G.astype(np.float32), method)
        assert out32.dtype == np.float32 and out32.flags.c_contiguous
        np.testing.assert_allclose(out32, msign(G, method), atol=2e-5)


def test_input_is_never_written():
    G = np.random.default_rng(7).standard_normal((6, 4))
    G.flags.writeable = False
    for method in ("newton_schulz", "svd"):
        msign(G, method)
        msign(np.asfortranarray(G), method)


@pytest.mark.parametrize("bad,kw", [
    (np.ones(3), {}), (np.ones((2, 2, 2)), {}), (np.ones((2, 2), np.int64), {}), (np.ones((2, 2), np.float16), {}),
    (np.array([[1.0, np.nan]]), {}), (np.array([[1.0, np.inf]]), {}), ([[1.0, 2.0]], {}),
    (np.ones((2, 2)), {"method": "qr"}), (np.ones((2, 2)), {"eps_mode": "mul"}),
    (np.ones((2, 2)), {"norm_eps": 1e-7}), (np.ones((2, 2)), {"eps_mode": "add"}),
    (np.ones((2, 2)), {"norm_factor": 0.5}), (np.ones((2, 2)), {"steps": -1}),
    (np.ones((2, 2)), {"method": "svd", "rtol": -1.0})])
def test_bad_input_raises(bad, kw):
    with pytest.raises(ValueError):
        msign(bad, **kw)


# ---- hypothesis properties ------------------------------------------------------------------------------
shapes = st.tuples(st.integers(1, 7), st.integers(1, 7))
seeds = st.integers(0, 2 ** 32 - 1)
methods = st.sampled_from(["newton_schulz", "svd"])
PROP = settings(max_examples=40, deadline=None)


def well_conditioned(seed, shape):
    """Random G with normalised singular values spread over [0.2, 1] x 3 (so SVD is well posed)."""
    rng = np.random.default_rng(seed)
    k = min(shape)
    return random_with_singular_values(rng, *shape, rng.uniform(1.0, 3.0, k))


@PROP
@given(seed=seeds, shape=shapes, method=methods, log_c=st.floats(-12, 6))
def test_scale_invariance(seed, shape, method, log_c):
    G = well_conditioned(seed, shape)
    c = 10.0 ** log_c
    np.testing.assert_allclose(msign(c * G, method), msign(G, method), rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["newton_schulz", "svd"])
def test_orthogonal_equivariance(method):
    """msign(U G V^T) = U msign(G) V^T (post 003), with refopt.testing's msign_equivariance: the property
    users run on their own matrix-sign function."""
    from refopt.testing.properties import msign_equivariance

    out = msign_equivariance(lambda G: msign(G, method), max_examples=25, rtol=1e-11, kind="well")
    assert out.holds, out.describe() + f" counterexample: {out.counterexample}"


def test_orthogonal_equivariance_catches_a_layout_bug():
    """Negative control: an msign that transposes its input is not equivariant, and the property says so."""
    from refopt.testing.properties import msign_equivariance

    out = msign_equivariance(lambda G: msign(G.T, "svd").T[::-1], max_examples=10, rtol=1e-11, kind="well")
    assert out.holds is False


@PROP
@given(seed=seeds, shape=shapes, method=methods)
def test_transpose(seed, shape, method):
    G = np.random.default_rng(seed).standard_normal(shape)
    np.testing.assert_allclose(msign(G.T, method), msign(G, method).T, rtol=0, atol=1e-12)


@PROP
@given(seed=seeds, shape=shapes, rank=st.integers(0, 7))
def test_exact_msign_is_a_partial_isometry_on_the_row_space(seed, shape, rank):
    rng = np.random.default_rng(seed)
    r = min(rank, *shape)
    G = rng.standard_normal((shape[0], r)) @ rng.standard_normal((r, shape[1])) * rng.uniform(0.1, 10)
    O = msign(G, "svd")
    sv = np.linalg.svd(O, compute_uv=False)
    np.testing.assert_allclose(sv[:r], 1.0, atol=1e-10)
    np.testing.assert_allclose(sv[r:], 0.0, atol=1e-10)
    # O^T O is the orthogonal projector onto the row space of G, O O^T onto its column space
    np.testing.assert_allclose(O.T @ O, np.linalg.pinv(G) @ G, atol=1e-8)
    np.testing.assert_allclose(O @ O.T, G @ np.linalg.pinv(G), atol=1e-8)
    # and O is the polar factor: G = O (O^T G) with O^T G symmetric positive semidefinite
    H = O.T @ G
    np.testing.assert_allclose(O @ H, G, atol=1e-10 * np.abs(G).max() + 1e-300)
    np.testing.assert_allclose(H, H.T, atol=1e-10 * max(np.abs(G).max(), 1e-300))
    assert np.linalg.eigvalsh((H + H.T) / 2).min() > -1e-9 * max(np.abs(G).max(), 1e-300)


@PROP
@given(seed=seeds, shape=shapes, coeffs=st.sampled_from(["jordan", "you", "polar_express", "classic"]),
       log_lo=st.floats(-3, -0.5))
def test_newton_schulz_acts_on_singular_values_by_the_scalar_map(seed, shape, coeffs, log_lo):
    rng = np.random.default_rng(seed)
    k = min(shape)
    s = np.sort(rng.uniform(10 ** log_lo, 1.0, k))[::-1]
    s[0] = 1.0
    G = random_with_singular_values(rng, *shape, s)
    x = s / np.linalg.norm(s)                       # normalised singular values
    out = np.linalg.svd(msign(G, coeffs=coeffs), compute_uv=False)
    np.testing.assert_allclose(np.sort(out), np.sort(ns_scalar_map(x, coeffs)), rtol=1e-10, atol=1e-12)
    lo, hi = ns_band(float(x.min()), 1.0, coeffs)
    assert lo - 1e-6 <= out.min() and out.max() <= hi + 1e-6
    if coeffs == "jordan" and x.min() >= 0.1:       # PITFALLS B08 band
        assert 0.6818 <= out.min() and out.max() <= 1.2024


# --- edge cases: huge inputs to the SVD, diverging coefficients, rtol validation ----------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("method", ["svd", "newton_schulz"])
def test_msign_near_max_float(dtype, method):
    # singular values sqrt(2)*max|G| overflow: the SVD of G itself returned zeros
    big = np.finfo(dtype).max / dtype(1.25)
    G = np.array([[1, -1], [1, 1]], dtype) * big
    assert np.isfinite(G).all()
    expect = np.array([[1, -1], [1, 1]]) / np.sqrt(2.0)      # G/||.|| is orthogonal up to sqrt(2)
    O = msign(G, method)
    assert O.dtype == dtype
    np.testing.assert_allclose(O, expect, atol=2e-6 if dtype == np.float32 else 1e-12) if method == "svd" \
        else np.testing.assert_allclose(O, expect * ns_scalar_map(1 / np.sqrt(2.0)), rtol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_msign_svd_scale_invariant_tiny_and_huge(dtype):
    rng = np.random.default_rng(3)
    G = rng.standard_normal((3, 5)).astype(dtype)
    ref = msign(G, "svd")
    for c in (2.0 ** -140, 2.0 ** 100):                 # exact powers of two: c*G is exact (subnormal in f32)
        cG = (G.astype(np.float64) * c).astype(dtype)
        if dtype == np.float32 and c < 1:
            continue
        np.testing.assert_allclose(msign(cG, "svd"), ref, atol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_msign_diverging_coefficients_raise(dtype):
    G = np.array([[1.0, 0.2], [0.0, 0.5]], dtype)
    with pytest.raises(FloatingPointError, match="diverge"):
        msign(G, coeffs=(100.0, 100.0, 100.0), steps=10)


@pytest.mark.parametrize("method", ["svd", "newton_schulz"])
@pytest.mark.parametrize("rtol", ["a", True, -1.0, float("nan"), float("inf"), [0.1]])
def test_msign_bad_rtol_is_valueerror(method, rtol):
    with pytest.raises(ValueError, match="rtol"):
        msign(np.eye(2), method, rtol=rtol)


def test_newton_schulz_many_equals_the_loop_and_the_oracle():
    """Matrices of mixed shapes (wide, tall, square, largest not first) on the thread pool: each result is
    in its place and equals the oracle; with one BLAS thread on both sides, the plain loop bitwise."""
    from threadpoolctl import threadpool_limits

    from refopt.linalg._msign import newton_schulz, newton_schulz_many

    rng = np.random.default_rng(7)
    Gs = [rng.standard_normal(s) for s in [(3, 5), (40, 9), (9, 40), (6, 6), (1, 4), (40, 9)]]
    rows = ns_coefficients("jordan", 5)
    got = newton_schulz_many(Gs, rows)
    for G, O in zip(Gs, got):
        assert O.shape == G.shape
        np.testing.assert_allclose(O, oracle_ns(G, rows), rtol=0, atol=1e-12)
    with threadpool_limits(limits=1, user_api="blas"):
        loop = [newton_schulz(G, rows) for G in Gs]
    with threadpool_limits(limits=2, user_api="blas"):
        pooled = newton_schulz_many(Gs, rows)
    assert all(np.array_equal(a, b) for a, b in zip(loop, pooled))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quintic_factor_rounds_as_the_three_numpy_passes(dtype):
    """P <- c P + b A + a I in one numba pass: bitwise the three NumPy passes (P *= c; T = A * b;
    P += T; diagonal += a). Negative control: the same polynomial rounded
    otherwise (c (P + (b / c) A) + a I) differs in some entries, so the comparison sees a reordering."""
    from refopt.linalg._msign import _quintic_factor_

    rng = np.random.default_rng(11)
    d = np.dtype(dtype).type
    X = rng.standard_normal((37, 53)).astype(dtype)
    A = X @ X.T
    P0 = A @ A
    caught = 0
    for a, b, c in ns_coefficients("polar_express", 8) + ((3.4445, -4.7750, 2.0315),):
        want = P0 * d(c)
        want += A * d(b)
        want[np.diag_indices(37)] += d(a)
        got = P0.copy()
        _quintic_factor_(got, A, d(a), d(b), d(c))
        assert got.dtype == dtype and np.array_equal(got, want)
        wrong = d(c) * (P0 + d(b / c) * A) + d(a) * np.eye(37, dtype=dtype)
        caught += not np.array_equal(wrong, want)
    assert caught == 9
