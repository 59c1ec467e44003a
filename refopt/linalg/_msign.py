r"""msign: the matrix sign (orthogonal polar factor) of a 2-D array, exactly by SVD or by Newton-Schulz.

For G = U diag(s) V^T (thin SVD, rank r), the matrix sign is ``msign(G) = U_r V_r^T``: every nonzero
singular value is replaced by 1 and every zero one by 0. It is the steepest-descent direction of the
spectral norm (Bernstein & Newhouse 2024, arXiv:2409.20325) and the core of Muon (post 003;
K. Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/).

Newton-Schulz (NS) approximates it with odd quintics applied to the singular values of the normalised
input X_0 = G / ||G||_F (singular values in (0, 1]):

.. math::

    A = X X^\top; \qquad X \leftarrow (a_k I + b_k A + c_k A A)\, X \qquad (k = 1, \dots, \mathrm{steps})

which maps every singular value x to p_k(x) = a_k x + b_k x^3 + c_k x^5 and keeps the singular vectors.
(Peers write the step as a X + (b A + c A A) X; refopt folds a_k into the m x m factor, which saves an
elementwise pass over X and changes only the rounding.)
:func:`ns_scalar_map` is that scalar map, so the singular values of the NS output are exactly
``ns_scalar_map(s / ||s||_2)`` (up to rounding). NS is approximate: the Jordan quintic does not converge
to 1 but keeps the singular values in a band (PITFALLS B08: on x in [0.1, 1], five Jordan steps land in
[0.6818, 1.2024]; the tight band there is [0.68183, 1.13436], and 1.20237 is the supremum over all of
(0, 1], reached near x = 0.004; :func:`ns_band` computes the band of any schedule).

Coefficient presets (CONVENTIONS.md section 4):

* ``'jordan'``: (3.4445, -4.7750, 2.0315) every step (KellerJordan/Muon, torch.optim.Muon, optax 'standard').
* ``'classic'``: (15/8, -10/8, 3/8) every step, the textbook quintic (converges to 1 for x in (0, 1]).
* ``'you'``: You Jiacheng's five quintics (optax 'dion', NVIDIA Emerging-Optimizers 'quintic').
* ``'polar_express'``: Amsel, Persson, Musco & Gower 2025 (arXiv:2505.16932, Algorithm 1): the eight raw
  rows of :data:`POLAR_EXPRESS_RAW` with the safety scaling p(x/1.01), i.e. (a/1.01, b/1.01**3,
  c/1.01**5), on every row except the last.
* a user tuple (a, b, c): used at every step; a user list of tuples: row k at step k.

Schedules longer than ``steps`` are truncated to their first ``steps`` rows; shorter ones repeat their
last row (Polar Express and Su Jianlin's convention; NVIDIA's "cycle" mode restarts instead, and
optax errors when the list is longer than ns_steps and otherwise runs exactly len(list) steps -- to
reproduce optax with an (n, 3) list, pass steps = n).

Pre-normalisation (``eps_mode``):

* ``'none'`` (default): X_0 = G / (f ||G||_F) with f = ``norm_factor`` (1 by default; Polar Express
  uses 1.01: the paper's X/(1.01||X||_F + 1e-7) is eps_mode='add', norm_eps=1e-7, norm_factor=1.01).
  ||G||_F is computed without overflow or underflow as ``amax * ||G / amax||_F`` with
  ``amax = max |G|``. A zero input returns exact zeros. This form is scale invariant (up to the
  rounding of c G): msign(c G) = msign(G) for every c > 0 for which c G neither overflows nor underflows.
  (No "+ eps" in the denominator: it would break the invariance for tiny c.)
* ``'add'``: X_0 = G / (f ||G||_F + eps) (KellerJordan/Muon eps = 1e-7, optax eps = 1e-8; Moonlight).
* ``'clamp'``: X_0 = G / max(f ||G||_F, eps) (torch.optim.Muon, eps = 1e-7).
  Both break scale invariance for tiny G; they exist to reproduce those peers exactly.

Tall inputs (rows > cols) are transposed before the iteration and transposed back, so the Gram matrix
A is min(m, n) square (all peers do this; the result does not depend on it in exact arithmetic).
All arithmetic runs in the input dtype (float32 stays float32; peers run NS in bfloat16, refopt does not).

Both products of a step are symmetric: A = X X^T and A A = A A^T. The CPU path computes each as a BLAS
symmetric rank-k update (numpy routes ``X @ X.T`` and ``A @ A.T`` to syrk, which computes one triangle
and mirrors it), so a step costs about 3 m^2 n + m^3 flops instead of the plain 4 m^2 n + 2 m^3.
``backend='cuda'`` runs the same iteration in numba-CUDA kernels (:mod:`refopt.fast.msign_cuda`).
With ``stack=True`` leading axes are a batch of matrices, each normalised and iterated on its own.
"""
from __future__ import annotations

