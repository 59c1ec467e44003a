"""The divergence atlas (docs/divergences.md): every entry, run once per test session, still
diverges in the pinned peer versions (so that a peer's fix is noticed and the atlas updated), and each
side is still reproduced by its refopt preset; negative controls (a swapped preset, a vanished
divergence) must be caught; the command's exit status and JSON. Entries whose peer is not installed
are skipped with the reason."""
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from refopt.crosscheck import divergences as D
from refopt.crosscheck import peers
from refopt.crosscheck.run import Trajectory

ENTRIES = {e.name: e for e in D.entries()}


@pytest.fixture(scope="module")
def results():
    return {}


def _result(results, name):
    if name not in results:
        results[name] = D.run_entry(ENTRIES[name])
    return results[name]


@pytest.mark.parametrize("name", list(ENTRIES))
def test_entry_still_diverges_and_each_side_is_reproduced(results, name):
    r = _result(results, name)
    if r.status == "skipped":
        pytest.skip(r.reason)
    bad = [f"{f.between}: {f.figure} {f.value:.3g} ({f.kind} {f.bound:g})" for f in r.differences if not f.ok]
    assert not bad, f"{name}: the documented divergence changed: {bad}"
    assert r.differences and any(f.kind == "min" for f in r.differences), "an entry must measure a divergence"
    for s in r.sides:
        assert s.ok, f"{name}: side {s.label} is no longer reproduced by {s.refopt}: {s.measured} > {s.tolerance}"
        if not s.restated:          # every peer side is checked against the peer it stands for
            assert s.measured and s.checked_against.startswith(s.peer)
    assert r.status == "reproduced"
    assert all(r.peers[p] for p in r.peers)      # the versions are recorded


def test_the_documented_entries_are_all_there():
    from refopt.conventions import ALL_PEERS
    need = {"nadam-momentum-decay", "schedule-free-warmup", "schedule-count", "muon-conv-scale", "ema-start",
            "clip-eps", "muon-bf16", "muon-scale", "trust-ratio-zero-norm", "adam-eps-placement",
            "adamw-decay-coupling", "sgd-dampening-first-step", "nesterov-forms"}
    assert need <= set(ENTRIES)
    for e in ENTRIES.values():          # restated sides are marked, every side names a refopt configuration
        assert e.follows and e.reference and e.sides
        for s in e.sides:
            assert s.refopt and (s.peer is None or s.peer in ALL_PEERS)
            assert s.restated == ("[restated by refopt]" in s.impl)


