"""The autograd's matrix products, on one OpenMP thread pool when the optional ``mkl`` package is there.

NumPy's wheels multiply matrices with OpenBLAS, which runs its own threads; refopt's fused kernels
(``refopt.fast.autograd_kernels``) run on numba's. Two pools on the same cores compete (each spins after its
work), so with NumPy's BLAS the fused kernels stay serial. With the ``mkl`` package installed
(``pip install "refopt[mkl]"``, Linux x86-64), :func:`matmul` calls MKL's ``cblas_sgemm`` / ``cblas_dgemm``
through ctypes with MKL's GNU OpenMP threading layer -- the libgomp pool that numba's ``omp`` threading layer
also uses -- and the fused kernels run their parallel builds on it: one pool, as in torch. The attention's
stacks of small products go to ``cblas_?gemm_batch_strided``, which reads the heads where the qkv projection
put them and spreads the batch over the same threads (MKL's pointer-array ``?gemm_batch`` runs them on one).

Results. Each product is a BLAS GEMM either way (C = A B, alpha 1, beta 0), within the rounding bound
|fl(AB) - AB| <= K u |A| |B| (tests/test_blas.py); MKL and OpenBLAS may round a product differently in the
last bits, so a run records which one it used (:func:`describe`, in ``config.json``). MKL runs in its strict
Conditional Numerical Reproducibility (CNR) mode, which MKL documents for ``?gemm`` as the same bits from
run to run and for any number of threads, and offers on three named code branches only: AVX512_E1, AVX512
and AVX2, each on Intel processors only ("settings other than AUTO or COMPATIBLE are available only for
Intel processors"). The first of them MKL accepts is used (its automatic branch first when it is one of
them); where MKL refuses all three (any non-Intel CPU, e.g. an AMD EPYC with AVX2: each is refused with
MKL_CBWR_ERR_UNSUPPORTED_BRANCH) the products go to NumPy. MKL also accepts the strict flag with its AUTO
and COMPATIBLE branches, but does not honour it there: on an AMD EPYC (AVX2, MKL 2026.2) a float32 product
of (2 x 200000) and (200000 x 2) gave other bits on one thread than on two under AUTO | STRICT, so those
are not tried. MKL's list of strict-CNR routines does
not name ``?gemm_batch_strided`` (standard CNR: the same bits for a fixed thread count), so that is tested
here instead: the GPT's step, attention included, gives the same bits on one thread and on two. A product
may round differently by the route it takes (one GEMM, a batch, NumPy), which is fixed by the shapes and
layouts, so it is the same from call to call. The fused kernels' parallel builds give the bits of their
serial builds (fixed-size row chunks, no atomics).

Choosing. ``REFOPT_GEMM`` in the environment: ``auto`` (default: MKL when it can be used, else NumPy),
``numpy``, or ``mkl`` (an error at the first product if MKL cannot be used). MKL is used only when all of
these hold, checked once at the first product: the ``mkl`` distribution with ``libmkl_rt`` and its GNU
threading library, a ``libgomp`` on the system, numba's ``omp`` threading layer (made numba's layer if the
user has not chosen another and numba has not started its threads yet; a numba already running another
layer keeps NumPy's products), and MKL accepting the GNU layer and strict CNR on one of its named branches.
Where the ``mkl`` package is installed but not used, :func:`notice` gives the one line (once per process)
that ``refopt train`` and ``refopt compare`` print to stderr, and :func:`describe` the reason that
``config.json`` records. :func:`use` switches in a
running process (tests, benchmarks). GNU OpenMP's threads do not survive a fork: a child forked after MKL
was loaded runs MKL on one thread (the same bits) and the fused kernels serially; a rule's parallel numba
kernels need ``multiprocessing``'s "spawn" start method there, with or without MKL.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

_ENV = "REFOPT_GEMM"
_CHOICES = ("auto", "numpy", "mkl")

# MKL's named constants (mkl_types.h, mkl_cbwr.h, mkl_cblas.h)
_MKL_THREADING_GNU = 3
_MKL_CBWR_ALL = -1           # MKL_CBWR_Get's option for the whole setting (branch and flags)
_MKL_CBWR_SUCCESS = 0
_MKL_CBWR_STRICT = 0x10000
#: the code branches on which MKL documents strict CNR, tried in this order (MKL_CBWR_AVX512_E1, _AVX512, _AVX2)
_MKL_CBWR_STRICT_BRANCHES = {14: "AVX512_E1", 12: "AVX512", 10: "AVX2"}
_MKL_CBWR_ERRORS = {-1: "MKL_CBWR_ERR_INVALID_SETTINGS", -2: "MKL_CBWR_ERR_INVALID_INPUT",
                    -3: "MKL_CBWR_ERR_UNSUPPORTED_BRANCH", -4: "MKL_CBWR_ERR_UNKNOWN_BRANCH",
                    -8: "MKL_CBWR_ERR_MODE_CHANGE_FAILURE"}
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_INT_MAX = 2 ** 31 - 1   # MKL's LP64 interface: every dimension and leading dimension is a C int
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))   # native byte order only ('>f8' != '<f8')


class _State:
    lock = threading.Lock()
    requested: str | None = None    # from the environment on first use, or use()
    lib = None                      # the loaded libmkl_rt, once tried
    tried = False
    why_not = ""                    # why MKL is not used (empty when it is)
    installed = False               # the mkl package is there (whether or not it can be used)
    noticed = False                 # notice() has given its line
    info = ""                       # MKL's version and CNR branch when loaded
    forked = False                  # a child forked after MKL was loaded: MKL on one thread, serial kernels


def _after_fork_in_child() -> None:
    """GNU OpenMP's threads do not survive a fork: a child calling MKL on them hangs, and numba's omp layer
    ends it. A child forked after MKL was loaded runs MKL on one thread (strict CNR: the same bits) and the
    fused kernels' serial builds (:func:`one_pool` is False)."""
    _State.lock = threading.Lock()
    if _State.lib is not None:
        _State.lib.MKL_Set_Num_Threads(1)
        _State.forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _choice(name) -> str | None:
    """``name`` as one of :data:`_CHOICES` (case and surrounding blanks ignored; empty means auto), or None."""
    value = (name.strip().lower() or "auto") if isinstance(name, str) else None
    return value if value in _CHOICES else None