import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Sequence

import numba
import numpy as np

#: Polar Express degree-5 coefficients before the safety scaling (Amsel et al. 2025, Algorithm 1).
POLAR_EXPRESS_RAW: tuple[tuple[float, float, float], ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)


def _safety(rows, f=1.01):
    """p(x / f) for every row except the last (Polar Express safety scaling)."""
    scaled = [(a / f, b / f ** 3, c / f ** 5) for a, b, c in rows[:-1]]
    return tuple(scaled) + (tuple(rows[-1]),)


#: Named coefficient schedules: a single (a, b, c) row is used at every step; a list is followed row by
#: row and its last row repeated.
NS_PRESETS: dict[str, tuple] = {
    "jordan": (3.4445, -4.7750, 2.0315),
    "classic": (15 / 8, -10 / 8, 3 / 8),
    "you": ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
            (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)),
    "polar_express": _safety(POLAR_EXPRESS_RAW),
}

_EPS_MODES = ("none", "add", "clamp")


def _is_row(c) -> bool:
    return (isinstance(c, (tuple, list, np.ndarray)) and len(c) == 3
            and all(isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) for v in c))


def ns_coefficients(coeffs="jordan", steps: int = 5) -> tuple[tuple[float, float, float], ...]:
    """The (a, b, c) row used at each of the ``steps`` Newton-Schulz iterations, as Python floats.

    ``coeffs``: a preset name of :data:`NS_PRESETS`, one (a, b, c) row (used at every step), or a
    non-empty sequence of rows (row k at step k; truncated to ``steps`` rows, or its last row repeated).

    Raises: ValueError for an unknown name, a malformed or non-finite row, or steps not an int >= 0.
    """
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    if isinstance(coeffs, str):
        if coeffs not in NS_PRESETS:
            raise ValueError(f"coeffs must be one of {sorted(NS_PRESETS)} or (a, b, c) rows, got {coeffs!r}")
        coeffs = NS_PRESETS[coeffs]
    if _is_row(coeffs):
        rows = [coeffs]
        repeat = True
    elif isinstance(coeffs, (tuple, list, np.ndarray)) and len(coeffs) > 0 and all(_is_row(r) for r in coeffs):
        rows = list(coeffs)
        repeat = False
    else:
        raise ValueError(f"coeffs must be a preset name, an (a, b, c) row or a list of rows, got {coeffs!r}")
    rows = [tuple(float(v) for v in r) for r in rows]
    if not all(math.isfinite(v) for r in rows for v in r):
        raise ValueError(f"Newton-Schulz coefficients must be finite, got {coeffs!r}")
    if repeat:
        return tuple(rows * steps)
    return tuple(rows[k] if k < len(rows) else rows[-1] for k in range(steps))


def ns_scalar_map(x, coeffs="jordan", steps: int = 5) -> np.ndarray:
    """The scalar map of Newton-Schulz: x -> p_steps(...p_1(x)) with p_k(x) = a_k x + b_k x^3 + c_k x^5,
    in float64. Applied to the normalised singular values s / ||s||_2 it gives the singular values of
    ``msign(G, 'newton_schulz', coeffs, steps)`` (with ``eps_mode='none'``, ``norm_factor=1``)."""
    x = np.array(x, dtype=np.float64)
    for a, b, c in ns_coefficients(coeffs, steps):
        x2 = x * x
        x = a * x + (b * x2 + c * (x2 * x2)) * x
    return x


