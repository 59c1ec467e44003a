"""msign(backend='cuda'): the numba-CUDA kernels against the CPU msign, run in numba's CUDA simulator.

The simulator must be switched on (NUMBA_ENABLE_CUDASIM=1) before numba.cuda is first imported, and the
rest of the suite runs numba's CPU JIT in the same process; so in a normal run
``test_kernels_in_the_cuda_simulator`` runs this file's ``test_device_*`` tests again in a subprocess
with the variable set. ``REFOPT_TEST_GPU=1 python -m pytest tests/test_msign_cuda.py`` runs them on a
real GPU instead. Shapes are tiny (the simulator runs every thread as a Python thread); the small tile
geometry of ``_tiles()`` makes them span several tiles, with sizes that the tiles do not divide.
Tolerances: float64 1e-12, float32 1e-4 (two summation orders of the same float32 iteration
already differ by 2.6e-5 on a rank-3 33x50 matrix).
"""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import refopt
from refopt.linalg._msign import newton_schulz, ns_coefficients

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
IN_SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
DEVICE = IN_SIM or os.environ.get("REFOPT_TEST_GPU") == "1"
needs_numba_cuda = pytest.mark.skipif(not HAVE_NUMBA_CUDA, reason='numba-cuda not installed (pip install ".[cuda]")')
device = pytest.mark.skipif(not (DEVICE and HAVE_NUMBA_CUDA),
                            reason="device test: runs in the simulator subprocess (or REFOPT_TEST_GPU=1)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = {np.float64: 1e-12, np.float32: 1e-4}


# ---- in the main process: no simulator, no GPU needed -------------------------------------------------
@pytest.mark.skipif(DEVICE, reason="the subprocess runner itself")
@needs_numba_cuda
def test_kernels_in_the_cuda_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("REFOPT_TEST_GPU", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "test_device_",
                        __file__],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert " passed" in last and "skipped" not in last and "failed" not in last, r.stdout[-2000:]


# Compiles every kernel for a GPU (cc 9.0) through numba-cuda's front end -- typing and lowering to LLVM
# IR, which the simulator (plain Python) never exercises -- and stops where NVVM would take over (no GPU
# driver or toolkit needed), for both dtypes and for the small geometry too. Prints, per kernel, the
# float64 arithmetic ops in its IR.
_FRONT_END = r"""
import re, sys
import numba.cuda.dispatcher as D
import numba.cuda.cudadrv.nvrtc as NR
import numba.cuda.cudadrv.nvvm as NV
from numba import boolean, cuda, float32, float64, int32, int64

class _Dev:
    compute_capability = (9, 0)

class Lowered(Exception):
    pass

def _stop(ir, *a, **k):
    txt = "\n".join(map(str, ir)) if isinstance(ir, (list, tuple)) else str(ir)
    raise Lowered(len(re.findall(r"f(add|sub|mul|div) double", txt)))

D.get_current_device = lambda: _Dev()
NR.find_closest_arch = lambda cc: cc
NV.compile_ir = NV.llvm_to_ptx = _stop
from refopt.fast import cuda_kernels as K
for dt, name, tiles in [(float32, "float32", (128, 8, 8, 256)), (float64, "float64", (128, 8, 8, 256)),
                        (float32, "small", (64, 8, 4, 256))]:
    k = K.build("float32" if name == "small" else name, *tiles)
    A3, M, V = dt[:, :, ::1], dt[:, ::1], dt[::1]
    sigs = {"syrk": (A3, A3, A3, dt, dt, dt, int32[:, ::1]), "gemm": (A3, A3, A3),
            "absmax_partial": (A3, M, int32[::1]), "sumsq_partial": (A3, V, M), "reduce_final": (M, V, boolean),
            "denominators": (V, V, V, V, int64, dt, dt), "scale": (A3, V, V, A3, boolean),
            "transpose": (A3, A3), "nonfinite": (A3, int32[::1])}
    for kn, sig in sigs.items():
        try:
            cuda.compile_ptx(k[kn].py_func, sig, cc=(9, 0))
        except Lowered as e:
            print(name, kn, e.args[0])
"""


@pytest.mark.skipif(DEVICE, reason="runs in the main process")
@needs_numba_cuda
def test_kernels_type_and_lower_for_a_gpu_and_float32_stays_float32():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    r = subprocess.run([sys.executable, "-c", _FRONT_END], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    got = dict(((ln.split()[0], ln.split()[1]), int(ln.split()[2])) for ln in r.stdout.split("\n") if ln.strip())
    assert len(got) == 27, r.stdout + r.stderr[-3000:]
    assert all(v == 0 for (dt, _), v in got.items() if dt != "float64"), got      # no float64 arithmetic
    assert got[("float64", "syrk")] > 0                                            # (the count works)


def test_importing_refopt_does_not_import_numba_cuda():
    code = "import sys, refopt; refopt.msign(__import__('numpy').eye(2)); print('numba.cuda' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_cuda_backend_without_numba_cuda_says_what_to_install(monkeypatch):
    from refopt.fast import msign_cuda
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba_cuda" else real(name, *a))
    with pytest.raises(ImportError, match=r'pip install "refopt\[cuda\]"'):
        refopt.msign(np.eye(3), backend="cuda")
    with pytest.raises(ImportError, match=r'pip install "refopt\[cuda\]"'):
        newton_schulz(np.eye(3), ns_coefficients("jordan", 5), backend="cuda")
    assert msign_cuda.INSTALL_HINT == 'pip install "refopt[cuda]"'


def test_auto_tiles_fills_the_gpu():
    from refopt.fast.msign_cuda import DEFAULT_TILES, SMALL_TILES, auto_tiles
    assert auto_tiles(4096, 4096) == auto_tiles(16384, 4096) == DEFAULT_TILES     # 1024 blocks of 128^2
    assert auto_tiles(1024, 1024) == auto_tiles(768, 3072) == SMALL_TILES        # 64 / 144 blocks: too few
    assert auto_tiles(1024, 1024, batch=8) == DEFAULT_TILES


@pytest.mark.parametrize("kw", [{"backend": "gpu"}, {"backend": None}, {"backend": "cuda", "method": "svd"},
                                {"stack": 1}])
def test_bad_backend_options_raise_valueerror(kw):
    with pytest.raises(ValueError):
        refopt.msign(np.eye(3), **kw)


# ---- the CPU path: symmetric products and stacks ------------------------------------------------------
def plain_ns(X, rows):
    """The textbook iteration on a normalised wide X: A = X X^T; X = a X + (b A + c A A) X."""
    for a, b, c in rows:
        A = X @ X.T
        X = a * X + (b * A + c * (A @ A)) @ X
    return X


@pytest.mark.parametrize("shape", [(33, 50), (50, 33), (1, 9), (17, 17)])
def test_cpu_symmetric_form_equals_the_plain_iteration(shape):
    rng = np.random.default_rng(11)
    G = rng.standard_normal((shape[0], 3)) @ rng.standard_normal((3, shape[1])) if shape == (33, 50) \
        else rng.standard_normal(shape)
    rows = ns_coefficients("jordan", 5)
    tall = shape[0] > shape[1]
    X0 = (G.T if tall else G) / np.linalg.norm(G)
    want = plain_ns(X0, rows)
    got = refopt.msign(G)
    np.testing.assert_allclose(got.T if tall else got, want, rtol=0, atol=1e-12)
    # negative control: one step fewer is far away
    assert np.abs(plain_ns(X0, rows[:4]) - want).max() > 1e-3


def test_cpu_stack_is_each_matrix_on_its_own():
    rng = np.random.default_rng(12)
    G = rng.standard_normal((2, 3, 4, 6))
    G[1, 2] = 0.0
    for kw in [{}, {"method": "svd"}, {"eps_mode": "add", "norm_eps": 1e-3}, {"coeffs": "polar_express", "steps": 8}]:
        out = refopt.msign(G, stack=True, **kw)
        assert out.shape == G.shape and out.dtype == G.dtype
        for i in np.ndindex(2, 3):
            np.testing.assert_array_equal(out[i], refopt.msign(G[i], **kw))
    assert not np.any(refopt.msign(G, stack=True)[1, 2])
    # tall matrices in a stack, float32 stays float32
    T32 = rng.standard_normal((3, 7, 2)).astype(np.float32)
    out = refopt.msign(T32, stack=True)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out[1], refopt.msign(T32[1]))
    with pytest.raises(ValueError, match="stack=True"):
        refopt.msign(G)
    with pytest.raises(ValueError, match="ndim"):
        refopt.msign(np.ones(3), stack=True)


# ---- device tests (simulator subprocess, or a GPU with REFOPT_TEST_GPU=1) -----------------------------
def _mc():
    from refopt.fast import msign_cuda
    return msign_cuda


def _tiles():
    """8 x 8 tiles, 4-deep slabs, 2 x 2 per thread: 16 threads a block, fast in the simulator."""
    return _mc().Tiles(bm=8, bk=4, tm=2, red=16, red_blocks=2)


def _cases():
    rng = np.random.default_rng(13)
    low = rng.standard_normal((11, 2)) @ rng.standard_normal((2, 13))          # rank 2
    return {"1x6": rng.standard_normal((1, 6)), "6x1": rng.standard_normal((6, 1)),
            "9x13 odd": rng.standard_normal((9, 13)), "13x9 tall": rng.standard_normal((13, 9)),
            "11x13 rank 2": low, "zero 5x7": np.zeros((5, 7)), "1x1": np.array([[-3.0]])}


@device
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_device_msign_matches_cpu(dtype):
    mc = _mc()
    schedules = {"9x13 odd": [("jordan", 5)], "11x13 rank 2": [("jordan", 5)], "13x9 tall": [("polar_express", 3)]}
    for name, G in _cases().items():
        G = G.astype(dtype)
        for coeffs, steps in schedules.get(name, [("jordan", 2)]):
            rows = ns_coefficients(coeffs, steps)
            got = mc.msign_cuda(G, rows, tiles=_tiles())
            want = refopt.msign(G, coeffs=coeffs, steps=steps)
            assert got.dtype == dtype and got.shape == G.shape, name
            np.testing.assert_allclose(got, want, rtol=0, atol=TOL[dtype], err_msg=name)
            if name.startswith("zero"):
                assert not np.any(got)


@device
def test_device_peer_normalisations_and_norm_factor():
    mc = _mc()
    G = np.random.default_rng(14).standard_normal((5, 10))
    rows = ns_coefficients("jordan", 3)
    for kw in [{"eps_mode": "add", "norm_eps": 1e-3}, {"eps_mode": "clamp", "norm_eps": 1e3},
               {"norm_factor": 1.01}]:
        want = refopt.msign(G, steps=3, **kw)
        got = mc.msign_cuda(G, rows, kw.get("eps_mode", "none"), kw.get("norm_eps", 0.0),
                            kw.get("norm_factor", 1.0), tiles=_tiles())
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=str(kw))
    # scale invariance of the exact normalisation, through the device reductions (no overflow)
    np.testing.assert_allclose(mc.msign_cuda(1e300 * G, rows, tiles=_tiles()), refopt.msign(G, steps=3), atol=1e-12)


