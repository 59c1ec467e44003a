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


# ---- character-level text corpus (GPT) ---------------------------------------------------------------
MIN_TEXT_CHARS = 1000


class TextCorpus(NamedTuple):
    """A text and where it came from: ``source`` names it ('pydoc_data.topics' or the file path),
    ``sha256`` is the hash of its UTF-8 bytes, ``python_version`` the interpreter that supplied it."""

    text: str
    source: str
    sha256: str
    python_version: str


def default_text() -> str:
    """The English text CPython ships in ``pydoc_data.topics`` (the Language Reference topics used by
    ``help()``): the topic strings joined with a blank line ("\\n\\n") in sorted key order. About 465 K
    characters and ~100 distinct ones on Python 3.11; the text changes between Python releases, so record
    :func:`load_text`'s ``sha256`` and ``python_version`` with every run."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def load_text(path=None, min_chars: int = MIN_TEXT_CHARS) -> TextCorpus:
    """The default corpus (``path=None``, see :func:`default_text`) or a UTF-8 text file.

    Raises ValueError (one line, naming the path) for a missing path, a directory, an empty file, a
    binary or non-UTF-8 file (NUL bytes or invalid UTF-8), or a text shorter than ``min_chars``
    characters (too short to split into training and validation sequences).
    """
    import os
    import sys

    version = sys.version.split()[0]
    if path is None:
        text, source = default_text(), "pydoc_data.topics"
    else:
        source = os.fspath(path)
        if not os.path.exists(source):
            raise ValueError(f"text file not found: {source}")
        if os.path.isdir(source):
            raise ValueError(f"expected a text file, got a directory: {source}")
        with open(source, "rb") as fh:
            raw = fh.read()
        if not raw:
            raise ValueError(f"text file is empty: {source}")
        if b"\x00" in raw:
            raise ValueError(f"text file looks binary (contains NUL bytes): {source}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"text file is not valid UTF-8 (byte {e.start}): {source}") from None
    if len(text) < min_chars:
        raise ValueError(f"text is too short: {len(text)} characters, need at least {min_chars} ({source})")
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return TextCorpus(text, source, sha, version)


class CharVocab:
    """Character vocabulary: the sorted distinct characters of a text; id i <-> ``chars[i]``.

    ``encode(str) -> int64 array`` raises ValueError for a character outside the vocabulary;
    ``decode(ids) -> str`` raises ValueError for an id outside [0, size).
    """

    def __init__(self, text: str):
        if not text:
            raise ValueError("CharVocab needs a non-empty text")
        self.chars = tuple(sorted(set(text)))
        self._index = {c: i for i, c in enumerate(self.chars)}

    @property
    def size(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        try:
            return np.fromiter((self._index[c] for c in text), dtype=np.int64, count=len(text))
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids) -> str:
        ids = np.asarray(ids).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.chars)):
            raise ValueError(f"token ids must lie in [0, {len(self.chars)})")
        return "".join(self.chars[i] for i in ids.tolist())


def split_ids(ids: np.ndarray, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic split of a token sequence: the first ``1 - val_fraction`` for training, the rest
    (the end of the text) for validation. Raises ValueError for val_fraction outside (0, 1)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    ids = np.asarray(ids)
    n_train = int(round(len(ids) * (1.0 - val_fraction)))
    return ids[:n_train], ids[n_train:]


def get_batch(data: np.ndarray, block_size: int, batch_size: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A batch of next-token pairs: starts s_b ~ uniform integers in [0, len(data) - block_size) from
    ``rng`` (one ``rng.integers`` call), x[b] = data[s_b : s_b + T], y[b] = data[s_b + 1 : s_b + T + 1].

    Shapes: data (N,) integer; returns x, y (batch_size, block_size) int64.
    Raises: ValueError if data has fewer than block_size + 1 tokens or a size is not positive;
    TypeError if rng is not a numpy Generator.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if block_size < 1 or batch_size < 1:
        raise ValueError(f"block_size and batch_size must be positive, got {block_size}, {batch_size}")
    data = np.asarray(data)
    if len(data) < block_size + 1:
        raise ValueError(f"need at least block_size + 1 = {block_size + 1} tokens, got {len(data)}")
    starts = rng.integers(0, len(data) - block_size, size=batch_size)
    offs = starts[:, None] + np.arange(block_size)
    return data[offs].astype(np.int64), data[offs + 1].astype(np.int64)
