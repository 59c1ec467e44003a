"""refopt.fast.blas: the autograd's products and stacks of products through MKL (when the ``mkl`` extra is
installed) or NumPy.

Every layout the autograd passes (row-major, transposed views, column slices, a given ``out``; stacks of
attention heads read from a packed array and written through head-merging views) against the
classical elementwise bound of a dot product in floating point, |fl(AB) - AB| <= K u |A||B| (u the unit
roundoff), with AB from an exact rational oracle; a deliberately wrong transpose flag the bound catches;
an output stride MKL's batched product refuses (it prints an error and computes nothing) avoided, and
caught when not avoided;
the fallbacks behave as ``np.matmul``; the GPT's gradients with MKL against NumPy's on every configuration
(float64 within 1e-12, float32 within 1e-5 of the leaf's largest entry); MKL's products and the fused
kernels give the same bits on one thread and on two; the choice through REFOPT_GEMM and ``use``."""
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

import refopt
from refopt.autograd import value_and_grad
from refopt.fast import autograd_kernels, blas
from refopt.models import gpt

HAVE_MKL = blas._mkl_rt()[0] is not None and blas.backend() == "mkl"
needs_mkl = pytest.mark.skipif(not HAVE_MKL, reason=f"MKL not used here: {blas.describe()}")
BACKENDS = ["numpy"] + (["mkl"] if HAVE_MKL else [])
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def backend(request):
    previous = blas.use(request.param)
    yield request.param
    blas.use(previous)


def exact_product(a, b):
    """AB in exact rational arithmetic (the oracle), rounded to float64 at the end, and |A||B|."""
    fa = [[Fraction(float(v)) for v in row] for row in a]
    fb = [[Fraction(float(v)) for v in row] for row in b]
    K = len(fb)
    ab = np.array([[float(sum(fa[i][k] * fb[k][j] for k in range(K))) for j in range(len(fb[0]))]
                   for i in range(len(fa))])
    return ab, np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))


def within_bound(c, a, b):
    ab, mag = exact_product(a, b)
    u = np.finfo(a.dtype).eps / 2
    K = a.shape[1]
    err = np.abs(c.astype(np.float64) - ab)
    return bool(np.all(err <= K * u * mag * 1.0001 + 1e-300)), float(np.max(err / (u * mag + 1e-300)))


def layouts(rng, M, K, dtype):
    """(name, 2-D array of shape (M, K)) in each storage the autograd produces, plus odd ones."""
    base = rng.standard_normal((M, K)).astype(dtype)
    wide = np.zeros((M, K + 5), dtype)
    wide[:, 2:K + 2] = base
    tall = np.zeros((K + 3, M), dtype)
    tall[1:K + 1] = base.T
    return [("C", base), ("F", np.asfortranarray(base)), ("transposed view", base.T.copy().T),
            ("column slice", wide[:, 2:K + 2]), ("transposed slice", tall[1:K + 1].T),
            ("strided (fallback)", np.repeat(base, 2, axis=1)[:, ::2])]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_of_every_layout_within_the_rounding_bound(backend, dtype):
    rng = np.random.default_rng(0)
    M, K, N = 7, 13, 5
    for (na, a), (nb, b) in [(x, y) for x in layouts(rng, M, K, dtype) for y in layouts(rng, K, N, dtype)]:
        expect = np.array(a, copy=True), np.array(b, copy=True)
        c = blas.matmul(a, b)
        assert c.shape == (M, N) and c.dtype == dtype and c.flags.c_contiguous, (na, nb)
        ok, worst = within_bound(c, a, b)
        assert ok, f"{backend} {np.dtype(dtype).name}: a {na}, b {nb}: error {worst:.3g} u |A||B|"
        np.testing.assert_array_equal(a, expect[0])   # the inputs are not written
        np.testing.assert_array_equal(b, expect[1])
        out = np.full((M, N), np.nan, dtype)
        assert blas.matmul(a, b, out=out) is out
        np.testing.assert_array_equal(out, c)
        col = np.full((N, M), np.nan, dtype).T              # an `out` that is not C-contiguous: NumPy's path
        assert blas.matmul(a, b, out=col) is col
        assert within_bound(col, a, b)[0]