@device
def test_device_stack_and_device_arrays_in_and_out():
    from numba import cuda
    mc = _mc()
    rng = np.random.default_rng(15)
    G = rng.standard_normal((2, 2, 3, 10)).astype(np.float32)
    G[0, 1] = 0
    rows = ns_coefficients("jordan", 2)
    want = refopt.msign(G, steps=2, stack=True)
    got = mc.msign_cuda(G, rows, stack=True, tiles=_tiles())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    d = mc.msign_cuda(cuda.to_device(G), rows, stack=True, tiles=_tiles())
    assert not isinstance(d, np.ndarray) and d.shape == G.shape
    np.testing.assert_allclose(d.copy_to_host(), want, rtol=0, atol=1e-4)
    # the public entry point, default geometry, on a device array
    d1 = refopt.msign(cuda.to_device(G[1, 0]), steps=2, backend="cuda")
    np.testing.assert_allclose(d1.copy_to_host(), want[1, 0], rtol=0, atol=1e-4)


@device
def test_device_syrk_computes_one_triangle_and_mirrors_it():
    from numba import cuda
    mc = _mc()
    t = _tiles()
    X = np.random.default_rng(16).standard_normal((1, 19, 7))       # T = 3 tiles a side (8, 8, 3 rows)
    T = 3
    log = cuda.to_device(np.zeros((T, T), np.int32))
    C = cuda.to_device(np.full((1, 19, 19), np.nan))
    mc.syrk(cuda.to_device(X), C, tiles=t, log=log)
    C = C.copy_to_host()[0]
    counts = log.copy_to_host()
    np.testing.assert_array_equal(counts, np.triu(np.ones((T, T), np.int32)))   # each upper tile once
    assert counts.sum() == T * (T + 1) // 2 < T * T                            # the lower ones never
    np.testing.assert_array_equal(C, C.T)                                       # exactly symmetric, all written
    np.testing.assert_allclose(C, X[0] @ X[0].T, rtol=0, atol=1e-12)
    # the fused polynomial epilogue: P = c A A^T + b A + a I
    A = cuda.to_device(C[None])
    P = cuda.device_array((1, 19, 19))
    mc.syrk(A, P, alpha=2.0, beta=-3.0, D=A, diag=0.5, tiles=t)
    np.testing.assert_allclose(P.copy_to_host()[0], 2 * C @ C - 3 * C + 0.5 * np.eye(19), rtol=0, atol=1e-11)


