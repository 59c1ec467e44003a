"""Pytree helpers (refopt.tree): paths, flatten/unflatten round trips, dict order, mismatch errors."""
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refopt import tree as T


class Pair(NamedTuple):
    first: object
    second: object


class Other(NamedTuple):
    first: object
    second: object


def arr(*shape, v=0.0, dtype=np.float64):
    return np.full(shape, v, dtype)


# ---------------------------------------------------------------- paths and order

def test_paths_of_nested_containers():
    tree = {"layers": [{"w": arr(2, 3), "b": arr(3)}, {"w": arr(3, 1), "b": arr(1)}],
            "pair": Pair(arr(1), (arr(1), arr(2))), "none": None}
    assert T.paths(tree) == ["layers[0].b", "layers[0].w", "layers[1].b", "layers[1].w",
                             "pair.first", "pair.second[0]", "pair.second[1]"]


def test_path_of_bare_array_is_root():
    leaves, paths, td = T.flatten(arr(3))
    assert paths == [T.ROOT] and len(leaves) == 1 and td.kind == "leaf"


def test_non_identifier_and_int_keys():
    tree = {"a b": arr(1), 3: arr(1), "ok": arr(1)}
    assert set(T.paths(tree)) == {"['a b']", "[3]", "ok"}


def test_dict_keys_visited_sorted_whatever_insertion_order():
    a = {"z": arr(1, v=1), "a": arr(1, v=2), "m": arr(1, v=3)}
    b = {"m": arr(1, v=3), "z": arr(1, v=1), "a": arr(1, v=2)}
    la, pa, ta = T.flatten(a)
    lb, pb, tb = T.flatten(b)
    assert pa == pb == ["a", "m", "z"]
    assert [float(x[0]) for x in la] == [float(x[0]) for x in lb] == [2.0, 3.0, 1.0]
    assert ta == tb


def test_none_is_empty_container():
    leaves, paths, td = T.flatten({"a": None, "b": arr(2)})
    assert paths == ["b"] and len(leaves) == 1
    back = T.unflatten(td, leaves)
    assert back["a"] is None and back["b"] is leaves[0]
    assert T.flatten(None)[0] == []
    assert T.unflatten(T.structure(None), []) is None


# ---------------------------------------------------------------- round trips

def test_round_trip_keeps_container_types():
    tree = {"l": [arr(1), (arr(2), Pair(arr(3), None))], "t": (arr(4),), "nt": Pair([], {})}
    leaves, _, td = T.flatten(tree)
    back = T.unflatten(td, leaves)
    assert type(back["l"]) is list and type(back["l"][1]) is tuple
    assert type(back["l"][1][1]) is Pair and back["l"][1][1].second is None
    assert type(back["t"]) is tuple and len(back["t"]) == 1
    assert type(back["nt"]) is Pair and back["nt"].first == [] and back["nt"].second == {}
    assert all(a is b for a, b in zip(T.leaves(back), leaves))


def test_unflatten_with_new_leaves():
    tree = [arr(1), {"x": arr(2)}]
    _, _, td = T.flatten(tree)
    back = T.unflatten(td, ["A", "B"])
    assert back == ["A", {"x": "B"}]


def test_unflatten_too_many_leaves_raises():
    td = T.structure([arr(1), arr(1)])
    with pytest.raises(ValueError):
        T.unflatten(td, [1, 2, 3])


def test_unflatten_too_few_leaves_raises_valueerror():
    # a ValueError, not a bare StopIteration from inside unflatten
    td = T.structure([arr(1), arr(1)])
    with pytest.raises(ValueError):
        T.unflatten(td, [1])


_leaf = st.builds(lambda n: np.arange(n, dtype=np.float64), st.integers(0, 3))
_trees = st.recursive(
    _leaf | st.none(),
    lambda ch: st.lists(ch, max_size=3) | st.lists(ch, max_size=3).map(tuple)
    | st.dictionaries(st.sampled_from(["a", "b", "c d", "w"]), ch, max_size=3)
    | st.tuples(ch, ch).map(lambda p: Pair(*p)),
    max_leaves=8)


def _same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is None and b is None


@settings(max_examples=60, deadline=None)
@given(_trees)
def test_round_trip_property(tree):
    leaves, paths, td = T.flatten(tree)
    assert len(paths) == len(leaves) == len(set(paths))
    assert _same(T.unflatten(td, leaves), tree)
    assert T.structure(T.unflatten(td, leaves)) == td


# ---------------------------------------------------------------- tree_map and checks

def test_tree_map_several_trees():
    a = {"x": arr(2, v=1.0), "y": [arr(1, v=2.0)]}
    b = {"y": [arr(1, v=5.0)], "x": arr(2, v=3.0)}
    out = T.tree_map(lambda p, q: p + q, a, b)
    np.testing.assert_array_equal(out["x"], [4.0, 4.0])
    np.testing.assert_array_equal(out["y"][0], [7.0])


def test_tree_map_structure_mismatch_names_path():
    with pytest.raises(ValueError, match=r"y\[0\]"):
        T.tree_map(lambda p, q: p, {"y": [arr(1)]}, {"y": [[arr(1)]]})


def test_check_like_ok():
    T.check_like({"a": [arr(2)]}, {"a": [arr(2)]})


def test_check_like_shape_names_leaf():
    p = {"layers": [{"w": arr(2, 2)}, {"w": arr(2, 3)}]}
    g = {"layers": [{"w": arr(2, 2)}, {"w": arr(3, 2)}]}
    with pytest.raises(ValueError, match=r"layers\[1\]\.w") as e:
        T.check_like(p, g)
    assert "(2, 3)" in str(e.value) and "(3, 2)" in str(e.value)


