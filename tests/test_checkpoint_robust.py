"""Checkpoints fail cleanly whatever is in the file.

Systematic: every byte of a tiny checkpoint flipped (all the zip and npy structure, a sample of the JSON
text), every truncation, every key and list item of the metadata removed, and crafted files (absurd
shapes, compressed or encrypted members, code in an npy header, invalid tree definitions). The only
acceptable outcomes are :class:`CheckpointError` or the original checkpoint back, bit for bit.
"""
from __future__ import annotations

import copy
import io
import json
import os
import tracemalloc
import zipfile

import numpy as np
import pytest

import refopt
from refopt import checkpoint as ck
from refopt.checkpoint import CheckpointError, load, save
from refopt.rules.adam import Adam, AdamState
from refopt.rules.partition import Partition
from refopt.rules.sgd import SGD

RULE = Partition(rules={"m": Adam(lr=0.1), "v": SGD(lr=0.1)}, labels={"w": "m", "b": "v"})


def _tiny():
    p = {"w": np.arange(4.0).reshape(2, 2), "b": np.ones(2, np.float32)}
    s = refopt.init(RULE, p)
    p, s = refopt.update(RULE, s, p, {"w": np.ones((2, 2)), "b": np.ones(2, np.float32)})
    return p, s


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    d = tmp_path_factory.mktemp("ck")
    p, s = _tiny()
    save(d / "good.npz", p, s, RULE, step=1)
    return d / "good.npz", load(d / "good.npz")


def _same(c, ref) -> bool:
    la, pa, da = refopt.tree.flatten((c.params, c.state))
    lb, pb, db = refopt.tree.flatten((ref.params, ref.state))
    return (pa == pb and da == db and c.rule == ref.rule and c.metadata == ref.metadata and
            all(type(x) is type(y) and (x.tobytes() == y.tobytes() if isinstance(x, np.ndarray) else x == y)
                for x, y in zip(la, lb)))


def _outcome(path, ref) -> str:
    try:
        c = load(path)
    except CheckpointError:
        return "error"
    assert _same(c, ref), "a corrupted file loaded as something else than the checkpoint"
    return "same"


def _json_span(data: bytes) -> range:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = z.getinfo(ck.META_NAME)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    return range(start, start + info.file_size)


def test_every_byte_flipped(good, tmp_path):
    path, ref = good
    data = path.read_bytes()
    text = _json_span(data)
    outcomes = {"error": 0, "same": 0}
    bad = tmp_path / "flip"
    for i in range(len(data)):
        if i in text and (i - text.start) % 8:          # the JSON text: a sample; everything else: every byte
            continue
        b = bytearray(data)
        b[i] ^= 0xFF
        bad.write_bytes(bytes(b))
        outcomes[_outcome(bad, ref)] += 1
    assert outcomes["error"] > 0.8 * sum(outcomes.values())   # timestamps, attributes ... may be harmless


def test_every_truncation(good, tmp_path):
    path, ref = good
    data = path.read_bytes()
    text = _json_span(data)
    bad = tmp_path / "trunc"
    for n in range(len(data)):
        if n in text and (n - text.start) % 8:          # as above: a sample of the JSON text
            continue
        bad.write_bytes(data[:n])
        with pytest.raises(CheckpointError):
            load(bad)


