"""Rprop (refopt/rules/rprop.py) to torch.optim.Rprop and optax.rprop: the same step-size rule (iRprop-), but
optax 0.2.8 returns the update computed at the previous step (none at step 1) and leaves the step size unclipped
where the sign product is 0."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import NO_MAXIMIZE, CliName, Conventions, Example, Oracle, PeerMapping, Preset, scalar
from refopt.golden import GoldenCase
from refopt.rules.rprop import Rprop


class RpropOracle(Oracle):
    """Rprop from the rule's docstring. Switches: ``form`` 'torch' | 'optax' overriding the rule's;
    ``backtrack`` False | True (Riedmiller & Braun's weight backtracking: on a flip, undo the last move);
    ``zeroing`` True | False (Rprop-: the gradient kept on a flip, so the entry moves and the next step compares
    with it, in place of iRprop-'s g = 0)."""

    def init_leaf(self, x, path):
        return {"prev": np.zeros_like(x), "step_size": np.full_like(x, self.rule.lr), "last": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        optax = self.switches.get("form", r.form) == "optax"
        p = g * s["prev"]
        u_old = s["step_size"] * np.sign(s["prev"])
        factor = np.where(p > 0, scalar(r.eta_plus, d), np.where(p < 0, scalar(r.eta_minus, d), scalar(1.0, d)))
        st = np.clip(s["step_size"] * factor, scalar(r.step_size_min, d), scalar(r.step_size_max, d))
        if optax:
            st = np.where(p == 0, s["step_size"], st)
        g_eff = g if self.switches.get("zeroing") is False else np.where(p < 0, scalar(0.0, d), g)
        s["prev"], s["step_size"] = g_eff, st.astype(d)
        if optax:
            u = np.where(p < 0, scalar(0.0, d), u_old)
        else:
            u = np.sign(g_eff) * s["step_size"]
        if self.switches.get("backtrack"):
            u = np.where(p < 0, -s["last"], u)
        s["last"] = u
        return u

    def step_leaf(self, t, s, x, g, path):
        return x - self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "weight backtracking", "on a sign flip the last move is undone (Riedmiller & Braun's "
              "original Rprop) in place of no move", backtrack=True),
            v(rule, "no gradient zeroing after a flip", "Rprop- (Igel & Huesken 2000): on a sign flip the step "
              "size shrinks but the gradient is kept (the entry moves, the next step compares with it), in place "
              "of iRprop-'s g = 0 there", zeroing=False)]


def facts(rule, of):
    """The step depends on g only through signs of g and of g_t g_{t-1}: degree 0 in g; per entry."""
    return {"grad_scale": True, "step_scale_free": False, "elementwise": True}


def _torch_match(rule):
    if type(rule) is not Rprop or rule.form != "torch":
        return None
    return dict(lr=rule.lr, etas=(rule.eta_minus, rule.eta_plus), step_sizes=(rule.step_size_min, rule.step_size_max))


def _optax_match(rule):
    if type(rule) is not Rprop or rule.form != "optax":
        return None
    return dict(learning_rate=rule.lr, eta_minus=rule.eta_minus, eta_plus=rule.eta_plus,
                min_step_size=rule.step_size_min, max_step_size=rule.step_size_max)


def _torch(lr, etas, step_sizes):
    return Rprop(lr=lr, eta_minus=etas[0], eta_plus=etas[1], step_size_min=step_sizes[0], step_size_max=step_sizes[1])


def _optax(learning_rate, eta_minus, eta_plus, min_step_size, max_step_size):
    return Rprop(lr=learning_rate, eta_minus=eta_minus, eta_plus=eta_plus, step_size_min=min_step_size,
                 step_size_max=max_step_size, form="optax")


_STATE = {"prev": "prev", "step_size": "step_size"}
_OSTATE = {"step_size": "step_sizes"}     # optax keeps step * sign(g') in place of g': compared via the params
TORCH = PeerMapping("torch.optim.Rprop", "torch", "Rprop",
                    dict(lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0), maximize=False), _torch, "rprop",
                    refuse={"maximize": NO_MAXIMIZE},
                    ignore=("foreach", "capturable", "differentiable"), state=_STATE, match=_torch_match)