@needs_mkl
def test_a_wrong_transpose_flag_breaks_the_bound(monkeypatch):
    """Negative control: with the transposed views' flag reported as not transposed, the products of
    square matrices (same shape either way) are wrong, and the bound above catches it."""
    real = blas._layout

    def wrong(shape, strides, item):
        flag, ld = real(shape, strides, item)
        return blas._NO_TRANS, ld

    monkeypatch.setattr(blas, "_layout", wrong)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 6))
    b = rng.standard_normal((6, 6))
    assert within_bound(blas.matmul(a, b), a, b)[0]           # row-major operands: unaffected
    assert not within_bound(blas.matmul(a.T, b), a.T, b)[0]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_everything_else_goes_to_numpy_with_its_errors(backend):
    rng = np.random.default_rng(2)
    a3, b2 = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    np.testing.assert_array_equal(blas.matmul(a3, b2), np.matmul(a3, b2))    # broadcasting
    with pytest.raises(ValueError, match="broadcast"):                     # NumPy's error, from NumPy
        blas.matmul(a3, rng.standard_normal((3, 4, 5)))
    v = rng.standard_normal(4)
    np.testing.assert_array_equal(blas.matmul(v, b2), v @ b2)
    ai, bi = np.arange(12).reshape(3, 4), np.arange(8).reshape(4, 2)
    np.testing.assert_array_equal(blas.matmul(ai, bi), ai @ bi)
    a32 = rng.standard_normal((3, 4)).astype(np.float32)
    got = blas.matmul(a32, b2)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, a32 @ b2)
    np.testing.assert_array_equal(blas.matmul(np.zeros((3, 0)), np.zeros((0, 2))), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="mismatch"):
        blas.matmul(rng.standard_normal((3, 4)), rng.standard_normal((5, 2)))
    sq = rng.standard_normal((4, 4))
    expect = sq @ sq
    blas.matmul(sq, sq.copy(), out=sq)                     # out is an input: NumPy handles the overlap
    np.testing.assert_array_equal(sq, expect)


def stacks(rng, lead, M, K, dtype):
    """(name, array of shape lead + (M, K)) in the storages attention and other stacks produce."""
    base = rng.standard_normal(lead + (M, K)).astype(dtype)
    packed = np.zeros(lead[:1] + (M, 3) + lead[1:] + (K,), dtype)     # heads of a packed (B, T, 3, H, hs)
    packed[:, :, 1] = np.moveaxis(base, -2, 1)
    wide = np.zeros(lead + (M, K + 4), dtype)
    wide[..., 1:K + 1] = base
    return [("C", base), ("transposed view", np.ascontiguousarray(np.swapaxes(base, -1, -2)).swapaxes(-1, -2)),
            ("heads of a packed array", np.moveaxis(packed[:, :, 1], 1, -2)), ("column slice", wide[..., 1:K + 1]),
            ("reversed batch (fallback)", base[::-1].copy()[::-1]),
            ("broadcast batch", np.broadcast_to(base[:1], base.shape))]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stacks_of_every_layout_within_the_rounding_bound(backend, dtype):
    """Stacks (MKL: ?gemm_batch_strided over the longest leading axis, the others walked), each matrix of
    the result against the exact oracle; the heads-merging ``out`` views attention writes through."""
    rng = np.random.default_rng(5)
    lead, M, K, N = (3, 2), 4, 5, 3
    for (na, a), (nb, b) in [(x, y) for x in stacks(rng, lead, M, K, dtype) for y in stacks(rng, lead, K, N, dtype)]:
        c = blas.matmul(a, b)
        assert c.shape == lead + (M, N) and c.dtype == dtype and c.flags.c_contiguous, (na, nb)
        merged = np.full((lead[0], M, lead[1], N), np.nan, dtype)     # (B, T, H, hs) written as (B, H, T, hs)
        view = merged.transpose(0, 2, 1, 3)
        assert blas.matmul(a, b, out=view) is view
        for i in np.ndindex(*lead):
            ok, worst = within_bound(c[i], a[i], b[i])
            assert ok, f"{backend} {np.dtype(dtype).name}: a {na}, b {nb}, matrix {i}: error {worst:.3g} u |A||B|"
            np.testing.assert_array_equal(merged[i[0], :, i[1]], c[i])