def _rewrite(src, dst, meta=None, members=None, compress=zipfile.ZIP_STORED):
    """Copy ``src`` with a new metadata object and/or replaced member bytes (valid zip CRCs)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=compress) as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name == ck.META_NAME and meta is not None:
                data = json.dumps(meta).encode()
            if members and name in members:
                data = members[name]
                if data is None:
                    continue
            zout.writestr(name, data)
        for name, data in (members or {}).items():
            if data is not None and name not in zin.namelist():
                zout.writestr(name, data)


def _removals(obj, where=()):
    """Every (path, mutated copy of the root) with one dict key or one list item removed."""
    if isinstance(obj, dict):
        keys = list(obj)
    elif isinstance(obj, list):
        keys = list(range(len(obj)))
    else:
        return
    for k in keys:
        yield where + (k,)
        yield from _removals(obj[k], where + (k,))


def test_every_metadata_key_removed(good, tmp_path):
    path, ref = good
    meta = ck.read_metadata(path)
    bad = tmp_path / "cut"
    n = 0
    for where in _removals(meta):
        if where[0] == "extra":          # the user's own metadata: any content is valid
            continue
        m = copy.deepcopy(meta)
        node = m
        for k in where[:-1]:
            node = node[k]
        del node[where[-1]]
        _rewrite(path, bad, meta=m)
        if len(where) >= 2 and where[0] == "rule" and where[-2] == "fields":
            # a rule field left out takes the class default (files written before a field was added
            # still load); the arrays must be untouched
            try:
                c = load(bad)
            except CheckpointError:
                continue
            assert isinstance(c.rule, refopt.core.Rule) and _same(c._replace(rule=ref.rule), ref), where
            continue
        with pytest.raises(CheckpointError):
            load(bad)
        n += 1
    assert n > 50


def test_every_metadata_value_retyped(good, tmp_path):
    """Each scalar of the metadata replaced by values of other types: CheckpointError or the same."""
    path, ref = good
    meta = ck.read_metadata(path)
    bad = tmp_path / "retype"
    for where in _removals(meta):
        if where[0] == "extra":
            continue
        for new in (None, -1, "x", [], {"kind": "dict"}):
            m = copy.deepcopy(meta)
            node = m
            for k in where[:-1]:
                node = node[k]
            if node[where[-1]] == new and type(node[where[-1]]) is type(new) or (where == ("rule",) and new is None):
                continue                                # rule None is a checkpoint saved without its rule
            node[where[-1]] = new
            _rewrite(path, bad, meta=m)
            try:
                c = load(bad)
            except CheckpointError:
                continue
            if where[0] == "rule":      # another valid hyperparameter is another rule, not corruption
                assert isinstance(c.rule, refopt.core.Rule) and _same(c._replace(rule=ref.rule), ref), where
            else:
                assert _same(c, ref), (where, new)


def _npy(header: dict, payload: bytes = b"", version=(1, 0)) -> bytes:
    out = io.BytesIO()
    getattr(np.lib.format, f"write_array_header_{version[0]}_0")(out, header)
    return out.getvalue() + payload


def _peak_mib(fn) -> float:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / 2 ** 20


def test_absurd_shapes_are_refused_before_allocation(good, tmp_path):
    path, _ = good
    meta = ck.read_metadata(path)
    rec = next(r for r in meta["params"]["leaves"] if r["key"] == "params/w")
    huge = [1 << 20, 1 << 20]                 # 8 TiB of float64
    cases = {
        # the npy header lies, the metadata is honest
        "header": (meta, {"params/w.npy": _npy({"descr": "<f8", "fortran_order": False, "shape": tuple(huge)})},
                   "metadata says"),
        # both lie consistently: the member is far smaller than what they promise
        "both": (_edit(meta, rec, shape=huge),
                 {"params/w.npy": _npy({"descr": "<f8", "fortran_order": False, "shape": tuple(huge)}, b"\0" * 32)},
                 "header promises"),
        "fortran": (meta, {"params/w.npy": _npy({"descr": "<f8", "fortran_order": True, "shape": (2, 2)},
                                                b"\0" * 32)}, "Fortran"),
        "short": (meta, {"params/w.npy": _npy({"descr": "<f8", "fortran_order": False, "shape": (2, 2)},
                                              b"\0" * 31)}, "header promises"),
        "long": (meta, {"params/w.npy": _npy({"descr": "<f8", "fortran_order": False, "shape": (2, 2)},
                                             b"\0" * 33)}, "header promises"),
        "v2": (meta, {"params/w.npy": _npy({"descr": "<f8", "fortran_order": False, "shape": (2, 2)}, b"\0" * 32,
                                           (2, 0))}, "sha256"),
        "object": (_edit(meta, rec, dtype="|O"), None, "numeric numpy dtype"),
        "negative": (_edit(meta, rec, shape=[-1, 4]), None, "shape"),
        "bool-shape": (_edit(meta, rec, shape=[True, 2]), None, "shape"),
    }
    for name, (m, members, msg) in cases.items():
        bad = tmp_path / name
        _rewrite(path, bad, meta=m, members=members)
        assert _peak_mib(lambda: pytest.raises(CheckpointError, load, bad).match(msg)) < 16, name


def _edit(meta, rec, **kw):
    m = copy.deepcopy(meta)
    for r in m["params"]["leaves"]:
        if r.get("key") == rec["key"]:
            r.update(kw)
    return m


def test_zip_directory_claiming_a_huge_member(good, tmp_path):
    data = bytearray(good[0].read_bytes())
    i = data.rindex(b"PK\x01\x02")          # the last central directory entry: patch its sizes
    data[i + 20:i + 28] = (0x7FFFFFF0).to_bytes(4, "little") * 2
    bad = tmp_path / "dir"
    bad.write_bytes(bytes(data))
    assert _peak_mib(lambda: pytest.raises(CheckpointError, load, bad)) < 16


def test_compressed_or_encrypted_members_are_refused(good, tmp_path):
    bad = tmp_path / "deflated"
    _rewrite(good[0], bad, compress=zipfile.ZIP_DEFLATED)
    with pytest.raises(CheckpointError, match="compressed or encrypted"):
        load(bad)
    data = bytearray(good[0].read_bytes())
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):     # set the 'encrypted' flag everywhere
        i = data.find(sig)
        while i >= 0:
            data[i + off] |= 1
            i = data.find(sig, i + 1)
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        load(bad)


def test_no_code_runs_from_an_npy_header(good, tmp_path):
    marker = tmp_path / "pwned"
    header = (b"{'descr': __import__('os').mkdir(%r), 'fortran_order': False, 'shape': (2, 2), }"
              % str(marker).encode())
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    raw = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 32
    bad = tmp_path / "code"
    _rewrite(good[0], bad, members={"params/w.npy": raw})
    with pytest.raises(CheckpointError):
        load(bad)
    assert not marker.exists()


@pytest.mark.parametrize("edit, msg", [
    (lambda m: m["params"]["def"].update(keys=["b", "b"]), "distinct"),
    (lambda m: m["params"]["def"].update(keys=[["b"], "w"]), "distinct"),
    (lambda m: m["state"]["def"].update(kind="set"), "unknown tree node kind"),
    (lambda m: m["state"]["def"].update(fields=["t", "t", "leaves"]), "OptState|fields"),
    (lambda m: m["state"]["def"].update(type=["collections", "X"], fields=["t", "glob", "class"]), "field names"),
    (lambda m: m["state"]["def"].update(type=["collections", "X"], fields=["t", "g", "1x"]), "malformed|fields"),
    (lambda m: m["state"]["def"].update(type=["collections", "X"], fields=["t", "g"]), "fields"),
    (lambda m: m.update(rule={"__rule__": ["refopt.rules.sgd", "SGD"], "fields": {"lr": 0.1}}), "global state|lacks the fields"),
    (lambda m: m["rule"]["fields"].update(bogus=1), "cannot rebuild|fields the class lacks"),
    (lambda m: m.update(rule=[[[[[[[[[[]]]]]]]]]]), "not a refopt rule"),
    (lambda m: m.update(rule={"__tuple__": 5}), "malformed"),
    (lambda m: m.update(extra=[1]), "extra"),
    (lambda m: m["state"]["leaves"][0].update(value=[1]), "Python scalar"),
    (lambda m: m["state"]["leaves"][0].update(value=-1), "t >= 0"),
    (lambda m: m["state"]["leaves"][0].update(value=True), "t >= 0"),
])
def test_malformed_metadata(good, tmp_path, edit, msg):
    m = ck.read_metadata(good[0])
    edit(m)
    bad = tmp_path / "bad"
    _rewrite(good[0], bad, meta=m)
    with pytest.raises(CheckpointError, match=msg):
        load(bad)


def test_deeply_nested_metadata(good, tmp_path):
    bad = tmp_path / "deep"
    with zipfile.ZipFile(good[0]) as zin, zipfile.ZipFile(bad, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name == ck.META_NAME:
                data = data.replace(b'"extra": {', b'"extra": {"x": ' + b"[" * 100000 + b"]" * 100000 + b", ")
            zout.writestr(name, data)
    with pytest.raises(CheckpointError):
        load(bad)


def test_save_and_load_reject_state_arrays_of_other_shapes(tmp_path, monkeypatch):
    p, s = _tiny()
    wrong = s._replace(leaves={**s.leaves, "w": s.leaves["w"]._replace(
        inner=AdamState(np.zeros(3), np.zeros((2, 2))))})
    for rule in (RULE, None):
        with pytest.raises(CheckpointError, match=r"state of w"):
            save(tmp_path / "c", p, wrong, rule)
    wrong32 = s._replace(leaves={**s.leaves, "w": s.leaves["w"]._replace(
        inner=AdamState(np.zeros((2, 2), np.float32), np.zeros((2, 2))))})
    with pytest.raises(CheckpointError, match=r"state of w"):
        save(tmp_path / "c", p, wrong32, RULE)
    assert os.listdir(tmp_path) == []
    # a file written anyway (by a save without the check) is refused by load
    monkeypatch.setattr(ck, "_check_state", lambda *a: None)
    save(tmp_path / "c", p, wrong, RULE)
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match=r"state of w"):
        load(tmp_path / "c")
    with pytest.raises(CheckpointError, match=r"state of w"):
        load(tmp_path / "c", rule=None)
    # the right state still saves and loads, with and without the rule
    save(tmp_path / "c", p, s, None)
    assert load(tmp_path / "c", rule=RULE).rule is RULE


def test_numbers_of_another_numeric_type_in_the_global_state_are_accepted(tmp_path):
    """A schedule may turn a rule's float into an np.float64: such a state is valid (the check compares
    kinds of leaves, not exact Python types), while a string there is not."""
    sf = pytest.importorskip("refopt.rules.schedule_free")
    rule = sf.ScheduleFreeSGD(lr=0.1)
    p = {"w": np.ones(3)}
    s = refopt.init(rule, p)
    s = s._replace(glob=type(s.glob)(s.glob[0], np.float64(s.glob[1]), s.glob[2]))
    save(tmp_path / "c", p, s, rule)
    assert load(tmp_path / "c").state.glob[1] == s.glob[1]
    with pytest.raises(CheckpointError, match="global state"):
        save(tmp_path / "d", p, s._replace(glob=type(s.glob)(s.glob[0], "x", s.glob[2])), rule)
