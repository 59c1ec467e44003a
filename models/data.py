"""Real data that ships offline: scikit-learn's 8x8 handwritten digits (and, below, a text corpus).

Nothing here touches the network: the digits ship inside the scikit-learn wheel.
"""
from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np


class Digits(NamedTuple):
    """The digits split: x (N, 64) pixel intensities scaled to [0, 1]; y (N,) int64 labels 0..9."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    sha256: str  # hash of the raw pixel and label arrays as shipped (before scaling and split)


def load_digits(dtype=np.float32, test_fraction: float = 0.2) -> Digits:
    """The 1797 8x8 digits of scikit-learn (UCI optdigits test set), with a fixed train/test split.

    The split is a permutation from ``numpy.random.default_rng(0)`` (independent of any training seed):
    the last ``round(test_fraction * 1797)`` permuted samples (360 for 0.2) form the test set. Pixels
    (integers 0..16) are divided by 16.

    Raises: ValueError for test_fraction outside (0, 1).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.datasets import load_digits as _sk_load

    raw_x, raw_y = _sk_load(return_X_y=True)
    h = hashlib.sha256(np.ascontiguousarray(raw_x, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(raw_y, dtype=np.int64).tobytes())
    perm = np.random.default_rng(0).permutation(len(raw_y))
    n_test = int(round(test_fraction * len(raw_y)))
    tr, te = perm[:-n_test], perm[-n_test:]
    x = (raw_x / 16.0).astype(dtype)
    y = raw_y.astype(np.int64)
    return Digits(x[tr], y[tr], x[te], y[te], h.hexdigest())