@device
@pytest.mark.parametrize("tiles", ["small", "default"])
def test_device_gemm_kernel(tiles):
    from numba import cuda
    mc = _mc()
    t = _tiles() if tiles == "small" else mc.DEFAULT_TILES
    rng = np.random.default_rng(17)
    for m, k, n in [(9, 5, 11), (1, 3, 1), (3, 9, 2)]:
        P, X = rng.standard_normal((2, m, k)), rng.standard_normal((2, k, n))
        Y = mc.gemm(cuda.to_device(P), cuda.to_device(X), cuda.device_array((2, m, n)), tiles=t)
        np.testing.assert_allclose(Y.copy_to_host(), P @ X, rtol=0, atol=1e-13)
    Y32 = mc.gemm(cuda.to_device(P.astype(np.float32)), cuda.to_device(X.astype(np.float32)),
                  cuda.device_array((2, m, n), np.float32), tiles=t).copy_to_host()
    assert Y32.dtype == np.float32
    np.testing.assert_allclose(Y32, P @ X, rtol=0, atol=1e-5)


@device
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_device_bad_inputs():  # (the simulator computes in numpy scalars: the diverging case warns there)
    from numba import cuda
    mc = _mc()
    rows = ns_coefficients("jordan", 2)
    bad = np.ones((3, 4))
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="nan or inf"):
        mc.msign_cuda(bad, rows, tiles=_tiles())
    bad[1, 2] = np.inf
    with pytest.raises(ValueError, match="nan or inf"):
        mc.msign_cuda(cuda.to_device(bad), rows, tiles=_tiles())      # found by the device reduction
    with pytest.raises(FloatingPointError, match="diverge"):
        mc.msign_cuda(np.array([[1.0, 0.2], [0.0, 0.5]]), ns_coefficients((100.0, 100.0, 100.0), 10), tiles=_tiles())
    for G in [np.ones((2, 2), np.int64), np.ones((2, 2, 2)), [[1.0]]]:
        with pytest.raises(ValueError):
            refopt.msign(G, backend="cuda")
    assert refopt.msign(np.zeros((0, 3), np.float32), backend="cuda").shape == (0, 3)