def _requested() -> str:
    if _State.requested is None:
        value = os.environ.get(_ENV, "auto")
        if _choice(value) is None:
            raise ValueError(f"{_ENV}={value!r}: expected one of {', '.join(_CHOICES)}")
        _State.requested = _choice(value)
    return _State.requested


def _mkl_rt():
    """(the path of libmkl_rt, '') from the installed ``mkl`` distribution, which must also hold MKL's GNU
    threading library; (None, the reason) otherwise."""
    from importlib import metadata
    try:
        dist = metadata.distribution("mkl")
    except metadata.PackageNotFoundError:
        return None, "the mkl package is not installed (pip install \"refopt[mkl]\")"
    _State.installed = True
    found = {}
    for f in dist.files or ():
        name = os.path.basename(str(f))
        for key in ("libmkl_rt.so", "libmkl_gnu_thread.so"):
            if name.startswith(key):
                found.setdefault(key, str(dist.locate_file(f)))
    if "libmkl_rt.so" not in found or "libmkl_gnu_thread.so" not in found:
        return None, "the mkl package has no libmkl_rt.so / libmkl_gnu_thread.so (not Linux x86-64?)"
    return found["libmkl_rt.so"], ""


def _numba_omp() -> str:
    """'' when numba's fused kernels will run on its ``omp`` layer (set here if still free), else why not."""
    import numba
    try:
        from numba.np.ufunc import omppool  # noqa: F401
    except ImportError as e:
        return f"numba's omp threading layer cannot be loaded ({e})"
    from numba.np.ufunc import parallel
    if parallel._is_initialized:
        layer = numba.threading_layer()
        return "" if layer == "omp" else f"numba already runs its {layer!r} threading layer"
    chosen = numba.config.THREADING_LAYER
    if chosen in ("default", "omp", "threadsafe"):   # not 'safe' / 'forksafe': OpenMP is not fork-safe
        numba.config.THREADING_LAYER = "omp"
        return ""
    return f"numba's threading layer is set to {chosen!r}"