def test_check_like_dtype_names_leaf():
    p = {"layers": [{"w": arr(2)}, {"w": arr(2)}]}
    g = {"layers": [{"w": arr(2)}, {"w": arr(2, dtype=np.float32)}]}
    with pytest.raises(ValueError, match=r"layers\[1\]\.w") as e:
        T.check_like(p, g)
    assert "float32" in str(e.value)


def test_check_like_structure():
    p = {"layers": [{"w": arr(2)}, {"w": arr(2)}]}
    with pytest.raises(ValueError, match=r"layers\[1\]\.w"):
        T.check_like(p, {"layers": [{"w": arr(2)}, {"w": [arr(2)]}]})
    with pytest.raises(ValueError, match=r"layers\[1\]") as e:
        T.check_like(p, {"layers": [{"w": arr(2)}, {"v": arr(2)}]})
    assert "'w'" in str(e.value) and "'v'" in str(e.value)
    with pytest.raises(ValueError, match=r"layers.*length 2 vs 1"):
        T.check_like(p, {"layers": [{"w": arr(2)}]})
    with pytest.raises(ValueError, match="Pair vs Other"):
        T.check_like(Pair(arr(1), arr(1)), Other(arr(1), arr(1)))
    with pytest.raises(ValueError, match="tuple vs list"):
        T.check_like((arr(1),), [arr(1)])


def test_check_like_rejects_non_arrays_and_int_dtype():
    with pytest.raises(TypeError, match=r"a\[0\]"):
        T.check_like({"a": [1.0]}, {"a": [1.0]})
    with pytest.raises(TypeError, match="int64"):
        T.check_like({"a": np.zeros(2, np.int64)}, {"a": np.zeros(2, np.int64)})


def test_flatten_up_to_names_path():
    td = T.structure({"a": [arr(1), arr(1)]})
    assert T.flatten_up_to(td, {"a": [Pair(1, 2), Pair(3, 4)]}) == [Pair(1, 2), Pair(3, 4)]
    with pytest.raises(ValueError, match=r"a"):
        T.flatten_up_to(td, {"a": [Pair(1, 2)]})


def test_copy_and_zeros_like():
    a = {"x": [arr(2, v=3.0)]}
    c = T.copy(a)
    assert c["x"][0] is not a["x"][0]
    np.testing.assert_array_equal(c["x"][0], a["x"][0])
    z = T.zeros_like(a)
    assert z["x"][0].dtype == np.float64 and not z["x"][0].any()


def test_from_paths_rebuilds_a_tree_of_dicts_and_lists():
    tree = {"layers": [{"w": np.ones((2, 3)), "b": np.zeros(3)}, {"w": np.ones((3, 1))}], "x y": np.ones(1),
            "wte": np.ones((4, 2))}
    leaves, paths, _ = T.flatten(tree)
    back = T.from_paths(paths, leaves)
    assert T.flatten(back)[1] == paths and all(a is b for a, b in zip(T.flatten(back)[0], leaves))
    # paths in any order: the dicts flatten in sorted order whatever the order given
    assert T.flatten(T.from_paths(paths[::-1], leaves[::-1]))[1] == paths
    assert T.from_paths([T.ROOT], [leaves[0]]) is leaves[0]
    assert T.flatten(T.from_paths(["[0]", "[1]"], [1, 2]))[1] == ["[0]", "[1]"]


@pytest.mark.parametrize("paths, match", [
    (["a", "a"], "do not nest at 'a'"), (["a", "a.b"], "do not nest at 'a.b'"), (["a.b", "a"], "do not nest at 'a'"),
    ([".a"], "cannot read"), (["a..b"], "cannot read"), (["a[x]"], "cannot read"), (["[1]"], "indices of the root"),
    (["a", "[0]"], "names and indices"), (["a[0]", "a[2]"], "indices of a are \\[0, 2\\]")])
def test_from_paths_refuses_paths_that_name_no_tree(paths, match):
    with pytest.raises(ValueError, match=match):
        T.from_paths(paths, [np.ones(1)] * len(paths))


def test_named_adapter_keeps_the_callers_order():
    """The stream's leaves w, v, b, tiny flatten as b, tiny, v, w in a dict: Named hands the rule that tree and
    gives back lists (params and state) in the caller's order; a rule that reads names sees them."""
    import refopt
    from refopt.testing.adapters import Named, RuleAdapter
    paths = ["w", "v", "b", "tiny"]
    xs = [np.full((2, 2), 1.0), np.full((3,), 2.0), np.full((4,), 3.0), np.full((1,), 4.0)]
    gs = [np.full_like(x, k + 1.0) for k, x in enumerate(xs)]
    seen = set()
    rule = refopt.AdamMini(lr=0.1, decay_mask=lambda p, x: seen.add(p) or True)
    a = Named(RuleAdapter(rule), paths)
    new, s = a.step(a.init(xs), xs, gs)
    want, _ = refopt.update(rule, refopt.init(rule, dict(zip(paths, xs))), dict(zip(paths, xs)), dict(zip(paths, gs)))
    assert [x.shape for x in new] == [x.shape for x in xs] and all(np.array_equal(new[i], want[p])
                                                                   for i, p in enumerate(paths))
    assert [m.shape for m in a.state_arrays(s)["m"]] == [x.shape for x in xs] and seen == set(paths)
