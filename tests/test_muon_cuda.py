"""Muon(msign_backend='cuda'): the step with its Newton-Schulz on the GPU kernels equals the CPU step (float64
1e-12, float32 1e-4), run in numba's CUDA simulator in a subprocess (see tests/test_msign_cuda.py for why)."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import refopt

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
DEVICE = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("REFOPT_TEST_GPU") == "1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(DEVICE, reason="the subprocess runner itself")
@pytest.mark.skipif(not HAVE_NUMBA_CUDA, reason='numba-cuda not installed (pip install ".[cuda]")')
def test_muon_cuda_in_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "test_device_",
                        __file__], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert " passed" in last and "skipped" not in last and "failed" not in last, r.stdout[-2000:]


@pytest.mark.skipif(not (DEVICE and HAVE_NUMBA_CUDA), reason="device test: runs in the simulator subprocess")
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-4)])
def test_device_muon_step_equals_the_cpu_step(dtype, tol):
    rng = np.random.default_rng(0)
    x = {"w": rng.standard_normal((5, 3)).astype(dtype)}
    gs = [{k: rng.standard_normal(a.shape).astype(dtype) for k, a in x.items()} for _ in range(2)]
    out = []
    for backend in ("cpu", "cuda"):
        rule = refopt.Muon(lr=0.05, weight_decay=0.01, msign_backend=backend)
        p, s = dict(x), refopt.init(rule, x)
        for g in gs:
            p, s = refopt.update(rule, s, p, g)
        out.append((p, s))
    for k in x:
        assert out[1][0][k].dtype == dtype
        np.testing.assert_allclose(out[1][0][k], out[0][0][k], rtol=tol, atol=tol)
        assert np.array_equal(out[1][1].leaves[k].m, out[0][1].leaves[k].m)   # the momentum is CPU arithmetic


def test_muon_cuda_backend_is_validated_and_stored():
    with pytest.raises(ValueError, match="msign_backend"):
        refopt.Muon(msign_backend="gpu")
    with pytest.raises(ValueError, match="Newton-Schulz only"):
        refopt.Muon(msign="svd", msign_backend="cuda")
    rule = refopt.Muon(msign_backend="cuda")
    assert refopt.checkpoint.rule_from_json(refopt.checkpoint.rule_to_json(rule)) == rule