#: the largest singular value a Newton-Schulz schedule may reach at any step (from (0, 1]) for Muon to
#: accept it: the presets stay within 1.21; far above, a quintic overflows float32 (x^5 near 3.4e38)
NS_PEAK_LIMIT = 1e6


def check_bounded_schedule(rows) -> None:
    """ValueError (at Muon's construction) when the schedule's scalar map (:func:`refopt.linalg.ns_scalar_map`, step
    by step) takes a singular value of (0, 1] above :data:`NS_PEAK_LIMIT`: Muon would otherwise find the
    divergence only at its step, after writing its momentum."""
    x = np.concatenate([np.geomspace(1e-9, 1.0, 4001), np.linspace(0.0, 1.0, 4001)])
    for k, (a, b, c) in enumerate(rows):
        with np.errstate(over="ignore", invalid="ignore"):
            x2 = x * x
            x = a * x + (b * x2 + c * (x2 * x2)) * x
            peak = float(np.max(np.abs(x)))
        if not peak <= NS_PEAK_LIMIT:
            raise ValueError(f"ns_coeffs: the Newton-Schulz schedule diverges: singular values in (0, 1] reach "
                             f"{peak:.3g} at step {k + 1} (the presets stay within 1.21; see refopt.linalg.ns_band)")


def ns_band(lo: float, hi: float = 1.0, coeffs="jordan", steps: int = 5, n: int = 200001) -> tuple[float, float]:
    """(min, max) of :func:`ns_scalar_map` over normalised singular values x in [lo, hi], on a grid of
    ``n`` points (geometric spacing; accurate to ~1e-6 for the presets). PITFALLS B08: the Jordan
    quintic, 5 steps, maps [0.1, 1] into [0.6818, 1.2024]."""
    if not 0 < lo <= hi:
        raise ValueError(f"need 0 < lo <= hi, got lo={lo!r}, hi={hi!r}")
    y = ns_scalar_map(np.geomspace(lo, hi, n), coeffs, steps)
    return float(y.min()), float(y.max())


def _check_input(G, stack: bool = False) -> np.ndarray:
    if not isinstance(G, np.ndarray) or G.dtype not in (np.float32, np.float64):
        raise ValueError(f"msign takes a float32 or float64 numpy array, got "
                         f"{getattr(G, 'dtype', type(G).__name__)}")
    if stack and G.ndim < 2:
        raise ValueError(f"msign(stack=True) takes an array of ndim >= 2 (..., m, n), got shape {G.shape}")
    if not stack and G.ndim != 2:
        raise ValueError(f"msign takes a 2-D array, got shape {G.shape} (pass stack=True to treat the leading "
                         f"axes as a batch of matrices)")
    if not np.isfinite(G).all():
        raise ValueError("msign: the input holds nan or inf")
    return G


_BACKENDS = ("cpu", "cuda")


def _check_backend(backend) -> None:
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {list(_BACKENDS)}, got {backend!r}")


def _normalise(G: np.ndarray, eps_mode: str, norm_eps: float, norm_factor: float) -> np.ndarray | None:
    """X_0 = G / denominator (see the module doc) as a new array of G's dtype; None when X_0 = 0."""
    d = G.dtype.type
    amax = np.max(np.abs(G)) if G.size else d(0)
    if amax == 0:
        return None
    Y = G / amax                                    # entries in [-1, 1], no overflow / underflow below
    nrm = d(np.sqrt(np.sum(Y * Y, dtype=G.dtype)))  # ||G||_F / amax, in [1, sqrt(size)]
    if eps_mode == "none":
        Y /= d(norm_factor) * nrm
        return Y
    fro = d(norm_factor) * (nrm * amax)             # f ||G||_F, as the peers compute it
    den = fro + d(norm_eps) if eps_mode == "add" else max(fro, d(norm_eps))
    return G / den