def _interleaved_out(M, N, lead):
    """An ``out`` stack whose matrices interleave along its longest leading axis (row stride lead * N):
    consecutive matrices are N elements apart, less than the M ldc MKL requires of one batch."""
    buf = np.full((M, lead * N), np.nan)
    return buf, buf.reshape(M, lead, N).transpose(1, 0, 2)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_stack_mkl_would_refuse_goes_elsewhere(backend, capfd):
    """Interleaved output matrices along the batch axis: MKL's ?gemm_batch_strided rejects such a stride
    (it prints an error and computes nothing), so the product takes another axis or NumPy: right values,
    nothing printed."""
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((5, 3, 4)), rng.standard_normal((5, 4, 2))
    buf, out = _interleaved_out(3, 2, 5)
    assert blas.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-14, atol=1e-14)
    assert "MKL" not in "".join(capfd.readouterr())


@needs_mkl
def test_without_the_stride_check_mkl_computes_nothing(monkeypatch, capfd):
    """Negative control for the check above: batched along the interleaved axis anyway, MKL refuses the
    output stride, writes nothing and prints so; the result is wrong."""
    def anyway(a, b, out, M, ldc):
        return 0, tuple(x.strides[0] // x.itemsize for x in (a, b, out))

    monkeypatch.setattr(blas, "_batch_axis", anyway)
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((5, 3, 4)), rng.standard_normal((5, 4, 2))
    buf, out = _interleaved_out(3, 2, 5)
    blas.matmul(a, b, out=out)
    assert np.isnan(out).all()
    assert "Parameter 17 was incorrect" in "".join(capfd.readouterr())


def _gpt_grads(cfg, dtype):
    p = gpt.init(cfg, 0, dtype)
    r = np.random.default_rng(3)
    x, y = r.integers(0, cfg.vocab_size, (4, cfg.block_size)), r.integers(0, cfg.vocab_size, (4, cfg.block_size))
    v, g = value_and_grad(lambda p: gpt.loss(p, x, y, cfg))(p)
    leaves, paths, _ = refopt.tree.flatten(g)
    return v, dict(zip(paths, leaves))


CONFIGS = [dict(), dict(qk_norm=True), dict(tie_head=False), dict(ffn="reglu"), dict(ffn="gelu")]


@needs_mkl
@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: ",".join(kw) or "default")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpt_gradients_with_mkl_match_numpy(kw, dtype):
    cfg = gpt.GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=32, **kw)
    previous = blas.use("numpy")
    try:
        v0, g0 = _gpt_grads(cfg, dtype)
        blas.use("mkl")
        v1, g1 = _gpt_grads(cfg, dtype)
    finally:
        blas.use(previous)
    tol = {np.float64: 1e-12, np.float32: 1e-5}[dtype]
    assert abs(v1 - v0) <= tol * abs(v0)
    for k in g0:
        assert g1[k].dtype == dtype
        scale = np.max(np.abs(g0[k]))
        assert np.max(np.abs(g1[k] - g0[k])) <= tol * scale, k


_THREADS = """
import sys, numpy as np
sys.path[:0] = [{root!r}]
import numba, refopt
from refopt.fast import blas
from refopt.autograd import value_and_grad
from refopt.models import gpt
assert blas.backend() == "mkl"
cfg = gpt.GPTConfig(vocab_size=29, block_size=32, n_layer=2, n_head=2, n_embd=64, qk_norm=True)
p = gpt.init(cfg, 0, np.float32)
r = np.random.default_rng(3)
x, y = r.integers(0, 29, (16, 32)), r.integers(0, 29, (16, 32))
tall_a, tall_b = r.standard_normal((2, 200000)).astype(np.float32), r.standard_normal((200000, 2)).astype(np.float32)
out = {{}}
for n in (1, 2):
    blas._State.lib.MKL_Set_Num_Threads(n)
    numba.set_num_threads(n)
    v, g = value_and_grad(lambda p: gpt.loss(p, x, y, cfg))(p)
    leaves, paths, _ = refopt.tree.flatten(g)
    out.update({{f"{{n}}:{{k}}": a for k, a in zip(paths, leaves)}}, **{{f"{{n}}:loss": np.asarray(v)}})
    out[f"{{n}}:tall"] = blas.matmul(tall_a, tall_b)
assert numba.threading_layer() == "omp"
np.savez({path!r}, **out)
"""