def _load() -> None:
    """Load and configure MKL (under the lock); leaves ``lib`` None and ``why_not`` set if unusable."""
    path, why = _mkl_rt()
    if path is None:
        _State.why_not = why
        return
    try:   # MKL's GNU layer loads libgomp itself and ends the process if it cannot: make sure it can
        ctypes.CDLL("libgomp.so.1")
    except OSError:
        _State.why_not = "no libgomp.so.1 (GNU OpenMP) on this system"
        return
    why = _numba_omp()
    if why:
        _State.why_not = why
        return
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        _State.why_not = f"libmkl_rt could not be loaded ({e})"
        return
    if lib.MKL_Set_Threading_Layer(_MKL_THREADING_GNU) != _MKL_THREADING_GNU:
        _State.why_not = "MKL refused its GNU OpenMP threading layer (already initialised with another?)"
        return
    branch, why = _strict_branch(lib)
    if branch is None:
        _State.why_not = why
        return
    buf = ctypes.create_string_buffer(200)
    lib.mkl_get_version_string(buf, len(buf))
    words = buf.value.decode(errors="replace").split()
    version = "MKL " + (words[words.index("Version") + 1].removesuffix("-Product") if "Version" in words else "?")
    for f in (lib.cblas_sgemm, lib.cblas_dgemm, lib.cblas_sgemm_batch_strided, lib.cblas_dgemm_batch_strided):
        f.restype = None
    _State.info = f"{version}; GNU OpenMP threads; strict CNR, {branch} branch"
    _State.lib = lib


def _strict_branch(lib):
    """Put MKL (``lib``, a loaded libmkl_rt not yet used) in strict CNR mode: ``MKL_CBWR_Set(branch |
    MKL_CBWR_STRICT)`` for each of :data:`_MKL_CBWR_STRICT_BRANCHES` in turn, MKL's automatic branch
    (``MKL_CBWR_Get_Auto_Branch``) first when it is one of them, until MKL returns MKL_CBWR_SUCCESS; the
    setting then read back with ``MKL_CBWR_Get(MKL_CBWR_ALL)`` must be the one set. Returns (the branch's
    name, '') or (None, why not: each branch with MKL's status)."""
    auto = lib.MKL_CBWR_Get_Auto_Branch()
    refused = {}
    for branch in sorted(_MKL_CBWR_STRICT_BRANCHES, key=lambda b: b != auto):   # stable: auto, then the order
        name, setting = _MKL_CBWR_STRICT_BRANCHES[branch], branch | _MKL_CBWR_STRICT
        status = lib.MKL_CBWR_Set(setting)
        if status == _MKL_CBWR_SUCCESS:
            got = lib.MKL_CBWR_Get(_MKL_CBWR_ALL)
            if got == setting:
                return name, ""
            refused[name] = f"accepted, but MKL then reports the setting {got:#x}"
        else:
            refused[name] = _MKL_CBWR_ERRORS.get(status, f"status {status}")
    if len(set(refused.values())) == 1:
        tried = f"{', '.join(refused)} branches ({next(iter(refused.values()))})"
    else:
        tried = "branches " + ", ".join(f"{k} ({v})" for k, v in refused.items())
    return None, (f"MKL refused strict reproducible mode on its {tried}; MKL offers it on Intel CPUs with "
                  f"AVX2 or AVX-512 only")


def _mkl():
    """The configured MKL library when the products go there, else None."""
    if _requested() == "numpy":
        return None
    if not _State.tried:
        with _State.lock:
            if not _State.tried:
                try:
                    _load()
                finally:   # set last: another thread never sees "tried" before the outcome
                    _State.tried = True
    if _State.lib is None and _requested() == "mkl":
        raise RuntimeError(f"{_ENV}=mkl, but MKL cannot be used: {_State.why_not}")
    return _State.lib


def backend() -> str:
    """``'mkl'`` or ``'numpy'``: where :func:`matmul` sends its products (deciding it on the first call)."""
    return "numpy" if _mkl() is None else "mkl"


