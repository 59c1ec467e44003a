"""The conventions registry (refopt/conventions/): every exported rule owns a conventions file with a golden
case, a plain-numpy oracle, its invariance facts and a peer mapping (or the reason there is none); each
oracle reproduces its compiled rule on every golden case and example; refopt.like reproduces the peers'
calls with their own argument names and defaults, and refuses what it cannot reproduce."""
import ast
import os
from dataclasses import dataclass

import numpy as np
import pytest

import refopt
from refopt.conventions import Conventions, facts, for_rule, like, missing, oracle, peers, registry
from refopt.crosscheck.problems import make_problem
from refopt.golden import GoldenCase
from refopt.rules.base import ElementwiseRule
from refopt.rules.lion import Lion

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_exported_rule_has_complete_conventions():
    assert missing() == []
    assert {c.__name__ for c in refopt.rules.exported_rules()} >= {"SGD", "Adam", "AdamW", "Lion", "Muon", "RMSprop"}


def test_registry_check_catches_a_rule_without_conventions():
    """Negative control: a rule class with no conventions file, and one whose file lacks parts."""
    @dataclass(frozen=True)
    class Unregistered(ElementwiseRule):
        lr: float = 0.1

    assert missing([Unregistered]) == ["Unregistered: no conventions file (refopt/conventions/<rule>.py with "
                                       "CONVENTIONS)"]
    bare = Conventions(rules=(Unregistered,))
    registry()["_test_bare"] = bare
    try:
        got = missing([Unregistered])
    finally:
        del registry()["_test_bare"]
    assert "Unregistered: no golden case" in got and "Unregistered: no plain-numpy oracle" in got
    assert "Unregistered: no invariance facts" in got
    assert any("no torch mapping" in m for m in got) and any("no optax mapping" in m for m in got)


def _cases():
    out = []
    for name, conv in registry().items():
        for g in conv.golden:
            out.append(pytest.param(g.make_rule, "matrix" if g.matrix_only else "list", id=f"golden-{g.name}"))
        for e in conv.examples:
            if "leaf_rule" not in e.extra:
                out.append(pytest.param(e.make_rule, e.params, id=f"example-{e.name}"))
    return out


def _params(kind, dtype, seed=0):
    from refopt.conventions._spec import example_params
    if kind in ("mixed", "matrix", "conv"):
        return example_params(kind, dtype, seed)
    prob = make_problem("quadratic", dtype, seed)
    return list(prob.leaves)


def _stand_in_loss(params) -> float:
    """A loss value for the rules that take one (``value=``), on a gradient stream that has none: 1 + ||x||^2 / 2,
    the same for both sides of a comparison."""
    return 1.0 + 0.5 * sum(float(np.sum(np.asarray(a, np.float64) ** 2)) for a in refopt.tree.flatten(params)[0])


def _stand_in_closure(params):
    """The stand-in loss and its gradient (x itself) at other params, for the rules that evaluate it (L-BFGS)."""
    return _stand_in_loss(params), refopt.tree.tree_map(lambda a: np.array(a, copy=True), params)


def _run(adapter, params, grads):
    s = adapter.init(params)
    x = params
    out = []
    for g in grads:
        extra = {"value": _stand_in_loss(x)} if "value" in getattr(adapter, "inputs", ()) else {}
        if "closure" in getattr(adapter, "inputs", ()):
            extra["closure"] = _stand_in_closure
        x, s = adapter.step(s, x, g, **extra)
        out.append([np.array(a) for a in refopt.tree.flatten(x)[0]])
    return out


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = float(np.max(np.abs(a - b))) if a.size else 0.0
    return 0.0 if d == 0 else d / max(float(np.max(np.abs(b))), 1e-300)


def _grads(params, steps, dtype, seed=1, scale=1.0):
    rng = np.random.default_rng(seed)
    leaves, _, td = refopt.tree.flatten(params)
    return [refopt.tree.unflatten(td, [(scale * rng.standard_normal(x.shape)).astype(dtype) for x in leaves])
            for _ in range(steps)]


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("make_rule,kind", _cases())
def test_the_oracle_reproduces_the_compiled_rule(make_rule, kind, dtype, tol):
    """The plain-numpy restatement of each rule's equations (its conventions file's oracle) against refopt's
    compiled rule: 12 steps of a random gradient stream, params after every step."""
    from refopt.testing.adapters import RuleAdapter

    rule = make_rule()
    if isinstance(rule, refopt.LRTable):
        kind = "list"
    params = _params(kind, dtype)
    grads = _grads(params, 12, dtype)
    ref = _run(RuleAdapter(rule), params, grads)
    got = _run(oracle(rule), params, grads)
    worst = max(_rel(a, b) for xs, ys in zip(got, ref) for a, b in zip(xs, ys))
    assert worst <= tol, f"{rule}: oracle differs from the rule by {worst:.3g}"