@needs_mkl
def test_mkl_step_same_bits_on_one_thread_and_on_two(tmp_path):
    """MKL's strict reproducible mode and the fused kernels' parallel builds: the loss and every gradient
    of a GPT are the same bits on one thread and on two (a subprocess with two threads available); so is a
    float32 product of (2 x 200000) and (200000 x 2), whose long inner dimension MKL splits over threads
    where strict mode is not in force (its bits changed with the thread count under AUTO | STRICT, which MKL
    accepts on an AMD EPYC but does not honour)."""
    path = str(tmp_path / "g.npz")
    env = dict(os.environ, NUMBA_NUM_THREADS="2", OMP_NUM_THREADS="2", REFOPT_GEMM="mkl")
    subprocess.run([sys.executable, "-c", _THREADS.format(root=ROOT, path=path)], env=env, check=True, timeout=600)
    got = np.load(path)
    assert got["1:loss"] == got["2:loss"]
    for k in got.files:
        if k.startswith("1:"):
            np.testing.assert_array_equal(got[k], got["2:" + k[2:]], err_msg=k)


def test_choice_through_use_and_the_environment(monkeypatch):
    with pytest.raises(ValueError, match="expected one of auto, numpy, mkl"):
        blas.use("openblas")
    previous = blas.use("numpy")
    try:
        assert blas.backend() == "numpy" and blas.describe() == "numpy (REFOPT_GEMM=numpy)"
        assert autograd_kernels.blas.backend() == "numpy"
    finally:
        blas.use(previous)
    # MKL asked for but unusable: an error naming why, and the previous choice kept
    monkeypatch.setattr(blas._State, "tried", True)
    monkeypatch.setattr(blas._State, "lib", None)
    monkeypatch.setattr(blas._State, "why_not", "the mkl package is not installed")
    before = blas._requested()
    with pytest.raises(RuntimeError, match="MKL cannot be used: the mkl package is not installed"):
        blas.use("mkl")
    assert blas._requested() == before
    for value, expect in [("bogus", "REFOPT_GEMM='bogus': expected one of auto, numpy, mkl"),
                          ("numpy", "numpy (REFOPT_GEMM=numpy)")]:
        run = subprocess.run([sys.executable, "-c", "from refopt.fast import blas; print(blas.describe())"],
                             env=dict(os.environ, REFOPT_GEMM=value, PYTHONPATH=ROOT), capture_output=True,
                             text=True, timeout=300)
        assert expect in run.stdout + run.stderr, run.stderr


@needs_mkl
def test_a_numba_on_another_threading_layer_keeps_numpy(tmp_path):
    """MKL's threads and numba's must be one OpenMP pool: with numba set to its workqueue layer, 'auto'
    falls back to NumPy and says why, and 'mkl' is an error naming the reason; the products still run."""
    code = ("import numpy as np; from refopt.fast import blas; print(blas.describe()); "
            "a = np.ones((3, 4)); print(blas.matmul(a, a.T)[0, 0])")
    for gemm in ("auto", "mkl"):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, REFOPT_GEMM=gemm, NUMBA_THREADING_LAYER="workqueue",
                                      PYTHONPATH=ROOT))
        if gemm == "auto":
            assert run.returncode == 0, run.stderr
            assert run.stdout.split("\n")[:2] == [
                "numpy (numba's threading layer is set to 'workqueue')", "4.0"], run.stdout
        else:
            assert run.returncode != 0
            assert ("RuntimeError: REFOPT_GEMM=mkl, but MKL cannot be used: numba's threading layer is set to "
                    "'workqueue'") in run.stderr


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_inputs_mkl_must_not_take_go_to_numpy(backend):
    """A read-only ``out`` raises NumPy's error and is not written; non-native byte order and ndarray
    subclasses get NumPy's results (MKL would read swapped bytes, or drop the subclass)."""
    a = np.arange(6.0).reshape(2, 3)
    b = np.ones((3, 2))
    frozen = np.zeros((2, 2))
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        blas.matmul(a, b, out=frozen)
    np.testing.assert_array_equal(frozen, 0)
    for dt in (">f8", ">f4"):
        got = blas.matmul(a.astype(dt), b.astype(dt))
        np.testing.assert_array_equal(got, [[3, 3], [12, 12]])

    class Sub(np.ndarray):
        pass

    assert type(blas.matmul(a.view(Sub), b)) is Sub
    rng = np.random.default_rng(7)                           # a stack's transposed right operand: not copied
    a3, bt = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 2, 5)).swapaxes(-1, -2)
    assert type(blas.matmul(a3, bt.view(Sub))) is Sub       # (the copy NumPy's path makes would drop the type)


