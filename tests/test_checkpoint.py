"""Checkpoints: exact round trips, bit-exact resume, atomic writes, clear errors on bad files."""
from __future__ import annotations

import io
import json
import os
import zipfile
from typing import NamedTuple

import numpy as np
import pytest

import refopt
from refopt import checkpoint as ck
from refopt.checkpoint import CheckpointError, load, read_metadata, save
from refopt.core import OptState
from refopt.rules.adam import Adam, AdamW
from refopt import gpt_labels
from refopt.rules.partition import Partition, matrix_labels
from refopt.rules.sgd import SGD
from refopt.serialize import rule_from_json


def _params(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return {"layers": [{"w": rng.standard_normal((5, 3)).astype(dtype), "b": rng.standard_normal(3).astype(dtype)},
                       {"w": rng.standard_normal((3, 4)).astype(dtype), "b": rng.standard_normal(4).astype(dtype)}],
            "scale": rng.standard_normal((2, 2)).astype(dtype)}


def _trained(rule, steps=3, dtype=np.float64):
    p = _params(dtype=dtype)
    s = refopt.init(rule, p)
    for k in range(steps):
        p, s = refopt.update(rule, s, p, _params(seed=10 + k, dtype=dtype))
    return p, s


def _assert_trees_identical(a, b):
    la, pa, da = refopt.tree.flatten(a)
    lb, pb, db = refopt.tree.flatten(b)
    assert pa == pb and da == db
    for x, y, p in zip(la, lb, pa):
        assert type(x) is type(y), p
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, p
            assert x.tobytes() == y.tobytes(), p
        else:
            assert x == y or (x != x and y != y), p


RULE = Partition(rules={"hidden": SGD(lr=0.05, momentum=0.9, nesterov=True),
                        "other": AdamW(lr=0.01, weight_decay=0.1)}, labels=matrix_labels)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_trip_is_exact(tmp_path, dtype):
    p, s = _trained(RULE, dtype=dtype)
    f = tmp_path / "ck.npz"
    save(f, p, s, RULE, step=3, seed=7, note="hello")
    c = load(f)
    _assert_trees_identical(c.params, p)
    _assert_trees_identical(c.state, s)
    assert type(c.state) is OptState and c.state.t == 3 and type(c.state.t) is int
    assert c.rule == RULE and c.rule.labels is matrix_labels
    assert c.metadata == {"step": 3, "seed": 7, "note": "hello"}
    for a in refopt.tree.leaves(c.state) + refopt.tree.leaves(c.params):
        if isinstance(a, np.ndarray):
            assert a.flags.writeable and a.flags.c_contiguous


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rule", [RULE, Adam(lr=0.02, weight_decay=1e-3), SGD(lr=0.1)], ids=str)
def test_resume_is_bit_identical(tmp_path, dtype, rule):
    p, s = _trained(rule, steps=6, dtype=dtype)
    q, r = _trained(rule, steps=3, dtype=dtype)
    save(tmp_path / "c", q, r, rule)
    c = load(tmp_path / "c")
    q, r = c.params, c.state
    for k in range(3, 6):
        q, r = refopt.update_(c.rule, r, q, _params(seed=10 + k, dtype=dtype))
    _assert_trees_identical(q, p)
    _assert_trees_identical(r, s)


class _Glob(NamedTuple):
    k: int
    weight_sum: float
    lr_max: np.float32
    flag: bool
    name: str
    nothing: None


def test_python_and_numpy_scalars_keep_type_and_value(tmp_path):
    """Globals such as Schedule-Free's weight_sum must come back exactly, with their Python/numpy type
    (an np.float32 promoted to float64 would change float32 arithmetic under NEP 50)."""
    glob = _Glob(7, 0.1 + 0.2, np.float32(1 / 3), True, "x", None)
    s = OptState(5, {"g": glob, "inf": float("inf"), "big": 2 ** 70, "t": (1, [2.5])}, {"w": ()})
    p = {"w": np.zeros(0)}
    save(tmp_path / "c", p, s, None)
    c = load(tmp_path / "c", types=[_Glob])
    _assert_trees_identical(c.state, s)
    g = c.state.glob["g"]
    assert type(g) is _Glob and g.weight_sum == 0.1 + 0.2 and type(g.lr_max) is np.float32
    assert c.state.glob["big"] == 2 ** 70 and c.rule is None
    # without types=, a foreign NamedTuple comes back as a stand-in with the same fields and values
    g2 = load(tmp_path / "c").state.glob["g"]
    assert type(g2).__name__ == "_Glob" and g2._fields == _Glob._fields and tuple(g2) == tuple(g)


def test_user_namedtuple_params(tmp_path):
    class P(NamedTuple):
        w: np.ndarray
        b: np.ndarray

    p = P(np.ones((2, 2)), np.zeros(2))
    rule = SGD(lr=0.1)
    s = refopt.init(rule, p)
    save(tmp_path / "c", p, s, rule)
    c = load(tmp_path / "c", types=[P])
    assert type(c.params) is P
    refopt.update(rule, c.state, c.params, p)  # structure matches the user's class


def test_schedules_and_nested_rules_round_trip(tmp_path):
    sch = pytest.importorskip("refopt.schedules")
    schedule = sch.WSD(warmup_steps=2, decay_steps=3, total_steps=10)
    rule = Partition(rules={"hidden": AdamW(lr=0.01, schedule=schedule),
                            "other": SGD(lr=np.float64(0.5), momentum=0.5)},
                     labels={"layers": [{"w": "hidden", "b": "other"}, {"w": "hidden", "b": "other"}],
                             "scale": "other"})
    p, s = _trained(rule)
    save(tmp_path / "c", p, s, rule)
    c = load(tmp_path / "c")
    assert c.rule == rule
    assert c.rule.rules["hidden"].schedule == schedule and type(c.rule.rules["hidden"].schedule) is type(schedule)
    assert type(c.rule.rules["other"].lr) is np.float64
    assert read_metadata(tmp_path / "c")["rule"]["__rule__"] == ["refopt.rules.partition", "Partition"]


def test_gpt_labels_function_is_stored_by_name(tmp_path):
    rule = Partition(rules={"hidden": SGD(lr=0.1), "other": Adam(lr=0.1)}, labels=gpt_labels)
    p = {"wte": np.ones((3, 2)), "blocks": [{"attn": {"w_q": np.ones((2, 2))}, "attn_norm": np.ones(2)}]}
    save(tmp_path / "c", p, refopt.init(rule, p), rule)
    assert read_metadata(tmp_path / "c")["rule"]["fields"]["labels"] == \
        {"__function__": ["refopt.labels", "gpt_labels"]}
    assert load(tmp_path / "c").rule.labels is gpt_labels
    # the name under which it is also exported (and which earlier checkpoints store) resolves to it too
    stored = read_metadata(tmp_path / "c")["rule"]
    stored["fields"]["labels"] = {"__function__": ["refopt", "gpt_labels"]}
    assert rule_from_json(stored).labels is gpt_labels


def test_user_function_cannot_be_saved_but_rule_none_works(tmp_path):
    rule = Adam(lr=0.1, schedule=lambda t: 1.0 / t)
    p, s = _trained(rule)
    f = tmp_path / "c"
    with pytest.raises(CheckpointError, match=r"Adam\.schedule.*rule=None"):
        save(f, p, s, rule)
    assert not f.exists() and os.listdir(tmp_path) == []      # nothing written, no temp file left
    save(f, p, s, None, step=3)
    c = load(f)
    assert c.rule is None
    assert load(f, rule=rule).rule is rule


def test_rule_from_outside_refopt_is_refused(tmp_path):
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class MySGD(SGD):
        pass

    p, s = _trained(SGD(lr=0.1))
    with pytest.raises(CheckpointError, match="not a refopt class"):
        save(tmp_path / "c", p, s, MySGD(lr=0.1))


def _rewrite(src, dst, edit_meta=None, edit_member=None, drop=None):
    """Copy the zip ``src`` to ``dst`` changing the metadata and/or one member (with valid zip CRCs)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name == drop:
                continue
            if name == ck.META_NAME and edit_meta:
                meta = json.loads(data)
                edit_meta(meta)
                data = json.dumps(meta).encode()
            if edit_member and name == edit_member[0]:
                data = edit_member[1](data)
            zout.writestr(name, data)


@pytest.fixture
def saved(tmp_path):
    p, s = _trained(RULE)
    f = tmp_path / "good.npz"
    save(f, p, s, RULE)
    return f


def test_truncated_file(saved, tmp_path):
    data = saved.read_bytes()
    for n in (len(data) // 2, len(data) - 10, 30):
        bad = tmp_path / f"trunc{n}"
        bad.write_bytes(data[:n])
        with pytest.raises(CheckpointError, match="truncated or corrupted"):
            load(bad)


def test_flipped_byte_detected(saved, tmp_path):
    data = bytearray(saved.read_bytes())
    i = data.index(b"\x93NUMPY") + 200   # inside the first array's payload
    data[i] ^= 0xFF
    bad = tmp_path / "flip"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        load(bad)


def test_hash_mismatch_detected(saved, tmp_path):
    """An array altered with a consistent zip CRC is caught by its sha256."""
    def change(raw):
        a = np.lib.format.read_array(io.BytesIO(raw))
        a.reshape(-1)[0] = np.nextafter(a.reshape(-1)[0], np.inf)
        out = io.BytesIO()
        np.lib.format.write_array(out, a)
        return out.getvalue()

    bad = tmp_path / "hash"
    _rewrite(saved, bad, edit_member=("params/scale.npy", change))
    with pytest.raises(CheckpointError, match=r"sha256 mismatch for params/scale"):
        load(bad)


def test_mismatched_files(saved, tmp_path):
    cases = {
        "version": (dict(edit_meta=lambda m: m.update(format_version=99)), "format version 99"),
        "format": (dict(edit_meta=lambda m: m.update(format="other")), "not a refopt checkpoint"),
        "missing": (dict(drop="state/leaves.scale.inner.b.npy"), r"array state/leaves\.scale\.inner\.b is missing"),
        "dtype": (dict(edit_meta=lambda m: m["params"]["leaves"][0].update(dtype="<f4")), "the metadata says"),
        "nometa": (dict(drop=ck.META_NAME), "no metadata.json"),
        "evil": (dict(edit_meta=lambda m: m.update(rule={"__rule__": ["os", "system"], "fields": {}})),
                 "only refopt objects"),
        "reach": (dict(edit_meta=lambda m: m["rule"]["fields"].update(
            labels={"__function__": ["refopt.checkpoint", "os._exit"]})), "not defined in the refopt package"),
        "dunder": (dict(edit_meta=lambda m: m["rule"]["fields"].update(
            labels={"__function__": ["refopt.checkpoint", "save.__globals__"]})), "cannot rebuild the object"),
        "gone": (dict(edit_meta=lambda m: m.update(rule={"__rule__": ["refopt.rules.sgd", "Nope"], "fields": {}})),
                 "unknown refopt object"),
        "badfield": (dict(edit_meta=lambda m: m["rule"]["fields"]["rules"]["__dict__"][0][1]["fields"].update(lr=-1)),
                     "cannot rebuild"),
    }
    for name, (kw, msg) in cases.items():
        bad = tmp_path / name
        _rewrite(saved, bad, **kw)
        with pytest.raises(CheckpointError, match=msg):
            load(bad)
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(CheckpointError):
        load(junk)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "absent")
    assert issubclass(CheckpointError, ValueError)


def test_save_rejects_state_for_other_params(tmp_path):
    p, s = _trained(SGD(lr=0.1))
    with pytest.raises(CheckpointError, match="does not match params"):
        save(tmp_path / "c", {"w": np.ones(2)}, s, SGD(lr=0.1))
    with pytest.raises(CheckpointError, match="OptState"):
        save(tmp_path / "c", p, (0, None, None), SGD(lr=0.1))
    with pytest.raises(CheckpointError, match="JSON"):
        save(tmp_path / "c", p, s, SGD(lr=0.1), bad=object())
    assert os.listdir(tmp_path) == []


def test_atomic_write_keeps_old_file_on_failure(saved, monkeypatch):
    before = saved.read_bytes()
    p, s = _trained(SGD(lr=0.1), steps=1)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ck.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        save(saved, p, s, SGD(lr=0.1))
    assert saved.read_bytes() == before
    assert os.listdir(saved.parent) == [saved.name]          # the temporary file was removed
    monkeypatch.undo()
    save(saved, p, s, SGD(lr=0.1))                            # overwriting works
    assert load(saved).state.t == 1 and os.listdir(saved.parent) == [saved.name]


def test_hyperball_radius_survives_checkpoint(tmp_path):
    """PITFALLS B11: R is fixed at init and must come back from the checkpoint, not from the trained W."""
    hb = pytest.importorskip("refopt.rules.hyperball")
    rule = hb.Hyperball(base=Adam(lr=0.1), lr=0.2)
    W0 = {"w": np.diag([3.0, 4.0])}
    s = refopt.init(rule, W0)
    p = W0
    for k in range(3):
        p, s = refopt.update(rule, s, p, {"w": np.array([[1.0, 1.0], [0.0, -2.0]]) * (k + 1)})
    p = {"w": p["w"] * 2.0}       # the user rescales W: the radius must still be 5, not ||W||
    save(tmp_path / "c", p, s, rule)
    c = load(tmp_path / "c")
    assert float(c.state.leaves["w"].radius) == 5.0
    q, _ = refopt.update(c.rule, c.state, c.params, {"w": np.ones((2, 2))})
    assert abs(np.linalg.norm(q["w"]) - 5.0) <= 1e-12 * 5.0
    assert c.rule == rule


def test_schedule_free_state_round_trip_b14(tmp_path):
    """PITFALLS B14: z, x, weight_sum, lr_max and k are stored explicitly, so the evaluation weights after
    loading are the stored x bit for bit (float32, where recomputing x from y and z is off by ~1e-7)."""
    sf = pytest.importorskip("refopt.rules.schedule_free")
    rule = sf.ScheduleFreeAdamW(lr=0.05, weight_decay=0.5, warmup_steps=2)
    p, s = _trained(rule, steps=3, dtype=np.float32)
    save(tmp_path / "c", p, s, rule)
    c = load(tmp_path / "c")
    assert type(c.state.glob) is type(s.glob) and tuple(c.state.glob) == tuple(s.glob)
    ev, ev2 = refopt.eval_params(rule, s, p), refopt.eval_params(c.rule, c.state, c.params)
    for a, b in zip(refopt.tree.leaves(ev), refopt.tree.leaves(ev2)):
        assert a.dtype == np.float32 and a.tobytes() == b.tobytes()
    assert any(not np.array_equal(a, b) for a, b in zip(refopt.tree.leaves(ev), refopt.tree.leaves(p)))


def test_save_into_a_missing_directory_names_the_directory(tmp_path):
    """The error names the folder that is missing (it named mkstemp's temporary file); nothing is created."""
    rule = refopt.Adam(lr=0.01)
    x = {"w": np.ones(3)}
    missing = tmp_path / "nodir"
    with pytest.raises(FileNotFoundError, match=r"the directory .*nodir does not exist") as e:
        refopt.save(missing / "c.npz", x, refopt.init(rule, x), rule)
    assert ".tmp" not in str(e.value)
    assert not missing.exists() and os.listdir(tmp_path) == []