@pytest.mark.parametrize("make_rule,switch", [
    (lambda: refopt.Adam(lr=0.01), dict(eps_mode="inside")),
    (lambda: refopt.AdamW(lr=0.01, weight_decay=0.1), dict(decay="after")),
    (lambda: refopt.SGD(lr=0.05, momentum=0.9, dampening=0.3), dict(dampen_first=True)),
    (lambda: refopt.Lion(lr=0.01), dict(order="momentum_first")),
    (lambda: refopt.RMSprop(lr=0.01), dict(eps_mode="inside")),
    (lambda: refopt.Adagrad(lr=0.05, eps=1e-3), dict(eps_mode="inside")),
    (lambda: refopt.Adamax(lr=0.05, eps=1e-3), dict(eps_mode="outside")),
])
def test_a_switched_oracle_is_caught(make_rule, switch):
    """Negative control of the oracle test: one convention switched differs from the rule by far more than
    the tolerance."""
    from refopt.testing.adapters import RuleAdapter

    rule = make_rule()
    params = _params("mixed", np.float64)
    grads = _grads(params, 12, np.float64, scale=1e-6)
    ref = _run(RuleAdapter(rule), params, grads)
    got = _run(oracle(rule, **switch), params, grads)
    assert max(_rel(a, b) for xs, ys in zip(got, ref) for a, b in zip(xs, ys)) > 1e-9


def test_like_reproduces_the_peers_calls_with_their_defaults():
    A, AW, M = refopt.Adam, refopt.AdamW, refopt.Muon
    assert like("torch.optim.AdamW", lr=1e-3, weight_decay=0.1) == AW(lr=1e-3, weight_decay=0.1)
    assert like("torch.optim.AdamW") == AW(lr=1e-3, weight_decay=1e-2)                   # torch's defaults
    assert like("optax.adamw", learning_rate=1e-3) == AW(lr=1e-3, weight_decay=1e-4)       # optax's decay 1e-4
    assert like("torch.optim.Adam", lr=0.01, betas=(0.8, 0.99)) == A(lr=0.01, beta1=0.8, beta2=0.99)
    assert like("torch.optim.NAdam", lr=0.01) == A(lr=0.01, nesterov=True, momentum_decay=4e-3)
    assert like("optax.nadam", learning_rate=0.01) == A(lr=0.01, nesterov=True)
    assert like("optax.lion", learning_rate=0.01) == Lion(lr=0.01, weight_decay=1e-3)
    assert like("torch.optim.Muon", lr=0.02, adjust_lr_fn="match_rms_adamw") == M.like_torch(
        lr=0.02, adjust_lr_fn="match_rms_adamw")
    assert like("torch.optim.Muon", lr=0.02).scale == "jordan" and like("torch.optim.Muon").weight_decay == 0.1
    assert like("torch.optim.RMSprop", lr=0.01, centered=True) == refopt.RMSprop(lr=0.01, centered=True)
    assert like("torch.optim.SGD", lr=0.1, foreach=False) == refopt.SGD(lr=0.1)            # foreach changes no number
    assert refopt.like is not None and refopt.like("optax.sgd", learning_rate=0.1) == refopt.SGD(lr=0.1)


def test_every_preset_is_like_of_its_peer_call():
    """A row checks like(peer, ...), or, in another family than the mapping's, where a different refopt rule
    agrees with that peer (Covariant against optax.lamb/lars), on the problems it names with the reason."""
    from refopt.crosscheck.presets import PRESETS
    known = peers()
    others = []
    for p in PRESETS:
        m = next(m for m in known.values() if (m.adapter, m.ctor) == (p.peer, p.peer_call[0]))
        kw = {k: v for k, v in p.peer_call[1].items() if k != "float64_warmup"}
        if p.make_rule() != like(m.peer, **kw):
            assert p.family != m.family and p.problems and p.problems_why, p.name
            others.append(p.name)
    assert sorted(others) == ["optax.lamb(weight_decay=0)", "optax.lars(momentum=0,trust_coefficient=1)"]