def test_use_takes_the_names_as_the_environment_does():
    previous = blas.use(" NumPy ")
    try:
        assert blas.backend() == "numpy"
    finally:
        blas.use(previous)


_FORK = """
import sys, multiprocessing as mp, numpy as np
sys.path[:0] = [{root!r}]
from refopt.fast import blas
from refopt.fast import autograd_kernels
from refopt.models import gpt
cfg = gpt.GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=64)
p = gpt.init(cfg, 0, np.float32)
r = np.random.default_rng(3)
x, y = r.integers(0, 29, (16, 16)), r.integers(0, 29, (16, 16))
def loss(_):
    return float(gpt.loss(p, x, y, cfg)), blas.describe(), blas.one_pool()
parent = loss(0)
assert parent[1].startswith("mkl") and parent[2], parent
with mp.get_context("fork").Pool(2) as pool:
    children = pool.map(loss, range(2))
for c in children:
    assert c[0] == parent[0], (c, parent)
    assert c[1].endswith("one thread in this forked child)") and not c[2], c
print("ok")
"""


@needs_mkl
def test_a_child_forked_after_mkl_ran_computes_the_same_bits():
    """GNU OpenMP's threads do not survive fork: without care a forked child calling MKL hangs. A child
    forked after MKL ran runs it on one thread and the fused kernels serially: the parent's loss, bit for
    bit, and no hang (the subprocess has a time limit)."""
    run = subprocess.run([sys.executable, "-c", _FORK.format(root=ROOT)], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, REFOPT_GEMM="mkl", OMP_NUM_THREADS="2"))
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_cli_bad_refopt_gemm_is_a_user_error_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from refopt.cli import main
    monkeypatch.setenv("REFOPT_GEMM", "bogus")
    monkeypatch.setattr(blas._State, "requested", None)
    out = tmp_path / "run"
    tiny = ["--model", "mlp", "--steps", "3", "--hidden", "8", "--no-progress"]
    assert main(["train", "--out", str(out), *tiny]) == 2
    assert main(["compare", "--out", str(out), "--optimizers", "sgd", *tiny]) == 2
    err = capsys.readouterr().err
    assert err.count("error: REFOPT_GEMM='bogus': expected one of auto, numpy, mkl") == 2, err
    assert not out.exists()


@needs_mkl
def test_resuming_on_another_blas_warns_and_records_both(tmp_path, capsys):
    import json

    from refopt.cli import main
    out = tmp_path / "run"
    tiny = ["--model", "mlp", "--steps", "6", "--hidden", "8", "--no-progress"]
    previous = blas.use("mkl")
    try:
        assert main(["train", "--out", str(out), "--stop-after", "3", *tiny]) == 0
        blas.use("numpy")
        assert main(["train", "--resume", str(out)]) == 0
    finally:
        blas.use(previous)
    assert "warning: the run was started with matrix products 'mkl (" in capsys.readouterr().err
    products = json.loads((out / "config.json").read_text())["matrix_products"]
    assert products.startswith("mkl (") and products.endswith(", then from step 4: numpy (REFOPT_GEMM=numpy)")


class _FakeMKL:
    """The CNR calls of libmkl_rt as a test double: MKL_CBWR_Set accepts the settings in ``accepts``
    (returning MKL_CBWR_SUCCESS, else MKL_CBWR_ERR_UNSUPPORTED_BRANCH) and records every call."""

    def __init__(self, auto, accepts, reports=None):
        self.auto, self.accepts, self.reports, self.calls, self.setting = auto, accepts, reports, [], 1

    def MKL_CBWR_Get_Auto_Branch(self):
        return self.auto

    def MKL_CBWR_Set(self, setting):
        self.calls.append(setting)
        if setting not in self.accepts:
            return -3
        self.setting = setting
        return 0

    def MKL_CBWR_Get(self, option):
        assert option == -1
        return self.setting if self.reports is None else self.reports


STRICT = 0x10000


