"""LRTable (refopt/rules/lr_table.py; post 002's replayed eta_eff): no peer ships it."""
from __future__ import annotations

from refopt.conventions._spec import Conventions, Oracle, norm64, scalar
from refopt.golden import GoldenCase
from refopt.rules.lr_table import LRTable
from refopt.rules.sgd import SGD


class LRTableOracle(Oracle):
    """x_t = x_{t-1} - lr_t[p] u_t for an array p with a row (lr_t[p] = lrs[p][t-1], times ||x_{t-1}||_F when
    ``relative``), the base rule's own step otherwise; u_t the base rule's direction (its oracle)."""

    def __init__(self, rule, name=None, **sw):
        from refopt.conventions import oracle
        super().__init__(rule, name, **sw)
        self.base = sw.get("base") or oracle(rule.base)

    def init_leaf(self, x, path):
        return {"base": self.base.init_leaf(x, path)}

    def step_leaf(self, t, s, x, g, path):
        row = self.rule.lrs.get(path)
        if row is None:
            return self.base.step_leaf(t, s["base"], x, g, path)
        lr = row[t - 1] * (norm64(x) if self.rule.relative else 1.0)
        return x - scalar(lr, x.dtype) * self.base.direction_leaf(t, s["base"], x, g, path)


def facts(rule, of):
    """A recorded lr per array and step: no invariance is stated (the table is tied to one run)."""
    return {}


_ROW = tuple(0.05 * 0.97 ** k for k in range(50))
CONVENTIONS = Conventions(
    rules=(LRTable,),
    final="the base's step",
    per_step="the lr table entry of the step",
    no_peer={"torch": "no peer replays a recorded lr table", "optax": "no peer replays a recorded lr table",
             "schedulefree": "no peer replays a recorded lr table"},
    oracle=LRTableOracle,
    variants=lambda rule: [],
    facts=facts,
    golden=(GoldenCase("lr_table_sgd", lambda: LRTable(SGD(lr=0.1, momentum=0.9), lrs={"[0]": _ROW}),
                       "LRTable: the first array follows a recorded lr per step, the others SGD's lr", ("base.b",),
                       problems=("quadratic", "stream")),),
)
