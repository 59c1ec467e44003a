"""The speed layer: what makes refopt fast, kept off the reading path.

The reading path (:mod:`refopt.core`'s one tree walk, the per-element loops of :mod:`refopt.kernels`, the
rules, :mod:`refopt.tree`, the autograd's numpy operations) says what a step does. This package holds
what makes it fast without changing a bit of it:

* :mod:`refopt.fast.walk`: the tree walk that ``import refopt`` switches in (an identity cache of what was validated,
  small gradients packed into one buffer, batched steps of many leaves, Muon's matrices in parallel);
* :mod:`refopt.fast.many`: the compiled multi-leaf loops (one call steps or checks many arrays);
* :mod:`refopt.fast.blas`: the optional MKL binding of the matrix products (the ``mkl`` extra);
* :mod:`refopt.fast.autograd_kernels`: fused numba kernels of the autograd's attention, norm and FFN ops;
* :mod:`refopt.fast.msign_cuda` and :mod:`refopt.fast.cuda_kernels`: the numba-CUDA Newton-Schulz of
  ``Muon(msign_backend="cuda")`` (the ``cuda`` extra).

``with refopt.fast.reading_path():`` runs :func:`refopt.update` and :func:`refopt.update_` through the plain
walk of :mod:`refopt.core` instead of :mod:`refopt.fast.walk` (same numbers; ``tests/test_fast_layer.py``
requires the same bits for every rule of the catalog).
"""
from __future__ import annotations

import contextlib
import threading

from refopt import core

_LOCK = threading.Lock()


@contextlib.contextmanager
def reading_path():
    """Within the block, every step of this process runs the plain walk of :mod:`refopt.core` (not
    thread-local: it switches the walk of the whole process, and restores it on exit)."""
    with _LOCK:
        saved, core.fast_step = core.fast_step, None
    try:
        yield
    finally:
        core.fast_step = saved