@numba.njit(cache=True, nogil=True)
def _quintic_factor_(P, A, a, b, c):
    """P <- c P + b A + a I in place (P holds A A on entry; a, b, c scalars of the arrays' dtype): each
    entry rounded as (P c) + (A b), then + a on the diagonal, the order of the three NumPy passes
    ``P *= c; P += A * b; P[diagonal] += a`` (same bits: tests/test_msign.py), in one pass and without
    the GIL."""
    m = P.shape[0]
    for i in range(m):
        for j in range(m):
            P[i, j] = P[i, j] * c + A[i, j] * b
        P[i, i] += a


def _newton_schulz(X: np.ndarray, rows) -> np.ndarray:
    """Run the NS iteration on a wide (m <= n) C-contiguous X in its dtype; returns the result.

    Each step forms the m x m matrix P = a I + b A + c A A and then X <- P X, which is a X + (b A + c A A) X
    with the a-term folded into the last matmul (no elementwise pass over the m x n array). Both
    symmetric products go to BLAS syrk: numpy dispatches ``M @ M.T`` (same buffer, transposed) to it and
    mirrors the triangle, so A and A A^T (= A A, A being symmetric) are exactly symmetric and cost
    m^2 n and m^3 flops instead of 2 m^2 n and 2 m^3. (scipy's ?syrk/?symm with alpha/beta would fold
    b and c into the calls, but OpenBLAS symm for P X measured slower than gemm.) P is formed by one
    numba pass (:func:`_quintic_factor_`): for the 112 factors of a 4-step msign of the 28 matrices of
    ``refopt train``'s GPT (m = 128, float32) it takes 0.4 to 0.7 ms where the three NumPy passes take
    1.2 to 2.2 ms (two measurements), about 3 to 5% of that msign."""
    d = X.dtype.type
    m = X.shape[0]
    A = np.empty((m, m), X.dtype)
    P = np.empty((m, m), X.dtype)
    Y = np.empty_like(X)
    for a, b, c in rows:
        np.matmul(X, X.T, out=A)     # syrk: A = X X^T, one triangle computed, then mirrored
        np.matmul(A, A.T, out=P)     # syrk: A A = A A^T (A symmetric), one triangle computed, then mirrored
        _quintic_factor_(P, A, d(a), d(b), d(c))
        np.matmul(P, X, out=Y)
        X, Y = Y, X
    return X


def _msign_svd(G: np.ndarray, rtol: float | None) -> np.ndarray:
    """U_r V_r^T of G / max|G| (the division keeps the singular values of huge or tiny G in range: the
    SVD of G itself would overflow to inf/nan near the largest float; scaling does not change U, V)."""
    amax = np.max(np.abs(G)) if G.size else G.dtype.type(0)
    if amax == 0:
        return np.zeros(G.shape, G.dtype)
    U, s, Vt = np.linalg.svd(G / amax, full_matrices=False)
    if s.size == 0 or s[0] == 0:
        return np.zeros(G.shape, G.dtype)
    tol = (max(G.shape) * np.finfo(G.dtype).eps if rtol is None else rtol) * s[0]
    r = int(np.count_nonzero(s > tol))
    return np.ascontiguousarray(U[:, :r] @ Vt[:r], dtype=G.dtype)


