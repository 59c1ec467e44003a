r"""msign on the GPU: the Newton-Schulz iteration of :func:`refopt.msign` in numba-CUDA kernels.

The same iteration as the CPU path (module doc of :mod:`refopt.linalg._msign`), on a stack of B wide
matrices X (B, m, n), m <= n (tall inputs are transposed, as on the CPU)::

    X_0 = G / (f ||G||_F)   (or the peers' 'add' / 'clamp' forms)      two device reductions, one scaling pass
    A   = X X^T                                                        syrk kernel: upper tiles, mirrored
    P   = a I + b A + c A A^T     (= a I + b A + c A A, A symmetric)   syrk kernel, b A + a I in its epilogue
    X  <- P X                     (= a X + (b A + c A A) X)            gemm kernel

Kernels (no cuBLAS): tiled products in shared memory with register blocking; each thread block computes
a BM x BM tile of the output from BK-wide slabs of its operands staged in shared memory, each thread a
TM x TM block of that tile held in registers. The symmetric products run one thread block per tile on
or above the diagonal only (T (T + 1) / 2 of the T^2 tiles) and write every off-diagonal tile twice,
at (i, j) and mirrored at (j, i), so both results are exactly symmetric (a diagonal tile's (r, c) and
(c, r) entries sum the same products in the same order). The polynomial is fused: its scalings and
the a I term live in the epilogue of the A A^T kernel, and a X rides in the P X product, so an
iteration makes three kernel launches and no elementwise pass. The Frobenius norm is computed as on the
CPU, amax * ||G / amax||_F with amax = max |G| (no overflow or underflow; a zero input gives exact zeros).

Arithmetic runs in the input dtype (float32 accumulates in float32). Results agree with the CPU path
to rounding: the summation order of the tiled products differs from BLAS's.

``numba.cuda`` is imported only when a function here runs: importing refopt never needs numba-cuda.
"""
from __future__ import annotations

import functools
import importlib.util
from typing import NamedTuple

import numpy as np

INSTALL_HINT = 'pip install "refopt[cuda]"'


def _cuda():
    """numba.cuda, or a clear ImportError / RuntimeError saying what is missing."""
    if importlib.util.find_spec("numba_cuda") is None:
        raise ImportError(f"msign(backend='cuda') needs numba-cuda, which is not installed: {INSTALL_HINT}")
    from numba import cuda
    if not cuda.is_available():
        raise RuntimeError("msign(backend='cuda'): numba-cuda found no usable CUDA GPU and driver (set "
                           "NUMBA_ENABLE_CUDASIM=1 before importing numba to run the kernels in numba's "
                           "CUDA simulator)")
    return cuda


class Tiles(NamedTuple):
    """Launch geometry. bm: output tile side (BM x BM); bk: depth of a shared-memory slab; tm: each thread
    computes a tm x tm register block (bm % tm == 0; (bm / tm)^2 threads a block); red: threads of a
    reduction block (a power of two); red_blocks: most reduction blocks per matrix."""
    bm: int = 128
    bk: int = 8
    tm: int = 8
    red: int = 256
    red_blocks: int = 256


#: The production geometry (128 x 128 tiles, 8 x 8 per thread, 256 threads a block).
DEFAULT_TILES = Tiles()
#: For products whose 128-tile grid would leave most of a large GPU idle (64 x 64 tiles, 4 x 4 a thread).
SMALL_TILES = Tiles(bm=64, bk=8, tm=4)
#: Fewer 128-tile blocks than this in the P X product: use SMALL_TILES (about 2 blocks per SM of a
#: 132-SM H100 / H200).
MIN_BLOCKS = 264


