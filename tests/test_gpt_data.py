"""models.data text corpus: default pydoc_data text, file errors, char vocab, split and batches."""
import hashlib
import sys

import numpy as np
import pytest

from refopt.models.data import CharVocab, default_text, get_batch, load_text, split_ids


def test_default_corpus_provenance():
    c = load_text()
    from pydoc_data.topics import topics
    assert c.text == "\n\n".join(topics[k] for k in sorted(topics))
    assert c.source == "pydoc_data.topics" and c.python_version == sys.version.split()[0]
    assert c.sha256 == hashlib.sha256(c.text.encode("utf-8")).hexdigest()
    assert len(c.text) > 200_000 and "statement" in c.text
    assert 60 < CharVocab(c.text).size < 200
    assert default_text() == c.text


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        load_text(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="directory"):
        load_text(tmp_path)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        load_text(tmp_path / "empty.txt")
    (tmp_path / "bin.dat").write_bytes(b"abc\x00def" * 500)
    with pytest.raises(ValueError, match="binary"):
        load_text(tmp_path / "bin.dat")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 500)
    with pytest.raises(ValueError, match="UTF-8"):
        load_text(tmp_path / "latin1.txt")
    (tmp_path / "short.txt").write_text("hello")
    with pytest.raises(ValueError, match="too short"):
        load_text(tmp_path / "short.txt")
    (tmp_path / "ok.txt").write_text("héllo wörld\n" * 200, encoding="utf-8")
    c = load_text(tmp_path / "ok.txt")
    assert c.text.startswith("héllo") and c.source.endswith("ok.txt")


def test_vocab_roundtrip_and_errors():
    v = CharVocab("banana bread")
    assert v.chars == tuple(sorted(set("banana bread"))) and len(v) == v.size == 7
    ids = v.encode("bread")
    assert ids.dtype == np.int64 and v.decode(ids) == "bread"
    assert v.decode(v.encode(" ")) == " "
    with pytest.raises(ValueError, match="'p'"):
        v.encode("pizza")
    with pytest.raises(ValueError, match="token ids"):
        v.decode([7])


def test_split_and_batches():
    ids = np.arange(1000)
    tr, va = split_ids(ids)
    assert len(tr) == 900 and np.array_equal(tr, ids[:900]) and np.array_equal(va, ids[900:])
    x, y = get_batch(tr, 8, 5, np.random.default_rng(3))
    x2, y2 = get_batch(tr, 8, 5, np.random.default_rng(3))
    assert x.shape == y.shape == (5, 8) and x.dtype == np.int64
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    np.testing.assert_array_equal(y, x + 1)                     # next-token targets
    np.testing.assert_array_equal(np.diff(x, axis=1), 1)        # contiguous windows
    assert x.min() >= 0 and y.max() < 900
    with pytest.raises(ValueError, match="block_size"):
        get_batch(np.arange(8), 8, 2, np.random.default_rng(0))
    with pytest.raises(TypeError, match="Generator"):
        get_batch(tr, 8, 2, 0)
    with pytest.raises(ValueError, match="val_fraction"):
        split_ids(ids, 1.0)