def msign(G, method: str = "newton_schulz", coeffs="jordan", steps: int = 5, *,
          eps_mode: str = "none", norm_eps: float = 0.0, norm_factor: float = 1.0,
          rtol: float | None = None, stack: bool = False, backend: str = "cpu"):
    r"""The matrix sign :math:`U V^\top` of a 2-D array :math:`G = U \Sigma V^\top` (exactly, or its
    Newton-Schulz approximation).

    Args:
      G: float32 or float64 array of shape (m, n), any m, n >= 0 (C- or F-ordered; never written); with
        ``stack=True`` shape (..., m, n), each trailing matrix on its own. With ``backend='cuda'`` also a
        numba device array or any object with ``__cuda_array_interface__`` (then a device array is returned).
      method: ``'newton_schulz'`` (matmuls only; approximate, see the module doc) or ``'svd'`` (exact
        :math:`U_r V_r^\top`; singular values :math:`s_i \le \mathrm{rtol} \cdot s_{\max}` count as zero,
        with the default ``rtol = max(m, n) * eps(dtype)`` as numpy.linalg.matrix_rank, so msign(0) = 0
        and a rank-r input gives a partial isometry with exactly r unit singular values).
      coeffs, steps: the Newton-Schulz schedule (:func:`ns_coefficients`); ignored by 'svd'.
      eps_mode, norm_eps, norm_factor: the pre-normalisation before Newton-Schulz (module doc):
        'none' (exact, scale invariant; norm_eps must be 0), 'add' or 'clamp' (norm_eps > 0), and the
        factor f >= 1 multiplying ``||G||_F``. Ignored by 'svd', which is exactly scale invariant.
      rtol: relative rank threshold of 'svd' (None: the default above).
      stack: False (default): G must be 2-D; True: leading axes are a batch of matrices.
      backend: ``'cpu'`` (numpy/BLAS, default) or ``'cuda'`` (numba-CUDA kernels, Newton-Schulz only;
        needs ``pip install "refopt[cuda]"`` and a GPU, or NUMBA_ENABLE_CUDASIM=1 for the simulator).

    Returns:
      a new C-contiguous array of G's shape and dtype; exact zeros for a zero G (never NaN).

    Raises:
      ValueError: for a non-float32/float64 input, a non-2-D one without ``stack=True``, nan/inf entries,
        or bad options (including rtol not None or a finite number >= 0, checked for either method;
        method='svd' with backend='cuda').
      FloatingPointError: when Newton-Schulz produces nan or inf (user coefficients whose iteration
        diverges; the presets keep every singular value in (0, 1.21]).
      ImportError: for backend='cuda' without numba-cuda.
      RuntimeError: for backend='cuda' without a GPU.
    """
    _check_backend(backend)
    if method not in ("newton_schulz", "svd"):
        raise ValueError(f"method must be 'newton_schulz' or 'svd', got {method!r}")
    _check_norm_options(eps_mode, norm_eps, norm_factor)
    if rtol is not None and (isinstance(rtol, bool) or not isinstance(rtol, (int, float, np.integer, np.floating))
                             or not (math.isfinite(rtol) and rtol >= 0)):
        raise ValueError(f"rtol must be None or a finite number >= 0, got {rtol!r}")
    if not isinstance(stack, bool):
        raise ValueError(f"stack must be a bool, got {stack!r}")
    if backend == "cuda":
        if method != "newton_schulz":
            raise ValueError("backend='cuda' runs Newton-Schulz only; use method='svd' with backend='cpu'")
        from refopt.fast import msign_cuda
        return msign_cuda.msign_cuda(G, ns_coefficients(coeffs, steps), eps_mode, norm_eps, norm_factor,
                                     stack=stack)
    _check_input(G, stack)
    if method == "svd":
        tol = float(rtol) if rtol is not None else None
        if G.ndim == 2:
            return _msign_svd(G, tol)
        out = np.empty(G.shape, G.dtype)
        for i in np.ndindex(G.shape[:-2]):
            out[i] = _msign_svd(G[i], tol)
        return out
    return newton_schulz(G, ns_coefficients(coeffs, steps), eps_mode, norm_eps, norm_factor)


def _check_norm_options(eps_mode, norm_eps, norm_factor) -> None:
    if eps_mode not in _EPS_MODES:
        raise ValueError(f"eps_mode must be one of {list(_EPS_MODES)}, got {eps_mode!r}")
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)) or not math.isfinite(norm_eps):
        raise ValueError(f"norm_eps must be a finite number, got {norm_eps!r}")
    if eps_mode == "none" and norm_eps != 0:
        raise ValueError("norm_eps must be 0 with eps_mode='none' (use eps_mode='add' or 'clamp')")
    if eps_mode != "none" and not norm_eps > 0:
        raise ValueError(f"eps_mode={eps_mode!r} needs norm_eps > 0, got {norm_eps!r}")
    if isinstance(norm_factor, bool) or not isinstance(norm_factor, (int, float)) or not (
            math.isfinite(norm_factor) and norm_factor >= 1):
        raise ValueError(f"norm_factor must be a finite number >= 1, got {norm_factor!r}")


