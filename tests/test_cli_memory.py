"""refopt.cli._memory.keep_freed_memory: freed heap pages are reused (no page fault per allocation), and the
training commands turn it on. Page faults are counted with getrusage in a fresh process per case."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_LOOP = """
import resource, sys
import numpy as np
from refopt.cli._memory import keep_freed_memory
ok = keep_freed_memory() if sys.argv[1] == "1" else None
def step():   # a training step's pattern: several arrays of 1 to 12 MiB alive at once, then all freed
    live = [np.ones(n << 18, np.float32) for n in (1, 6, 3, 12, 2)]
    del live
step()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(ok, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _faults(keep: bool):
    out = subprocess.run([sys.executable, "-c", _LOOP, "1" if keep else "0"], cwd=ROOT, capture_output=True,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=ROOT)).stdout.split()
    return out[0], int(out[1])


def test_keep_freed_memory_reuses_pages():
    ok, faults = _faults(True)
    if ok != "True":
        pytest.skip("no glibc mallopt on this platform (keep_freed_memory does nothing)")
    ok0, faults0 = _faults(False)     # negative control: glibc's defaults fault on the same loop
    # 10 steps touch 10 * 24 MiB = 61 440 pages; with the defaults most are fresh, with keep_freed_memory none
    assert faults0 > 5000, faults0
    assert faults < 200, faults


def test_train_and_compare_turn_it_on(monkeypatch):
    import refopt.cli as cli
    from refopt.cli import _memory

    calls = []
    monkeypatch.setattr(_memory, "keep_freed_memory", lambda: calls.append(1) or True)
    for command in ("train", "compare", "golden"):
        monkeypatch.setattr(cli.COMMANDS[command], "run", lambda args: 0)
        assert cli.main([command] if command != "golden" else ["golden", "check", "DIR"]) == 0
    assert len(calls) == 2
