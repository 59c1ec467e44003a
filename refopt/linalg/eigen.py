"""Canonical eigenbases of symmetric positive semi-definite matrices (the Kronecker factors of SOAP).

An eigenvector is defined only up to sign, and the eigenvectors of a repeated eigenvalue only up to a rotation
of their subspace. The Kronecker factors of a matrix optimizer are built from few gradients and are rank
deficient at first (G G^T of a single m x n gradient has m - n zero eigenvalues when m > n): there the basis a
solver returns is fixed by the rounding noise of the product G G^T, so two implementations of the same rule
(or one run on two BLAS libraries) pick different bases and take different steps. The functions here remove
that freedom: each cluster of equal eigenvalues (within the rounding tolerance below) gets the basis of its
subspace that Householder QR with column pivoting (LAPACK ``?geqp3`` via ``scipy.linalg.qr``) gives for the
subspace's orthogonal projector, which depends on the subspace only; and every column gets the sign that makes
its entry of largest magnitude positive (the first such entry where several tie).

All arithmetic is in float64 (a float32 input is converted exactly); the results are cast back to the input's
dtype. Eigenvalues come from ``numpy.linalg.eigh`` (LAPACK ``?syevd``).
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

#: two eigenvalues belong to one cluster when they differ by at most CLUSTER_ULPS * n * eps * max|lambda|,
#: eps the machine epsilon of the input's dtype and n its order (the rounding of a sum of n products)
CLUSTER_ULPS = 64.0


def cluster_tolerance(w: np.ndarray, n: int, dtype) -> float:
    """CLUSTER_ULPS * n * eps(dtype) * max|w|: the gap below which eigenvalues count as equal."""
    top = float(np.max(np.abs(w))) if w.size else 0.0
    return CLUSTER_ULPS * n * float(np.finfo(dtype).eps) * top


def subspace_basis(P: np.ndarray, k: int) -> np.ndarray:
    """The canonical orthonormal basis (n x k) of the range of the orthogonal projector P of rank k: the first k
    columns of Q in the pivoted QR P[:, piv] = Q R, with canonical signs (:func:`canonical_signs`)."""
    if k == 0:
        return np.zeros((P.shape[0], 0))
    Q, _, _ = scipy.linalg.qr(P, pivoting=True, mode="economic")
    return canonical_signs(Q[:, :k])


def canonical_signs(V: np.ndarray) -> np.ndarray:
    """V with each column multiplied by the sign of its entry of largest magnitude (a new array)."""
    if V.size == 0:
        return V.copy()
    rows = np.argmax(np.abs(V), axis=0)
    s = np.sign(V[rows, np.arange(V.shape[1])])
    s[s == 0] = 1.0
    return V * s


def zero_rows(A: np.ndarray) -> np.ndarray:
    """The indices of the rows of A that are exactly zero (a factor built from gradients whose entries there are
    always zero, e.g. an input pixel that is zero in every image)."""
    return np.flatnonzero(~np.any(A != 0, axis=1))


def eigh_descending(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues of the symmetric n x n matrix A in descending order and a canonical orthonormal eigenbasis
    (the columns of Q, in the same order). The exactly zero rows of A (:func:`zero_rows`) have the unit vectors
    e_j as eigenvectors (eigenvalue 0); they come last, in index order. On the other rows: within each cluster of
    equal eigenvalues the basis of :func:`subspace_basis`, every column with canonical signs. float64
    arithmetic; returns (w, Q) in A's dtype.

    Raises:
      ValueError: A is not a finite square matrix."""
    A = np.asarray(A)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"eigh_descending takes a square matrix, got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError("eigh_descending takes a finite matrix (it holds nan or inf)")
    n = A.shape[0]
    Z = zero_rows(A)
    keep = np.setdiff1d(np.arange(n), Z)
    w, V = np.linalg.eigh(A[np.ix_(keep, keep)].astype(np.float64))
    w, V = w[::-1].copy(), V[:, ::-1]
    tol = cluster_tolerance(w, n, A.dtype)
    sub = np.empty_like(V)
    start = 0
    for i in range(1, keep.size + 1):
        if i == keep.size or w[i - 1] - w[i] > tol:
            block = V[:, start:i]
            sub[:, start:i] = canonical_signs(block) if i - start == 1 else subspace_basis(block @ block.T, i - start)
            start = i
    Q = np.zeros((n, n))
    Q[np.ix_(keep, np.arange(keep.size))] = sub
    Q[Z, keep.size + np.arange(Z.size)] = 1.0
    return np.concatenate([w, np.zeros(Z.size)]).astype(A.dtype), Q.astype(A.dtype)


def complete_basis(Q: np.ndarray, k: int) -> np.ndarray:
    """Q (n x n) with its columns k: replaced by the canonical basis (:func:`subspace_basis`) of the orthogonal
    complement of its first k columns (a new array, float64 arithmetic, Q's dtype)."""
    Q64 = np.asarray(Q, dtype=np.float64)
    n = Q64.shape[0]
    head = Q64[:, :k]
    out = Q64.copy()
    out[:, k:] = subspace_basis(np.eye(n) - head @ head.T, n - k)
    return out.astype(Q.dtype)