def test_peers_are_pinned_to_exact_versions_in_pyproject():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("peers"))
    pins = {k.replace("-", "_"): v for k, v in re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', line)}
    assert {n.replace("-", "_") for n in D.VERSIONED} <= set(pins), pins
    for name, v in D.versions().items():            # the atlas's figures were measured with these versions
        if v is not None:
            assert v.split("+")[0] == pins[name], f"{name} {v} installed, the peers extra pins {pins[name]}"


# --- negative controls -------------------------------------------------------------------------------

def test_a_swapped_preset_is_not_reproduced():
    pytest.importorskip("torch")
    pytest.importorskip("optax")
    e = ENTRIES["nadam-momentum-decay"]
    torch_side, optax_side = e.sides[0], e.sides[1]
    wrong = dataclasses.replace(e, sides=(dataclasses.replace(torch_side, make_refopt=optax_side.make_refopt),
                                          optax_side), pairs=e.pairs[:1])
    r = D.run_entry(wrong)
    assert r.status == "changed"
    assert not r.sides[0].ok and r.sides[0].measured["params"] > 1e-3
    assert r.sides[1].ok


def test_a_vanished_divergence_is_caught():
    pytest.importorskip("torch")
    pytest.importorskip("optax")
    e = ENTRIES["clip-eps"]
    optax_side = e.sides[1]
    # 'torch' replaced by optax's own call: no divergence left, the pair's lower bound must fail
    same = dataclasses.replace(e, sides=(dataclasses.replace(optax_side, label="torch"), optax_side))
    r = D.run_entry(same)
    assert r.status == "changed"
    assert [f.ok for f in r.differences] == [False] and r.differences[0].value < 1e-12


def test_figures_on_a_closed_form():
    x0 = [np.array([1.0, 2.0])]
    a = Trajectory(params=[[np.array([1.5, 2.0])], [np.array([2.0, 2.0])]])
    b = Trajectory(params=[[np.array([1.5, 2.0])], [np.array([2.0, 4.0])]])
    f = D._figures(a, b, x0, ["p"])
    assert f["final"] == pytest.approx(2.0 / 4.0)
    assert f["abs"] == 2.0
    # step 1: equal updates (0); step 2: Delta_a = (0.5, 0), Delta_b = (0.5, 2): |(0, -2)| / |(0.5, 2)|
    assert f["step"] == pytest.approx(np.median([0.0, 2.0 / np.hypot(0.5, 2.0)]))
    assert f["update"] == pytest.approx(2.0 / np.hypot(0.5, 2.0))


# --- the command ---------------------------------------------------------------------------------------

def _cli(argv):
    from refopt.cli import main
    return main(argv)


def test_cli_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        _cli(["divergences", "--against", "tensorflow"])
    assert e.value.code == 2
    assert _cli(["divergences", "--only", "no-such-entry"]) == 2
    assert "unknown entry 'no-such-entry'" in capsys.readouterr().err


def test_cli_list_and_against_select_entries(capsys):
    assert _cli(["divergences", "--list", "--against", "schedulefree"]) == 0
    out = capsys.readouterr().out
    assert "schedule-free-warmup" in out and "nadam-momentum-decay" not in out
    assert _cli(["divergences", "--list"]) == 0
    assert "muon-conv-scale" in capsys.readouterr().out       # restated-only entries run with 'all'


def test_cli_json_and_exit_0(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("optax")
    out = tmp_path / "atlas.json"
    assert _cli(["divergences", "--only", "clip-eps", "muon-conv-scale", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "clip-eps" in text and "torch 2.13.0" in text and "refopt: ClipByGlobalNorm" in text
    data = json.loads(out.read_text())
    order = [e.name for e in D.entries() if e.name in ("muon-conv-scale", "clip-eps")]
    assert [d["name"] for d in data] == order                                # in the atlas's order
    clip = next(d for d in data if d["name"] == "clip-eps")
    assert set(clip["peers"]) == {"torch", "optax"} and all(clip["peers"].values())
    assert clip["differences"][0]["value"] > 1e-8
    assert {s["refopt"] for s in clip["sides"]} == {"ClipByGlobalNorm(base=SGD(lr=0.1), eps=1e-06)",
                                                    "ClipByGlobalNorm(base=SGD(lr=0.1))"}
    conv = next(d for d in data if d["name"] == "muon-conv-scale")
    assert conv["peers"] == {} and all(s["restated"] for s in conv["sides"])


def test_cli_exit_1_when_an_entry_no_longer_reproduces(monkeypatch, capsys):
    e = ENTRIES["muon-conv-scale"]
    broken = dataclasses.replace(e, pairs=(dataclasses.replace(e.pairs[0], bound=10.0),))
    monkeypatch.setattr(D, "ENTRIES", (lambda: broken,))
    assert _cli(["divergences"]) == 1
    assert "NO LONGER" in capsys.readouterr().out


def test_missing_peer_skips_with_the_reason(monkeypatch, capsys):
    real = peers.available

    def no_optax(peer):
        if peer == "optax":
            return False, "peer 'optax' is not installed (optax missing); install it with: pip install optax"
        return real(peer)
    monkeypatch.setattr(peers, "available", no_optax)
    from refopt.conventions import muon, schedule_free
    monkeypatch.setattr(D, "ENTRIES", (schedule_free.atlas_sf_warmup, muon.atlas_muon_4d))
    assert _cli(["divergences"]) == 0
    out = capsys.readouterr().out
    assert "[skipped] schedule-free-warmup" in out and "optax missing" in out
    assert "[reproduced] muon-conv-scale" in out