def newton_schulz(G, rows: Sequence[tuple[float, float, float]], eps_mode: str = "none",
                  norm_eps: float = 0.0, norm_factor: float = 1.0, backend: str = "cpu"):
    """Newton-Schulz on a validated float array of shape (m, n) or (..., m, n) (a stack, each matrix on its
    own) with an explicit list of (a, b, c) rows (one per step): normalise, transpose if tall, iterate,
    transpose back. No input checks on the CPU (see :func:`msign`); ``backend='cuda'`` runs the numba-CUDA
    kernels (numpy in, numpy out; a device array in, a device array out) and checks its input.
    Raises FloatingPointError when the result is not finite (diverging coefficients); ValueError for an
    unknown backend; ImportError/RuntimeError for backend='cuda' without numba-cuda or a GPU."""
    _check_backend(backend)
    if backend == "cuda":
        from refopt.fast import msign_cuda
        return msign_cuda.msign_cuda(G, tuple(rows), eps_mode, norm_eps, norm_factor, stack=True)
    if G.ndim > 2:
        out = np.empty(G.shape, G.dtype)
        for i in np.ndindex(G.shape[:-2]):
            out[i] = newton_schulz(G[i], rows, eps_mode, norm_eps, norm_factor)
        return out
    tall = G.shape[0] > G.shape[1]
    X = _normalise(G.T if tall else G, eps_mode, norm_eps, norm_factor)
    if X is None:
        return np.zeros(G.shape, G.dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # a diverging schedule is reported just below
        X = _newton_schulz(np.ascontiguousarray(X), rows)
    if not np.isfinite(X).all():
        raise FloatingPointError(f"Newton-Schulz produced nan or inf in {G.dtype}: the {len(rows)}-step "
                                 f"coefficient schedule {tuple(rows)[:3]!r}... diverges on this input (their scalar map, ns_scalar_map, must "
                                 f"keep singular values in (0, 1] bounded)")
    return np.ascontiguousarray(X.T) if tall else X


# ---- many independent matrices at once (Muon's step over a tree) -------------------------------------
class _Pool:
    """The thread pool of :func:`newton_schulz_many` and the BLAS thread count (``threadpoolctl``), shared
    by the calls of all threads under one lock: the first call that enters sets the BLAS to one thread
    and the last that leaves restores the count the first found (two overlapping calls each saving and
    restoring it would leave it at 1); the pool keeps that many threads while calls use it. Made on first
    use and again in a forked child (whose copy of the pool has no threads)."""

    lock = threading.Lock()
    executor = None
    controller = None   # threadpoolctl's, made on first use
    limiter = None      # threadpoolctl's limit, while users > 0
    users = 0           # calls running their matrices on the pool now
    workers = 0         # the executor's threads: the BLAS thread count the first user found

    @classmethod
    def _forked(cls) -> None:
        """In a forked child: a new lock (the parent's may have been held by another thread), no pool, and
        the BLAS count the parent's calls had set to 1 restored."""
        cls.lock = threading.Lock()
        if cls.limiter is not None:
            cls.limiter.restore_original_limits()
        cls.executor = cls.controller = cls.limiter = None
        cls.users = cls.workers = 0

    @classmethod
    def blas_threads(cls) -> int:
        """The current thread count of the BLAS that numpy calls (1 when threadpoolctl finds none)."""
        counts = [m["num_threads"] for m in cls.controller.info() if m.get("user_api") == "blas"]
        return max(counts, default=1)

    @classmethod
    def enter(cls, n: int) -> int:
        """The threads for ``n`` matrices; when above 1, the caller is a user of the pool until
        :meth:`leave` (the BLAS runs one thread until the last user leaves)."""
        with cls.lock:
            if cls.controller is None:
                from threadpoolctl import ThreadpoolController

                cls.controller = ThreadpoolController()
            if cls.users == 0:
                blas = cls.blas_threads()
                if min(n, blas) <= 1:
                    return 1
                if cls.executor is None or cls.workers != blas:
                    if cls.executor is not None:   # idle: no call uses it
                        cls.executor.shutdown(wait=False)
                    cls.executor = ThreadPoolExecutor(blas, thread_name_prefix="refopt-msign")
                cls.limiter = cls.controller.limit(limits=1, user_api="blas")
                cls.workers = blas
            elif min(n, cls.workers) <= 1:
                return 1
            cls.users += 1
            return min(n, cls.workers)

    @classmethod
    def leave(cls) -> None:
        with cls.lock:
            cls.users -= 1
            if cls.users == 0:
                cls.limiter.restore_original_limits()
                cls.limiter = None

    @classmethod
    def run(cls, fn, jobs: list) -> list:
        """Futures of ``fn(*job)``; a job the pool refuses (the interpreter is exiting: the pool of a
        training loop in a thread that outlives the main thread) runs here."""
        futures = []
        for job in jobs:
            try:
                futures.append(cls.executor.submit(fn, *job))
            except RuntimeError:
                f = Future()
                try:
                    f.set_result(fn(*job))
                except Exception as e:  # noqa: BLE001 - handed on as the pool's futures hand them on
                    f.set_exception(e)
                futures.append(f)
        return futures


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Pool._forked)


