r"""Hypothesis strategies for optimizer properties (needs hypothesis: ``pip install "refopt[testing]"``).

Arrays are drawn as a *seed* plus a shape and a scale and built with ``numpy.random.default_rng``, so
hypothesis shrinks to small shapes, simple scales and seed 0 rather than element by element. Entries
are sign * exp(U(log 0.1, log 10)) * scale unless said otherwise: bounded away from 0, so that a
property whose exactness needs |g| >> eps (Adam's gradient-scale invariance) is tested where it holds.

* :func:`shapes` -- array shapes (1-D or 2-D, sides 1..6; ``matrix=True``: 2-D with sides >= 2).
* :func:`pytrees` -- lists of float arrays over shapes, one dtype, scales in [1e-3, 1e3].
* :func:`matrices` -- well-conditioned, ill-conditioned (cond up to 1e8) and rank-deficient matrices,
  U diag(s) V^T with drawn singular values.
* :func:`orthogonal` -- a random orthogonal matrix (QR of a Gaussian, signs fixed: Haar distributed).
* :func:`positive_scales` -- c > 0, log-uniform, optionally at least a factor 2 away from 1.
* :func:`gradient_streams` -- a list of gradient lists for given shapes.
* :func:`rule_configs` -- refopt rule configurations (SGD, Adam, AdamW, Muon, Covariant, Hyperball).
"""
from __future__ import annotations

import math

import numpy as np

try:
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    raise ImportError("refopt.testing.strategies needs hypothesis: pip install \"refopt[testing]\"") from None

__all__ = ["shapes", "pytrees", "matrices", "orthogonal", "positive_scales", "gradient_streams", "rule_configs",
           "bounded_array"]


def bounded_array(rng: np.random.Generator, shape, dtype=np.float64, scale: float = 1.0) -> np.ndarray:
    """sign * exp(U(log 0.1, log 10)) * scale entries (never near 0), in ``dtype``."""
    mag = np.exp(rng.uniform(math.log(0.1), math.log(10.0), shape))
    sign = rng.choice(np.array([-1.0, 1.0]), shape)
    return (sign * mag * scale).astype(dtype)


def shapes(matrix: bool = False, max_side: int = 6):
    """Array shapes: 2-D (n, m) with 2 <= n, m <= max_side when ``matrix``, else 1-D or 2-D from 1."""
    lo = 2 if matrix else 1
    two = st.tuples(st.integers(lo, max_side), st.integers(lo, max_side))
    return two if matrix else st.one_of(st.tuples(st.integers(1, max_side)), two)


def pytrees(matrix: bool = False, dtype=np.float64, max_leaves: int = 3, scales=(1e-3, 1e3)):
    """A list of 1..max_leaves arrays (the params of a property), built from a seed."""
    return st.builds(
        lambda shp, seed, logs: [bounded_array(np.random.default_rng(seed + i), s, dtype, math.exp(logs))
                                 for i, s in enumerate(shp)],
        st.lists(shapes(matrix), min_size=1, max_size=max_leaves), st.integers(0, 2 ** 16),
        st.floats(math.log(scales[0]), math.log(scales[1])) if scales else st.just(0.0))


def matrices(kind: str | None = None, dtype=np.float64, max_side: int = 6):
    """A matrix U diag(s) V^T: kind 'well' (s in [0.5, 2]), 'ill' (s log-spread down to 1e-8 of the
    largest), 'rank_deficient' (some s exactly 0), or any of them (None)."""
    kinds = st.sampled_from(["well", "ill", "rank_deficient"]) if kind is None else st.just(kind)

    def build(k, shp, seed):
        rng = np.random.default_rng(seed)
        n, m = shp
        r = min(n, m)
        u, _ = np.linalg.qr(rng.standard_normal((n, n)))
        v, _ = np.linalg.qr(rng.standard_normal((m, m)))
        if k == "well":
            s = rng.uniform(0.5, 2.0, r)
        elif k == "ill":
            s = np.exp(np.linspace(0.0, math.log(1e-8), r)) * rng.uniform(0.5, 2.0)
        else:
            s = rng.uniform(0.5, 2.0, r)
            s[max(1, r // 2):] = 0.0
        return ((u[:, :r] * s) @ v[:, :r].T).astype(dtype)

    return st.builds(build, kinds, shapes(True, max_side), st.integers(0, 2 ** 16))


def haar_orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    """A Haar-distributed orthogonal n x n matrix (QR of a Gaussian with the signs of R's diagonal)."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def orthogonal(n: int):
    """A random orthogonal n x n matrix (float64)."""
    return st.integers(0, 2 ** 16).map(lambda seed: haar_orthogonal(n, np.random.default_rng(seed)))


def positive_scales(lo: float = 1e-2, hi: float = 1e2, away_from_one: float = 2.0):
    """c > 0, log-uniform in [lo, hi]; at least a factor ``away_from_one`` from 1 (so that a property that
    does not hold shows). Drawn as a float of its log, so it shrinks to the smallest allowed factor."""
    a = math.log(away_from_one)
    return st.one_of(st.floats(a, math.log(hi)), st.floats(a, -math.log(lo)).map(lambda x: -x)).map(math.exp)


def gradient_streams(shps, steps: int = 3, dtype=np.float64):
    """``steps`` gradient lists for arrays of shapes ``shps`` (seeded, entries bounded away from 0)."""
    def build(seed, logs):
        rng = np.random.default_rng(seed)
        return [[bounded_array(rng, s, dtype, math.exp(logs)) for s in shps] for _ in range(steps)]
    return st.builds(build, st.integers(0, 2 ** 16), st.floats(math.log(1e-2), math.log(1e2)))


def rule_configs(kinds=("SGD", "Adam", "AdamW", "Muon", "Covariant", "Hyperball")):
    """refopt rule configurations with drawn hyperparameters."""
    from refopt import SGD, Adam, AdamW, Covariant, Hyperball, Muon

    lr = st.floats(1e-3, 0.1)
    beta = st.floats(0.0, 0.99)
    make = {
        "SGD": st.builds(SGD, lr=lr, momentum=beta, nesterov=st.just(False)),
        "Adam": st.builds(Adam, lr=lr, beta1=beta, beta2=st.floats(0.5, 0.999)),
        "AdamW": st.builds(AdamW, lr=lr, beta1=beta, beta2=st.floats(0.5, 0.999), weight_decay=st.floats(0, 0.1)),
        "Muon": st.builds(Muon, lr=lr, momentum=beta, scale=st.sampled_from(["spectral", "jordan", "rms_match"])),
        "Covariant": st.builds(Covariant, st.builds(Adam, beta1=beta), lr=lr),
        "Hyperball": st.builds(Hyperball, st.builds(SGD, momentum=beta), lr=lr),
    }
    return st.one_of(*[make[k] for k in kinds])