OPTAX = PeerMapping("optax.rprop", "optax", "rprop",
                    dict(eta_minus=0.5, eta_plus=1.2, min_step_size=1e-6, max_step_size=50.0), _optax, "rprop",
                    required=("learning_rate",), state=_OSTATE, match=_optax_match)


def atlas_rprop():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _rules, peer_side

    R = _rules()
    t = _p("torch.Rprop(lr=1e-2)", "torch", "Rprop", dict(lr=1e-2), lambda: R.Rprop(lr=1e-2), state=_STATE)
    o = _p("optax.rprop(1e-2)", "optax", "rprop", dict(learning_rate=1e-2), lambda: R.Rprop(lr=1e-2, form="optax"),
           state=_OSTATE)
    return Entry(
        "rprop-lag", "torch.optim.Rprop (the move of step t at step t) vs optax.rprop (the move computed at step "
        "t - 1, none at step 1)",
        (peer_side("torch", t, source="iRprop- (Igel & Huesken 2000): x_t = x_{t-1} - sign(g'_t) s_t"),
         peer_side("optax", o, source="optax 0.2.8: scale_by_rprop returns its previous prev_updates")),
        (Pair("torch", "optax", "step", 0.1, what="per-step update (median over steps)"),
         Pair("torch", "optax", "final", 1e-2, what="params after 50 steps")),
        "torch follows the papers (Riedmiller & Braun 1993 without backtracking = iRprop-): the step computed from "
        "g_t moves x at step t. optax's update at step t is the one computed at t - 1 (zeroed where the sign flips "
        "at t), so its first step does not move and every later move is one step late.",
        "Riedmiller & Braun 1993 (ICNN); Igel & Huesken 2000 (NC 2000); torch.optim.Rprop; optax.rprop")


CONVENTIONS = Conventions(
    rules=(Rprop,),
    final="sign(g') s with s grown by eta_plus / shrunk by eta_minus on the sign of g_t g_{t-1}: the factors, "
          "the clipping, no move on a flip (or a backtrack), or which step's move is applied",
    per_step="the step sizes (state) and the previous gradient's sign",
    mappings=(TORCH, OPTAX),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        TORCH.preset("torch.Rprop", dict(lr=1e-2), "s = clip(s eta), eta by sign(g g_prev); x - sign(g') s"),
        TORCH.preset("torch.Rprop(etas,step_sizes)", dict(lr=5e-3, etas=(0.3, 1.5), step_sizes=(1e-4, 0.02)),
                     "etas (0.3, 1.5); step sizes clipped to [1e-4, 0.02]"),
        OPTAX.preset("optax.rprop", dict(learning_rate=1e-2), "the previous step's move (none at step 1)"),
        OPTAX.preset("optax.rprop(etas,bounds)", dict(learning_rate=5e-3, eta_minus=0.3, eta_plus=1.5,
                                                      min_step_size=1e-4, max_step_size=0.02),
                     "eta_minus 0.3, eta_plus 1.5, [1e-4, 0.02]"),
    ),
    wrong=(Preset("WRONG lag: optax.rprop vs refopt Rprop(form='torch')", "optax", "rprop",
                  ("rprop", dict(learning_rate=1e-2)), lambda: Rprop(lr=1e-2),
                  "the move of step t vs the move of step t - 1", state=_OSTATE, expect_fail=True),),
    oracle=RpropOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("rprop", lambda: Rprop(lr=1e-2), "torch.optim.Rprop's defaults", ("prev", "step_size")),
            GoldenCase("rprop_optax_bounds", lambda: Rprop(lr=5e-3, eta_minus=0.3, eta_plus=1.5, step_size_min=1e-4,
                                                           step_size_max=0.02, form="optax"),
                       "optax.rprop, etas (0.3, 1.5), step sizes in [1e-4, 0.02]", ("prev", "step_size"))),
    examples=(Example("rprop", lambda: Rprop(lr=0.01)),
              Example("rprop_optax", lambda: Rprop(lr=0.01, step_size_max=1.0, form="optax"))),
    atlas=(atlas_rprop,),
)