def newton_schulz_many(Gs: Sequence[np.ndarray], rows, eps_mode: str = "none", norm_eps: float = 0.0,
                       norm_factor: float = 1.0) -> list:
    """``[newton_schulz(G, rows, ...) for G in Gs]`` for a list of validated 2-D float arrays, the
    matrices spread over parallel threads, each with single-threaded BLAS.

    Why: the matrices of a model layer are small (128 x 128 to 128 x 352 in ``refopt train``'s GPT), and on
    them a multi-threaded BLAS gains little over one thread (the products are too small to split well),
    while independent matrices on separate threads scale (benchmarks/bench_msign.py --many). There are
    as many threads as the BLAS had (threadpoolctl); the BLAS runs single-threaded (a process-wide
    setting, restored on return, also after an exception; calls from several threads share the pool and
    the last one restores it) until every matrix is done. Largest matrices go first (m^2 n flops).
    Each matrix is still one sequential Newton-Schulz in its own thread, so each result is what
    :func:`newton_schulz` computes with single-threaded BLAS, whatever the BLAS's thread count
    (tests/test_msign.py, tests/test_muon.py). A multi-threaded BLAS does not always round as one thread
    does (OpenBLAS 0.3.31 on SkylakeX: float64 products of 300 x 300 matrices differ in the last bit with 2
    threads), so a matrix orthogonalised alone at the BLAS's thread count can differ from its result here in
    the last bits. With one matrix or one BLAS thread (``OPENBLAS_NUM_THREADS=1``,
    ``threadpoolctl.threadpool_limits(1)``) it is the plain loop.

    Raises FloatingPointError as :func:`newton_schulz` (the first failing matrix in list order, after all
    have finished)."""
    Gs = list(Gs)
    if _Pool.enter(len(Gs)) <= 1:
        return [newton_schulz(G, rows, eps_mode, norm_eps, norm_factor) for G in Gs]
    try:
        order = sorted(range(len(Gs)), key=lambda i: -min(Gs[i].shape) ** 2 * max(Gs[i].shape))
        futures = _Pool.run(newton_schulz, [(Gs[i], rows, eps_mode, norm_eps, norm_factor) for i in order])
        wait(futures)
    finally:
        _Pool.leave()
    out = [None] * len(Gs)
    for i, f in zip(order, futures):
        out[i] = f
    return [f.result() for f in out]
