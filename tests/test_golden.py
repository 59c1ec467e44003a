"""Golden vectors: format, round trip, hashes, corruption errors, drift detection, the committed set
tests/golden/ (refopt's own output must keep matching it), the CLI, and the torch replay of docs/golden.md."""
import argparse
import hashlib
import json
import os
import re
import shutil

import numpy as np
import pytest

from refopt import golden
from refopt.checkpoint import rule_from_json
from refopt.crosscheck.problems import make_problem

HERE = os.path.dirname(__file__)
COMMITTED = os.path.join(HERE, "golden")
DOCS = os.path.join(HERE, "..", "docs", "golden.md")


def _case(name):
    return next(c for c in golden.catalog() if c.name == name)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden")
    golden.export(str(d), ["sgd", "adamw", "muon_optax"], ("quadratic",), steps=4)
    return d


def test_catalog_names_unique_and_rules_serialisable():
    cat = golden.catalog()
    names = [c.name for c in cat]
    assert len(names) == len(set(names)) and len(cat) >= 20
    for c in cat:
        from refopt.checkpoint import rule_to_json
        assert rule_from_json(rule_to_json(c.make_rule())) == c.make_rule()


def test_round_trip_manifest_and_hashes(exported):
    g = golden.verify(str(exported / "adamw__quadratic__float64"))
    m = g.manifest
    assert (m["format"], m["format_version"], m["steps"], m["dtype"], m["case"]) == \
        ("refopt-golden", 1, 4, "float64", "adamw")
    assert rule_from_json(m["rule"]["json"]) == _case("adamw").make_rule()
    assert m["rule"]["hyperparameters"]["weight_decay"] == 0.01
    assert m["peers"]["torch"]["constructor"] == "AdamW"
    # optax.adamw(weight_decay=0.01) is matched by hyperparameters; its default would be 1e-4
    assert set(m["peers"]) == {"torch", "optax"} and m["peers"]["optax"]["kwargs"]["weight_decay"] == 0.01
    assert m["state_fields"] == ["m", "v"]
    # every array hashed as documented: sha256 of the raw C-order bytes
    for name, rec in m["arrays"].items():
        a = g.arrays[name]
        assert hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() == rec["sha256"]
        assert list(a.shape) == rec["shape"] and a.dtype.name == rec["dtype"]
    # the initial params are the problem's, the grads are the quadratic's h (x - c) along the trajectory
    prob = make_problem("quadratic", np.float64, 0)
    assert all(np.array_equal(a, b) for a, b in zip(g.leaves0(), prob.leaves))
    xs = [g.leaves0()] + g.params()
    for t, gr in enumerate(g.grads()):
        for a, b in zip(gr, prob.grad(xs[t], t + 1)):
            assert np.array_equal(a, b)


def test_sgd_golden_matches_an_independent_oracle(exported):
    """SGD(lr=0.1): x_t = x_{t-1} - 0.1 * g_t exactly (one rounding per entry, float64)."""
    g = golden.verify(str(exported / "sgd__quadratic__float64"))
    x = g.leaves0()
    for gr, rec in zip(g.grads(), g.params()):
        x = [a - 0.1 * b for a, b in zip(x, gr)]
        assert all(np.array_equal(a, b) for a, b in zip(x, rec))


def test_check_against_refopt_passes_exactly(exported):
    rs = golden.check(str(exported), "refopt")
    assert len(rs) == 3 and all(r.status == "pass" for r in rs)
    assert all(r.params_abs == 0.0 and r.state_abs == 0.0 for r in rs if r.state_abs is not None)


def _copy(src_dir, stem, dst):
    for ext in (".json", ".npz"):
        shutil.copy(os.path.join(src_dir, stem + ext), dst / (stem + ext))
    return str(dst / stem)


def test_corrupted_array_is_named(exported, tmp_path):
    stem = _copy(exported, "adamw__quadratic__float64", tmp_path)
    z = dict(np.load(stem + ".npz"))
    z["params/0"] = z["params/0"].copy()
    z["params/0"][2, 0, 0] += 1e-12
    np.savez_compressed(stem + ".npz", **z)
    with pytest.raises(golden.GoldenError, match=r"array 'params/0' does not match its sha256"):
        golden.verify(stem)


