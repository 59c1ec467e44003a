"""Rule expressions (refopt.crosscheck.expr): parsed with ast, never evaluated; constructors resolved from
refopt.__all__ and refopt.schedules; to_expr round-trips."""
import dataclasses

import pytest

import refopt
from refopt.crosscheck.expr import ExprError, constructors, parse_rule, to_expr
from refopt.schedules import warmup_cosine


@pytest.mark.parametrize("text,rule", [
    ("AdamW(lr=1e-3, weight_decay=0.1)", refopt.AdamW(lr=1e-3, weight_decay=0.1)),
    ("Adam(lr=1e-3, beta2=0.95)", refopt.Adam(lr=1e-3, beta2=0.95)),
    ("Hyperball(Muon(lr=0.02), lr=0.1)", refopt.Hyperball(refopt.Muon(lr=0.02), lr=0.1)),
    ("Muon.like_torch(lr=0.02)", refopt.Muon.like_torch(lr=0.02)),
    ("AdamW(lr=1e-2, schedule=warmup_cosine(3, 20, 0.1))", refopt.AdamW(lr=1e-2, schedule=warmup_cosine(3, 20, 0.1))),
    ("Covariant(SGD(momentum=-0.0), lr=0.01)", refopt.Covariant(refopt.SGD(), lr=0.01)),
    ("Partition({'matrix': Muon(), 'other': AdamW()}, labels=matrix_labels)",
     refopt.Partition({"matrix": refopt.Muon(), "other": refopt.AdamW()}, labels=refopt.matrix_labels)),
])
def test_parse_and_round_trip(text, rule):
    got = parse_rule(text)
    assert got == rule
    assert parse_rule(to_expr(got)) == rule


def test_constructors_are_resolved_dynamically(monkeypatch):
    """A rule class added to refopt.__all__ later (e.g. Lion) is accepted without editing the parser."""
    @dataclasses.dataclass(frozen=True)
    class Lion(refopt.Rule):
        lr: float = 1e-4
    monkeypatch.setattr(refopt, "Lion", Lion, raising=False)
    monkeypatch.setattr(refopt, "__all__", [*refopt.__all__, "Lion"])
    assert "Lion" in constructors() and parse_rule("Lion(lr=3e-4)") == Lion(lr=3e-4)
    assert "Rule" not in constructors() and "msign" not in constructors()


@pytest.mark.parametrize("text,match", [
    ("__import__('os').system('true')", "only refopt rule"),
    ("open('x')", "unknown constructor 'open'"),
    ("AdamW(lr=x)", "unknown name 'x'"),
    ("AdamW(lr=1+2)", "BinOp is not allowed"),
    ("AdamW(lr=(lambda: 1)())", "only refopt rule"),
    ("SGD(**{'lr': 1})", r"\*\*kwargs"),
    ("SGD().lr", "Attribute is not allowed"),
    ("Muon.__init__(lr=1)", "only refopt rule"),
    ("SGD(lr=-1)", "lr must be >= 0"),
    ("SGD(lr=0.1", "cannot parse"),
    ("warmup_cosine(3, 20)", "is not a refopt rule"),
    ("", "empty"),
    ("[x for x in ()]", "not allowed"),
])
def test_rejections(text, match):
    with pytest.raises(ExprError, match=match):
        parse_rule(text)
    assert issubclass(ExprError, ValueError)