@pytest.mark.parametrize("peer,kwargs,words", [
    ("torch.optim.Adamm", {}, ["unknown peer 'torch.optim.Adamm'", "torch.optim.Adam,"]),
    ("torch.optim.Adam", {"maximize": True}, ["maximize=True", "refopt minimises"]),
    ("torch.optim.Adam", {"nesterov": True}, ["no argument 'nesterov'"]),
    ("optax.adam", {"learning_rate": 0.1, "eps_root": 1e-8}, ["eps_root=1e-08", "after the square root"]),
    ("optax.adam", {}, ["needs the argument(s) learning_rate"]),
    ("optax.lars", {"learning_rate": 0.1, "trust_ratio_mask": False}, ["trust_ratio_mask=False", "Partition"]),
    ("optax.contrib.muon", {"learning_rate": 0.1, "consistent_rms": 0.3}, ["consistent_rms=0.3"]),
])
def test_like_refuses_with_the_argument_and_the_reason(peer, kwargs, words):
    with pytest.raises(ValueError) as e:
        like(peer, **kwargs)
    for w in words:
        assert w in str(e.value)


def test_like_in_rule_expressions():
    from refopt.crosscheck.expr import parse_rule
    assert parse_rule('like("torch.optim.RMSprop", lr=0.01, centered=True)') == refopt.RMSprop(lr=0.01, centered=True)


def test_the_facts_of_wrappers_follow_their_base():
    assert facts(refopt.Covariant(refopt.SGD(), lr=0.1))["covariant"] is True
    assert facts(refopt.Covariant(refopt.SGD(weight_decay=0.1), lr=0.1))["covariant"] is False
    assert for_rule(refopt.AdamW) is for_rule(refopt.Adam)


LAYERS = ("refopt/crosscheck", "refopt/testing", "refopt/golden.py", "refopt/cli")


def _name_comparisons(source: str) -> list[int]:
    """Lines comparing a class name (``....__name__``, or a name bound to one in the same function) with a
    string, or calling a string method on one (``type(r).__name__.startswith("Schedule")``)."""
    tree = ast.parse(source)
    lines = set()
    def own(scope):   # the nodes of a scope, not those of the functions nested in it
        out, todo = [], list(ast.iter_child_nodes(scope))
        while todo:
            n = todo.pop()
            out.append(n)
            if not isinstance(n, (ast.FunctionDef, ast.Lambda)):
                todo.extend(ast.iter_child_nodes(n))
        return out

    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda))]
    for scope in scopes:
        body = own(scope)
        bound = {t.id for node in body if isinstance(node, ast.Assign) for t in node.targets
                 if isinstance(t, ast.Name)
                 if any(isinstance(a, ast.Attribute) and a.attr == "__name__" for a in ast.walk(node.value))}

        def is_name(node):
            return any((isinstance(a, ast.Attribute) and a.attr == "__name__")
                       or (isinstance(a, ast.Name) and a.id in bound) for a in ast.walk(node))

        for node in body:
            if isinstance(node, ast.Compare) and is_name(node.left) and any(
                    isinstance(c, ast.Constant) and isinstance(c.value, str)
                    for cmp in node.comparators for c in ast.walk(cmp)):
                lines.add(node.lineno)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("startswith", "endswith") and is_name(node.func.value):
                lines.add(node.lineno)
    return sorted(lines)


def test_the_class_name_scan_catches_its_negative_controls():
    assert _name_comparisons("if type(r).__name__ == 'Muon':\n    pass") == [1]
    assert _name_comparisons("n = type(r).__name__\nx = n in ('Adam', 'AdamW')") == [2]
    assert _name_comparisons("n = type(r).__name__\nok = n.startswith('ScheduleFree')") == [2]
    assert _name_comparisons("if isinstance(r, Muon):\n    pass") == []
    assert _name_comparisons("if __name__ == '__main__':\n    pass") == []
    assert _name_comparisons("def f(r):\n    n = type(r).__name__\n\ndef g(n):\n    return n == 'x'") == []


def test_no_layer_picks_behaviour_by_a_class_name_string():
    """Nothing in crosscheck, testing, golden or the CLI compares type(...).__name__ with a string."""
    bad = []
    for layer in LAYERS:
        path = os.path.join(ROOT, layer)
        files = [path] if path.endswith(".py") else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
                                                     if f.endswith(".py")]
        for f in files:
            bad += [f"{os.path.relpath(f, ROOT)}:{n}" for n in _name_comparisons(open(f, encoding="utf-8").read())]
    assert bad == []