def auto_tiles(m: int, n: int, batch: int = 1) -> Tiles:
    """The geometry for Newton-Schulz on a (batch, m, n) stack: DEFAULT_TILES when the P X product
    fills the GPU with 128 x 128 tiles, else SMALL_TILES."""
    mm, nn = min(m, n), max(m, n)
    blocks = batch * -(-mm // DEFAULT_TILES.bm) * -(-nn // DEFAULT_TILES.bm)
    return DEFAULT_TILES if blocks >= MIN_BLOCKS else SMALL_TILES


def _check_tiles(t: Tiles) -> None:
    if not (t.bm > 0 and t.bk > 0 and t.tm > 0 and t.bm % t.tm == 0 and t.red > 0 and t.red & (t.red - 1) == 0
            and t.red_blocks > 0):
        raise ValueError(f"bad tile geometry {t!r}")


@functools.lru_cache(maxsize=None)
def kernels(dtype_name: str, tiles: Tiles = DEFAULT_TILES) -> dict:
    """Compile (lazily, once per dtype and geometry) and return the kernels as a dict of name -> kernel."""
    _cuda()
    _check_tiles(tiles)
    from refopt.fast import cuda_kernels
    return cuda_kernels.build(dtype_name, tiles.bm, tiles.bk, tiles.tm, tiles.red)


_EW = (16, 16)      # threads of the elementwise kernels


def _ew_grid(rows: int, cols: int, batch: int):
    return ((cols + _EW[0] - 1) // _EW[0], (rows + _EW[1] - 1) // _EW[1], batch)


def syrk(X, C, alpha=1.0, beta=0.0, D=None, diag=0.0, *, tiles: Tiles = DEFAULT_TILES, log=None):
    """C = alpha X X^T + beta D + diag I on device arrays X (B, m, k), C and D (B, m, m); only the tiles
    on or above the diagonal are computed (then mirrored). ``log``: an optional (T, T) int32 device array
    (T = ceil(m / tiles.bm)) counting the tiles each launch computed."""
    cuda = _cuda()
    k = kernels(X.dtype.name, tiles)
    dt = X.dtype.type
    B, m, _ = X.shape
    T = (m + tiles.bm - 1) // tiles.bm
    if log is None:
        log = cuda.device_array((0, 0), np.int32)
    k["syrk"][(T * (T + 1) // 2, B), (tiles.bm // tiles.tm) ** 2](
        X, C, C if D is None else D, dt(alpha), dt(beta), dt(diag), log)
    return C


def gemm(P, X, Y, *, tiles: Tiles = DEFAULT_TILES):
    """Y = P X on device arrays P (B, m, k), X (B, k, n), Y (B, m, n)."""
    k = kernels(X.dtype.name, tiles)
    B, m, _ = P.shape
    n = X.shape[2]
    grid = ((n + tiles.bm - 1) // tiles.bm, (m + tiles.bm - 1) // tiles.bm, B)
    k["gemm"][grid, (tiles.bm // tiles.tm) ** 2](P, X, Y)
    return Y


def _normalise(G, X, eps_mode, norm_eps, norm_factor, tiles, check_finite):
    """X = normalised G (transposed when tall) on the device; returns True when G held nan or inf (only
    when ``check_finite``: this reads one flag back to the host)."""
    cuda = _cuda()
    k = kernels(G.dtype.name, tiles)
    dt = G.dtype.type
    B, r, c = G.shape
    nb = max(1, min(tiles.red_blocks, (r * c + tiles.red - 1) // tiles.red))
    part = cuda.device_array((B, nb), G.dtype)
    amax = cuda.device_array(B, G.dtype)
    sumsq = cuda.device_array(B, G.dtype)
    s1 = cuda.device_array(B, G.dtype)
    s2 = cuda.device_array(B, G.dtype)
    bad = cuda.to_device(np.zeros(B, np.int32))
    k["absmax_partial"][(nb, B), tiles.red](G, part, bad)
    k["reduce_final"][B, tiles.red](part, amax, True)
    if check_finite and bad.copy_to_host().any():
        return True
    k["sumsq_partial"][(nb, B), tiles.red](G, amax, part)
    k["reduce_final"][B, tiles.red](part, sumsq, False)
    mode = {"none": 0, "add": 1, "clamp": 2}[eps_mode]
    k["denominators"][(B + 31) // 32, 32](amax, sumsq, s1, s2, mode, dt(norm_eps), dt(norm_factor))
    k["scale"][_ew_grid(r, c, B), _EW](G, s1, s2, X, r > c)
    return False


def newton_schulz_device(G, rows, eps_mode="none", norm_eps=0.0, norm_factor=1.0, *,
                         tiles: Tiles | None = None, check_input=True):
    """Newton-Schulz on a C-contiguous device array G of shape (B, m, n) (float32 or float64); returns a
    new device array of the same shape. Raises ValueError when ``check_input`` and G holds nan or inf,
    FloatingPointError when the result does not stay finite."""
    cuda = _cuda()
    B, m, n = G.shape
    tiles = auto_tiles(m, n, B) if tiles is None else tiles
    k = kernels(G.dtype.name, tiles)
    mm, nn = min(m, n), max(m, n)
    X = cuda.device_array((B, mm, nn), G.dtype)
    if B * m * n == 0:
        return cuda.to_device(np.zeros(G.shape, G.dtype))
    if _normalise(G, X, eps_mode, norm_eps, norm_factor, tiles, check_input):
        raise ValueError("msign: the input holds nan or inf")
    Y = cuda.device_array_like(X)
    A = cuda.device_array((B, mm, mm), G.dtype)
    P = cuda.device_array((B, mm, mm), G.dtype)
    for a, b, c in rows:
        syrk(X, A, tiles=tiles)                                   # A = X X^T
        syrk(A, P, alpha=c, beta=b, D=A, diag=a, tiles=tiles)     # P = c A A^T + b A + a I
        gemm(P, X, Y, tiles=tiles)                                # X <- P X
        X, Y = Y, X
    bad = cuda.to_device(np.zeros(1, np.int32))
    k["nonfinite"][_ew_grid(mm, nn, B), _EW](X, bad)
    if bad.copy_to_host()[0]:
        raise FloatingPointError(f"Newton-Schulz produced nan or inf in {G.dtype}: the {len(rows)}-step "
                                 f"coefficient schedule {tuple(rows)[:3]!r}... diverges on this input (its "
                                 f"scalar map, ns_scalar_map, must keep singular values in (0, 1] bounded)")
    if m <= n:
        return X
    out = cuda.device_array((B, m, n), G.dtype)
    k["transpose"][_ew_grid(mm, nn, B), _EW](X, out)
    return out


def msign_cuda(G, rows, eps_mode="none", norm_eps=0.0, norm_factor=1.0, *, stack=False,
               tiles: Tiles | None = None):
    """:func:`refopt.msign` (Newton-Schulz) on the GPU. ``G``: a numpy array (returns numpy) or a numba /
    ``__cuda_array_interface__`` device array (C-contiguous; returns a numba device array, no host copy),
    float32 or float64, shape (m, n) or, with ``stack``, (..., m, n). Raises ValueError for a bad input
    (dtype, shape, nan/inf, a non-contiguous device array), FloatingPointError for a diverging schedule,
    ImportError / RuntimeError without numba-cuda / a GPU. ``tiles``: the launch geometry (None: by
    :func:`auto_tiles`)."""
    cuda = _cuda()
    on_host = isinstance(G, np.ndarray)
    if not on_host:
        if getattr(cuda, "is_cuda_array", lambda a: False)(G):     # numba, CuPy, torch.cuda, ... arrays
            G = cuda.as_cuda_array(G)
        elif not (hasattr(G, "copy_to_host") and hasattr(G, "dtype")):    # (the simulator's device arrays)
            raise ValueError(f"msign(backend='cuda') takes a numpy array or a CUDA device array, got "
                             f"{type(G).__name__}")
    if G.dtype not in (np.float32, np.float64):
        raise ValueError(f"msign takes a float32 or float64 array, got {G.dtype}")
    if (G.ndim < 2) if stack else (G.ndim != 2):
        raise ValueError(f"msign takes a 2-D array, got shape {G.shape}" + (
            "" if stack else " (pass stack=True to treat the leading axes as a batch of matrices)"))
    shape = G.shape
    m, n = shape[-2:]
    B = int(np.prod(shape[:-2], dtype=np.int64))
    if on_host:
        if not np.isfinite(G).all():
            raise ValueError("msign: the input holds nan or inf")
        if G.size == 0:
            return np.zeros(shape, G.dtype)
        out = newton_schulz_device(cuda.to_device(np.ascontiguousarray(G).reshape(B, m, n)), rows, eps_mode,
                                   norm_eps, norm_factor, tiles=tiles, check_input=False)
        return out.copy_to_host().reshape(shape)
    if not G.is_c_contiguous():
        raise ValueError("msign(backend='cuda') takes C-contiguous device arrays")
    if B * m * n == 0:
        return cuda.to_device(np.zeros(shape, G.dtype))
    out = newton_schulz_device(G.reshape(B, m, n), rows, eps_mode, norm_eps, norm_factor, tiles=tiles)
    return out.reshape(*shape)