def one_pool() -> bool:
    """True when the fused kernels should run their parallel builds: the products run on MKL's OpenMP
    threads in this process (not in a child forked from it)."""
    return backend() == "mkl" and not _State.forked


def describe() -> str:
    """One line for a run's record: the backend, MKL's version and mode, or why MKL is not used."""
    if backend() == "mkl":
        return f"mkl ({_State.info}{'; one thread in this forked child' if _State.forked else ''})"
    why = _State.why_not if _requested() == "auto" else f"{_ENV}=numpy"
    return f"numpy ({why})" if why else "numpy"


def notice() -> str:
    """The line to print once on the console (stderr) when the ``mkl`` package is installed but the products
    go to NumPy with ``REFOPT_GEMM=auto`` (for the reason :func:`describe` records); '' otherwise, and on
    every call after the first that returned the line. Decides the backend (:func:`backend`)."""
    if backend() == "mkl" or _requested() != "auto" or not _State.installed or _State.noticed:
        return ""
    _State.noticed = True
    return (f"refopt: the mkl package is installed but not used: {_State.why_not}. Matrix products run on "
            "NumPy's BLAS (REFOPT_GEMM=numpy chooses it and silences this line).")


def use(name: str) -> str:
    """Send the products to ``name`` (``'auto'``, ``'numpy'`` or ``'mkl'``) from now on; returns the
    previous choice. ``'mkl'`` raises RuntimeError (and changes nothing) when MKL cannot be used."""
    if _choice(name) is None or not name.strip():   # the environment's empty value means auto; use("") does not
        raise ValueError(f"use: expected one of {', '.join(_CHOICES)}, got {name!r}")
    name, previous = _choice(name), _requested()
    _State.requested = name
    try:
        backend()
    except RuntimeError:
        _State.requested = previous
        raise
    return previous