def test_golden_cases_are_registered_once():
    names = [g.name for c in registry().values() for g in c.golden]
    assert len(names) == len(set(names)) and all(isinstance(g, GoldenCase) for c in registry().values()
                                                 for g in c.golden)


def test_the_generated_conventions_page_is_current():
    """docs/conventions_generated.md is `python -m refopt.conventions`: regenerate it when a conventions file
    changes."""
    from refopt.conventions import markdown
    with open(os.path.join(ROOT, "docs", "conventions_generated.md"), encoding="utf-8") as f:
        assert f.read() == markdown()


def test_the_presets_table_of_crosscheck_md_is_generated_and_current(tmp_path):
    """docs/crosscheck.md's table of checked calls is `python -m refopt.conventions --presets docs/crosscheck.md`:
    every preset, wrong row and gap appears once; a hand edit inside the markers is undone by the command."""
    import subprocess
    import sys

    from refopt.conventions import PRESETS_BEGIN, PRESETS_END, presets_markdown
    from refopt.crosscheck.presets import KNOWN_GAPS, MISCONFIGURED, PRESETS
    with open(os.path.join(ROOT, "docs", "crosscheck.md"), encoding="utf-8") as f:
        text = f.read()
    block = PRESETS_BEGIN + text.split(PRESETS_BEGIN)[1].split(PRESETS_END)[0] + PRESETS_END + "\n"
    assert block == presets_markdown()
    rows = [line for line in block.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == len(PRESETS) + len(MISCONFIGURED) + len(KNOWN_GAPS)
    edited = tmp_path / "crosscheck.md"
    edited.write_text(text.replace(rows[0], "| hand-edited |"), encoding="utf-8")
    subprocess.run([sys.executable, "-m", "refopt.conventions", "--presets", str(edited)], check=True, cwd=ROOT)
    assert edited.read_text(encoding="utf-8") == text


def _columns(row):
    """The number of cells of a Markdown table row: the ``|`` not escaped as ``\\|``."""
    import re
    return len(re.findall(r"(?<!\\)\|", row)) - 1


@pytest.mark.parametrize("page", ["crosscheck.md", "conventions_generated.md"])
def test_every_generated_table_row_has_its_header_s_columns(page):
    """A ``|`` in a cell (``|g|``, ``||x||``) is escaped, so no row of a generated table splits into more
    columns than its header; negative control: the same row unescaped has more."""
    from refopt.conventions import _cell
    with open(os.path.join(ROOT, "docs", page), encoding="utf-8") as f:
        lines = f.read().splitlines()
    checked = 0
    for i, line in enumerate(lines):
        if line.startswith("|---"):
            header = _columns(lines[i - 1])
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                assert _columns(lines[j]) == header, (page, lines[j])
                j += 1
                checked += 1
    assert checked > 50
    row = f"| `x` | `y` | all | {_cell('a step of size |g|')} |"
    assert _columns(row) == 4 and _columns(row.replace("\\|", "|")) == 6


def test_the_command_line_names_come_from_the_registry(tmp_path, capsys):
    """`refopt train --optimizer rmsprop` (declared in refopt/conventions/rmsprop.py) builds the rule from the
    options given, the rule's defaults otherwise; an option the rule does not use is refused."""
    import json

    from refopt.cli import main
    from refopt.cli.optimizers import OPTIMIZERS
    assert {"lion", "rmsprop"} <= set(OPTIMIZERS)
    out = tmp_path / "r"
    assert main(["train", "--model", "mlp", "--out", str(out), "--optimizer", "rmsprop", "--momentum", "0.5",
                 "--steps", "2", "--no-progress"]) == 0
    rule = json.loads((out / "config.json").read_text())["rule"]
    text = json.dumps(rule)
    assert '"momentum": 0.5' in text and '"alpha": 0.99' in text and '"eps": 1e-08' in text
    assert main(["train", "--model", "mlp", "--out", str(tmp_path / "x"), "--optimizer", "rmsprop", "--beta1", "0.8",
                 "--steps", "2", "--no-progress"]) == 2
    assert "--beta1 does not apply to --optimizer rmsprop" in capsys.readouterr().err