def test_truncated_npz_missing_file_bad_json_and_version(exported, tmp_path):
    stem = _copy(exported, "sgd__quadratic__float64", tmp_path)
    raw = open(stem + ".npz", "rb").read()
    open(stem + ".npz", "wb").write(raw[: len(raw) // 2])
    with pytest.raises(golden.GoldenError, match="cannot read the arrays"):
        golden.verify(stem)
    os.remove(stem + ".npz")
    with pytest.raises(golden.GoldenError, match=r"sgd__quadratic__float64.npz is missing"):
        golden.verify(stem + ".json")
    stem = _copy(exported, "sgd__quadratic__float64", tmp_path)
    m = json.load(open(stem + ".json"))
    m["format_version"] = 99
    json.dump(m, open(stem + ".json", "w"))
    with pytest.raises(golden.GoldenError, match="format_version 99 is not supported"):
        golden.verify(stem)
    open(stem + ".json", "w").write("{not json")
    with pytest.raises(golden.GoldenError, match="not a readable JSON manifest"):
        golden.verify(stem)


def test_missing_and_unexpected_arrays(exported, tmp_path):
    stem = _copy(exported, "sgd__quadratic__float64", tmp_path)
    z = dict(np.load(stem + ".npz"))
    del z["grads/1"]
    z["extra"] = np.zeros(1)
    np.savez_compressed(stem + ".npz", **z)
    with pytest.raises(golden.GoldenError, match=r"missing \['grads/1'\], unexpected \['extra'\]"):
        golden.verify(stem)


def test_drift_beyond_tolerance_fails_the_replay(exported, tmp_path):
    """A consistent file (hashes updated) whose params differ by 1e-9 relative: refopt's replay fails."""
    stem = _copy(exported, "adamw__quadratic__float64", tmp_path)
    z = dict(np.load(stem + ".npz"))
    z["params/1"] = z["params/1"] * (1 + 1e-9)
    np.savez_compressed(stem + ".npz", **z)
    m = json.load(open(stem + ".json"))
    m["arrays"]["params/1"]["sha256"] = hashlib.sha256(z["params/1"].tobytes()).hexdigest()
    json.dump(m, open(stem + ".json", "w"))
    r = golden.check_file(stem, "refopt")
    assert r.status == "fail" and 5e-10 < r.params_rel < 2e-9


def test_committed_golden_files_verify_and_refopt_still_matches_them():
    stems = golden.find(COMMITTED)
    assert len(stems) >= 25
    size = sum(os.path.getsize(os.path.join(COMMITTED, f)) for f in os.listdir(COMMITTED))
    assert size < 2_000_000     # about 10 kB a case: room for the catalog to grow, small enough for a clone
    results = golden.check(COMMITTED, "refopt")
    bad = [r for r in results if r.status != "pass"]
    assert not bad, [(r.preset, r.problem, r.dtype, r.params_rel, r.message) for r in bad]
    covered = {golden.verify(s).manifest["case"] for s in stems}
    assert covered == {c.name for c in golden.catalog()}      # every catalog case is guarded


@pytest.mark.parametrize("peer,module", [("torch", "torch"), ("optax", "optax"), ("schedulefree", "schedulefree"),
                                         ("pytorch_optimizer", "pytorch_optimizer"), ("prodigyopt", "prodigyopt"),
                                         ("dadaptation", "dadaptation")])
def test_committed_golden_files_replay_in_the_peers(peer, module):
    pytest.importorskip(module, reason=f"peer {peer} not installed")
    results = golden.check(COMMITTED, peer)
    ran = [r for r in results if r.status != "skip"]
    assert ran and all(r.status == "pass" for r in ran), [(r.preset, r.message) for r in ran if r.status != "pass"]


def _cli(argv):
    from refopt.cli import golden as cli
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return cli.run(p.parse_args(argv))


def test_cli_export_check_and_corruption(tmp_path, capsys):
    d = str(tmp_path / "g")
    assert _cli(["export", d, "--cases", "sgd_momentum", "--problems", "quadratic", "--steps", "3"]) == 0
    assert sorted(os.listdir(d)) == ["sgd_momentum__quadratic__float64.json", "sgd_momentum__quadratic__float64.npz"]
    assert _cli(["check", d]) == 0
    assert "1 pass, 0 fail" in capsys.readouterr().out
    z = dict(np.load(os.path.join(d, "sgd_momentum__quadratic__float64.npz")))
    z["state/b/0"] = z["state/b/0"] + 1.0
    np.savez_compressed(os.path.join(d, "sgd_momentum__quadratic__float64.npz"), **z)
    assert _cli(["check", d]) == 2
    assert "array 'state/b/0' does not match its sha256" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown golden case 'nope'"):
        _cli(["export", d, "--cases", "nope"])


def test_docs_torch_replay_example_runs():
    pytest.importorskip("torch", reason="peer torch not installed")
    text = open(DOCS).read()
    code = re.search(r"## Replaying in torch.*?```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 30
    ns = {}
    exec(code, ns)
    for stem in ("adamw__quadratic__float64", "sgd_nesterov_wd__quadratic__float64",
                 "sgd_momentum__quadratic__float64", "adamw_wd1e-4__quadratic__float64"):   # the last two: torch
        worst, tol = ns["replay_in_torch"](os.path.join(COMMITTED, stem))           # matched by hyperparameters
        assert worst["params"] <= 1e-12 and worst["state"] <= 1e-12 and tol == {"params": 1e-12, "state": 1e-12}
    worst, tol = ns["replay_in_torch"](os.path.join(COMMITTED, "adam__stream__float64"))
    assert worst["state"] <= 1e-12 and 0 < worst["params"] <= tol["params"]    # the state is compared too
    worst, tol = ns["replay_in_torch"](os.path.join(COMMITTED, "muon_torch__quadratic__float64"))
    assert "params" not in tol and worst["state"] <= tol["state"]                 # bfloat16 Newton-Schulz
    assert 1e-3 < worst["update"] <= tol["update"]       # the per-step update bound is what judges these files
    with pytest.raises(KeyError):                                                  # peers == {}
        ns["replay_in_torch"](os.path.join(COMMITTED, "muon_svd__quadratic__float64"))


def test_docs_jax_replay_example_runs_and_needs_x64():
    """docs/golden.md's optax replay: 1e-16 with the scoped x64; the same code without it misses 1e-12."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("optax", reason="peer optax not installed")
    text = open(DOCS).read()
    code = re.search(r"## Replaying in JAX.*?```python\n(.*?)```", text, re.S).group(1)
    assert "jax.enable_x64(True)" in code and len(code.strip().splitlines()) <= 25
    before = jax.config.jax_enable_x64
    ns = {}
    exec(code, ns)
    for stem in ("adam__quadratic__float64", "covariant_adam__quadratic__float64", "muon_optax__quadratic__float64",
                 "adamw__quadratic__float64"):
        worst, tol = ns["replay_in_optax"](os.path.join(COMMITTED, stem))
        assert worst <= tol, stem
    assert jax.config.jax_enable_x64 == before                      # scoped, not flipped
    ns32 = {}
    exec(code.replace("jax.enable_x64(True)", "jax.enable_x64(False)"), ns32)
    worst, tol = ns32["replay_in_optax"](os.path.join(COMMITTED, "adam__quadratic__float64"))
    assert worst > 1e-9 and worst > 100 * tol                       # float32 silently: about 1e-7


def _peers_missing(m):
    """The peers that reproduce the manifest's rule (the exporter's peer_entries) but are not listed, and
    the listed ones whose preset or kwargs differ from the exporter's."""
    want = golden.peer_entries(rule_from_json(m["rule"]["json"]), m["dtype"], m["problem"])
    missing = sorted(set(want) - set(m["peers"]))
    wrong = sorted(k for k in set(want) & set(m["peers"])
                   if (m["peers"][k]["preset"], m["peers"][k]["kwargs"]) != (want[k]["preset"], want[k]["kwargs"]))
    return missing + wrong + sorted(set(m["peers"]) - set(want))


def test_committed_manifests_list_every_peer_that_reproduces_the_rule():
    """docs/golden.md: ``peers`` lists each peer optimizer that reproduces the rule, so its replay snippets
    (man["peers"]["torch"]) work on every file golden check --against torch passes (a missing one is a KeyError in the
    snippet). Negative control: a file with a peer dropped."""
    stems = golden.find(COMMITTED)
    bad = {os.path.basename(s): _peers_missing(json.load(open(s + ".json"))) for s in stems}
    assert not any(bad.values()), {k: v for k, v in bad.items() if v}
    m = json.load(open(os.path.join(COMMITTED, "sgd_momentum__quadratic__float64.json")))
    assert sorted(m["peers"]) == ["optax", "torch"]
    del m["peers"]["torch"]
    assert _peers_missing(m) == ["torch"]


def test_a_function_hyperparameter_is_written_by_name_not_address():
    """A Partition's labels function is written as its dotted name, in the committed file too (its repr, a
    memory address, would give two exports of the same rule different manifests)."""
    from refopt.rules.partition import matrix_labels

    assert golden._plain(matrix_labels) == "refopt.rules.partition.matrix_labels"
    assert golden._plain(lambda p: p).endswith("<lambda>")
    texts = [open(s + ".json").read() for s in golden.find(COMMITTED)]
    assert not any(re.search(r"at 0x[0-9a-f]+", t) for t in texts)