def _layout(shape, strides, item: int):
    """(CBLAS transpose flag, leading dimension) of a matrix of ``shape`` (rows, cols) and byte ``strides``
    stored row-major or as the transpose of a row-major matrix (unit stride along one axis), else None."""
    rows, cols = shape
    s0, s1 = strides
    if (s1 == item or cols == 1) and s0 % item == 0 and max(1, cols) <= s0 // item < _INT_MAX:
        return _NO_TRANS, s0 // item
    if (s0 == item or rows == 1) and s1 % item == 0 and max(1, rows) <= s1 // item < _INT_MAX:
        return _TRANS, s1 // item
    return None


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` (``np.matmul(a, b, out=out)``) for ndarrays: one product or a stack of them.

    Through MKL when :func:`backend` is ``'mkl'`` and: a (..., M, K) and b (..., K, N) are ndarrays of one
    native float32 or float64 dtype with the same leading axes (no broadcasting), each matrix with a unit
    stride on one axis (row-major or transposed views, any leading dimension), ``out`` None or (..., M, N) of
    that dtype with row-major rows (any leading dimension), writeable, not overlapping a or b, and no
    dimension 0. One matrix goes to ``cblas_?gemm``; a stack to ``cblas_?gemm_batch_strided`` over its
    longest qualifying leading axis (see :func:`_batch_axis`), one call per index of the other leading axes:
    a stack of views into a packed array (the attention heads of q k^T, read from the qkv projection) needs
    no copies, and MKL spreads the batch over its threads. Anything else (other dtypes or byte orders,
    ndarray subclasses, broadcasting, a read-only ``out``) goes to ``np.matmul``, with its rules and errors;
    there a stack's right operand that is a transposed view of a plain ndarray is first copied row-major
    (NumPy's batched product ran 1.5-2x slower on it: OpenBLAS 0.3.31, the GPT's 128 products of
    64 x 32 x 64), the same products. Returns ``out`` or a new C-contiguous array."""
    lib = (_mkl() if type(a) is np.ndarray and type(b) is np.ndarray and a.ndim == b.ndim >= 2
           and a.shape[:-2] == b.shape[:-2] else None)
    if (lib is None or a.dtype != b.dtype or a.dtype not in _DTYPES or a.shape[-1] != b.shape[-2] or 0 in a.shape
            or 0 in b.shape or max(a.shape + b.shape) >= _INT_MAX):
        return _numpy_matmul(a, b, out)
    item = a.itemsize
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    la, lb = _layout(a.shape[-2:], a.strides[-2:], item), _layout(b.shape[-2:], b.strides[-2:], item)
    if out is None:
        lc = (_NO_TRANS, N)
    else:
        lc = (type(out) is np.ndarray and out.shape == a.shape[:-2] + (M, N) and out.dtype == a.dtype
              and out.flags.writeable and not np.may_share_memory(out, a) and not np.may_share_memory(out, b)
              and _layout(out.shape[-2:], out.strides[-2:], item))
    if la is None or lb is None or not lc or lc[0] != _NO_TRANS:
        return _numpy_matmul(a, b, out)
    if out is None:
        out = np.empty(a.shape[:-2] + (M, N), a.dtype)
    scalar = ctypes.c_float if a.dtype.type is np.float32 else ctypes.c_double
    one, zero = scalar(1.0), scalar(0.0)
    if a.ndim == 2:
        gemm = lib.cblas_sgemm if a.dtype.type is np.float32 else lib.cblas_dgemm
        gemm(_ROW_MAJOR, la[0], lb[0], M, N, K, one, ctypes.c_void_p(a.ctypes.data), la[1],
             ctypes.c_void_p(b.ctypes.data), lb[1], zero, ctypes.c_void_p(out.ctypes.data), lc[1])
        return out
    batched = _batch_axis(a, b, out, M, lc[1])
    if batched is None:
        return _numpy_matmul(a, b, out)
    batch = lib.cblas_sgemm_batch_strided if a.dtype.type is np.float32 else lib.cblas_dgemm_batch_strided
    lead = a.shape[:-2]
    axis, (sa, sb, sc) = batched
    others = [k for k in range(len(lead)) if k != axis]
    for idx in np.ndindex(*(lead[k] for k in others)):
        pa, pb, pc = a.ctypes.data, b.ctypes.data, out.ctypes.data
        for k, i in zip(others, idx):
            pa, pb, pc = pa + i * a.strides[k], pb + i * b.strides[k], pc + i * out.strides[k]
        batch(_ROW_MAJOR, la[0], lb[0], M, N, K, one, ctypes.c_void_p(pa), la[1], sa, ctypes.c_void_p(pb), lb[1],
              sb, zero, ctypes.c_void_p(pc), lc[1], sc, lead[axis])
    return out


def _batch_axis(a, b, out, M: int, ldc: int):
    """(the leading axis a stack is batched over in one MKL call, the element strides of a, b and out along
    it), or None for NumPy. Every leading axis of length > 1 needs non-negative strides in a, b and out (the
    others' indices are walked in Python). The batch axis is the longest one along which a, b and out step
    by whole elements (below 2^31) and consecutive output matrices are at least M ldc elements apart (MKL
    checks that; on a violation it prints an error and returns without computing); an axis of length 1
    always qualifies."""
    item = a.itemsize
    if any(s < 0 for x in (a, b, out) for s, n in zip(x.strides[:-2], x.shape[:-2]) if n > 1):
        return None
    best = None
    for k in range(a.ndim - 2):
        if a.shape[k] == 1:
            steps = (0, 0, M * ldc)
        elif all(x.strides[k] % item == 0 for x in (a, b, out)):
            steps = tuple(x.strides[k] // item for x in (a, b, out))
        else:
            continue
        if max(steps) < _INT_MAX and steps[2] >= M * ldc and (best is None or a.shape[k] > a.shape[best[0]]):
            best = (k, steps)
    return best


def _numpy_matmul(a, b, out):
    """``np.matmul(a, b, out=out)``; a stack's right operand that is a transposed view of a plain ndarray
    copied row-major first (see :func:`matmul`; subclasses and broadcast views are passed as they are)."""
    if (type(b) is np.ndarray and b.ndim > 2 and b.shape[-1] > 1
            and b.strides[-1] > b.itemsize and b.strides[-2] == b.itemsize):
        b = np.ascontiguousarray(b)
    return np.matmul(a, b, out=out)