@pytest.mark.parametrize("auto, accepts, branch, calls", [
    (12, {12 | STRICT, 10 | STRICT}, "AVX512", [12 | STRICT]),              # an AVX-512 Xeon: its own branch
    (14, {14 | STRICT}, "AVX512_E1", [14 | STRICT]),
    (10, {10 | STRICT}, "AVX2", [10 | STRICT]),                               # an AVX2 Intel CPU
    (2, {10 | STRICT}, "AVX2", [14 | STRICT, 12 | STRICT, 10 | STRICT]),     # auto branch not a strict one
    (2, {2 | STRICT, 3 | STRICT}, None, [14 | STRICT, 12 | STRICT, 10 | STRICT]),   # MKL on an AMD CPU
])
def test_strict_branch_tries_the_named_branches(auto, accepts, branch, calls):
    """MKL_CBWR_Set(branch | MKL_CBWR_STRICT) for AVX512_E1 (14), AVX512 (12), AVX2 (10), MKL's automatic
    branch first when it is one of them, until MKL returns MKL_CBWR_SUCCESS; never AUTO (2) or COMPATIBLE (3)
    with the strict flag, which MKL accepts on an AMD CPU but does not honour (negative control: the fake
    accepts them, and they are not taken)."""
    lib = _FakeMKL(auto, accepts)
    got, why = blas._strict_branch(lib)
    assert (got, lib.calls) == (branch, calls)
    if branch is None:
        assert why == ("MKL refused strict reproducible mode on its AVX512_E1, AVX512, AVX2 branches "
                       "(MKL_CBWR_ERR_UNSUPPORTED_BRANCH); MKL offers it on Intel CPUs with AVX2 or AVX-512 only")
    else:
        assert why == "" and lib.setting == calls[-1]


def test_strict_branch_checks_the_setting_is_in_force():
    """MKL_CBWR_Set returning success is not enough: the setting read back (MKL_CBWR_Get(MKL_CBWR_ALL)) must
    carry the branch and the strict flag."""
    lib = _FakeMKL(12, {12 | STRICT, 10 | STRICT}, reports=12)       # strict flag dropped
    got, why = blas._strict_branch(lib)
    assert got is None and "AVX512 (accepted, but MKL then reports the setting 0xc)" in why, why
    assert blas._strict_branch(_FakeMKL(12, {12 | STRICT, 10 | STRICT}, reports=12 | STRICT)) == ("AVX512", "")


def _unused_mkl(monkeypatch, installed=True, requested="auto"):
    """The state of refopt.fast.blas where the mkl package is installed but refused (or not installed)."""
    for k, v in dict(requested=requested, tried=True, lib=None, installed=installed, noticed=False,
                     why_not="MKL refused it here").items():
        monkeypatch.setattr(blas._State, k, v)


def test_notice_is_one_line_once_and_only_where_mkl_is_installed(monkeypatch):
    _unused_mkl(monkeypatch)
    line = blas.notice()
    assert line == ("refopt: the mkl package is installed but not used: MKL refused it here. Matrix products run "
                    "on NumPy's BLAS (REFOPT_GEMM=numpy chooses it and silences this line).")
    assert blas.notice() == ""                              # once per process
    _unused_mkl(monkeypatch, installed=False)                # the lean install: nothing to say
    assert blas.notice() == ""
    _unused_mkl(monkeypatch, requested="numpy")              # NumPy chosen: nothing to say
    assert blas.notice() == ""


def test_train_says_once_that_mkl_is_unused_and_records_why(monkeypatch, tmp_path, capsys):
    """refopt train prints the notice on stderr once per process (not again for a second run) and
    config.json records the reason in matrix_products."""
    import json

    from refopt.cli import main

    _unused_mkl(monkeypatch)
    tiny = ["--model", "mlp", "--steps", "2", "--batch-size", "8", "--hidden", "8", "--no-progress"]
    assert main(["train", "--out", str(tmp_path / "a"), *tiny]) == 0
    err = capsys.readouterr().err
    assert err.count("refopt: the mkl package is installed but not used: MKL refused it here.") == 1, err
    assert json.loads((tmp_path / "a" / "config.json").read_text())["matrix_products"] == "numpy (MKL refused it here)"
    assert main(["train", "--out", str(tmp_path / "b"), *tiny]) == 0
    assert "mkl package" not in capsys.readouterr().err

