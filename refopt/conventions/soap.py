"""SOAP (refopt/rules/soap.py) to pytorch_optimizer.SOAP 4.1.0: torch's (out, in) layout (SOAP preconditions
every axis alike, so the transposes take the same steps), the first step only building the factors, the
weight decay applied after the step, the basis refreshed by one power iteration every precondition_frequency
Adam steps with v permuted to the new order.

Eigenbases. pytorch_optimizer calls ``torch.linalg.eigh`` on the first factors and runs the refresh's QR in
float32 (``power_iter.to(torch.float32)``). The first factors of an m x n gradient with m > n + 1 have a
repeated zero eigenvalue whose eigenvectors the solver picks from rounding noise, so the package's steps
depend on its BLAS (the atlas entry soap-eigenbasis measures it). :func:`pytorch_optimizer_soap` runs the
package with refopt's canonical eigenbasis and float64 refresh (a subclass replacing its two linear-algebra
methods); docs/factories/soap.py drives it from ``refopt crosscheck --impl``. torch.optim and optax ship no
SOAP."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (BETAS2, NO_MAXIMIZE, ROUNDING_GOLDEN, SOAP_ROUNDING, CliName, Conventions,
                                      Example, Oracle, PeerMapping, Preset, counted, gamma, is_number, scalar)
from refopt.golden import GoldenCase
from refopt.linalg.eigen import CLUSTER_ULPS, complete_basis, eigh_descending
from refopt.rules.soap import SOAP, soap_axes


def _mode(a, q, i, back=False):
    """a x_i q^T (back: a x_i q): axis i of a contracted with the rows (back: the columns) of q."""
    return np.moveaxis(np.tensordot(q if back else q.T, a, axes=([1], [i])), 0, i)


class SOAPOracle(Oracle):
    """SOAP from the rule's docstring, array by array in numpy. Switches: ``m_basis`` 'param' (the rule's) |
    'eigen' (m the EMA of the projected gradients, in the eigenbasis, not rotated at a refresh); ``permute_v``
    False (v kept in place at a refresh); ``decay`` 'after' (the rule's) | 'before' (x (1 - lr lambda) - step
    N); ``first`` 'skip' (the rule's) | 'step' (an Adam step at t = 1 too, k = t); ``refresh`` 'power' (the
    rule's) | 'eigh' (the basis recomputed by eigh_descending); ``counter`` {'bc1' | 'bc2': 'next' | 'prev' |
    'frozen'}."""

    def init_leaf(self, x, path):
        r = self.rule
        axes = soap_axes(x.shape, r.max_precond_dim, r.precondition_1d)
        s = {"m": np.zeros_like(x), "v": np.zeros_like(x)}
        for i in axes:
            s[f"L{i}"] = np.zeros((x.shape[i], x.shape[i]), x.dtype)
            s[f"Q{i}"] = np.eye(x.shape[i], dtype=x.dtype)
        return s

    def _grams(self, s, g, axes):
        r, d = self.rule, g.dtype
        sb = r.beta2 if r.shampoo_beta is None else r.shampoo_beta
        for i in axes:
            gi = np.moveaxis(g, i, 0).reshape(g.shape[i], -1)
            s[f"L{i}"] = scalar(sb, d) * s[f"L{i}"] + scalar(1.0 - sb, d) * (gi @ gi.T)

    def _refresh(self, s, i):
        L, Q = s[f"L{i}"].astype(np.float64), s[f"Q{i}"].astype(np.float64)
        if self.switches.get("refresh", "power") == "eigh":
            s[f"Q{i}"] = eigh_descending(s[f"L{i}"])[1]
            return
        P = L @ Q
        order = np.argsort(-np.einsum("ij,ij->j", Q, P), kind="stable")
        Qn, R = np.linalg.qr(P[:, order])
        d = np.diag(R)
        Qn = Qn * np.where(d < 0, -1.0, 1.0)
        small = np.flatnonzero(np.abs(d) <= CLUSTER_ULPS * d.size * np.finfo(s["v"].dtype).eps * np.abs(d).max())
        if small.size:
            Qn = complete_basis(Qn, int(small[0]))
        s[f"Q{i}"] = Qn.astype(s["v"].dtype)
        if self.switches.get("permute_v", True):
            s["v"] = np.take(s["v"], order, axis=i)
        if self.switches.get("m_basis", "param") == "eigen":
            s["m"] = np.take(s["m"], order, axis=i)

    def _direction(self, t, s, x, g):
        r, d, sw = self.rule, x.dtype, self.switches
        axes = soap_axes(x.shape, r.max_precond_dim, r.precondition_1d)
        first = sw.get("first", "skip")
        if t == 1:
            self._grams(s, g, axes)
            for i in axes:
                s[f"Q{i}"] = eigh_descending(s[f"L{i}"])[1]
            if first == "skip":
                return None
        k = t if first == "step" else t - 1
        gp = g
        for i in axes:
            gp = _mode(gp, s[f"Q{i}"], i)
        if sw.get("m_basis", "param") == "eigen":
            s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1.0 - r.beta1, d) * gp
            mp = s["m"]
        else:
            s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1.0 - r.beta1, d) * g
            mp = s["m"]
            for i in axes:
                mp = _mode(mp, s[f"Q{i}"], i)
        s["v"] = scalar(r.beta2, d) * s["v"] + scalar(1.0 - r.beta2, d) * gp * gp
        N = mp / (np.sqrt(s["v"]) + scalar(r.eps, d))
        for i in axes:
            N = _mode(N, s[f"Q{i}"], i, back=True)
        if t > 1 or first == "step":
            if t > 1:
                self._grams(s, g, axes)
            if k >= 1 and k % r.precondition_frequency == 0 and t > 1:
                for i in axes:
                    self._refresh(s, i)
        c = sw.get("counter", {})
        ratio = 1.0
        if r.bias_correction:
            ratio = np.sqrt(1.0 - r.beta2 ** counted(k, c.get("bc2"))) / (1.0 - r.beta1 ** counted(k, c.get("bc1")))
        return scalar(ratio, d) * N

    def direction_leaf(self, t, s, x, g, path):
        u = self._direction(t, s, x, g)
        return np.zeros_like(x) if u is None else u

    def step_leaf(self, t, s, x, g, path):
        r = self.rule
        lr = r.lr * gamma(r.schedule, t)
        u = self._direction(t, s, x, g)
        if u is None:
            return x
        keep = scalar(1.0 - lr * r.weight_decay, x.dtype)
        if self.switches.get("decay", "after") == "before":
            return keep * x - scalar(lr, x.dtype) * u
        return keep * (x - scalar(lr, x.dtype) * u)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v

    out = [v(rule, "m in the eigenbasis", "m_t the EMA of the projected gradients Q_L^T G_t Q_R (kept in the "
             "eigenbasis) in place of the EMA of G_t, projected each step", m_basis="eigen"),
           v(rule, "v not permuted at a refresh", "v kept in its old order when the basis is refreshed in place "
             "of permuted to the new eigenvalue order", permute_v=False),
           v(rule, "decay before the step", "x_{t-1} (1 - lr lambda) - step N_t in place of (x_{t-1} - step N_t) "
             "(1 - lr lambda)", decay="before"),
           v(rule, "no first-step skip", "an Adam step at t = 1 too (bias correction by t) in place of t = 1 only "
             "building the factors", first="step"),
           v(rule, "basis recomputed by eigh", "a full eigendecomposition at each refresh in place of one power "
             "iteration and a QR", refresh="eigh")]
    return out if rule.weight_decay > 0 else [o for o in out if o.name != "decay before the step"]


def counters(rule):
    return (("bc1", "1 - beta1^k, k = t - 1"), ("bc2", "1 - beta2^k, k = t - 1")) if rule.bias_correction else ()


def facts(rule, of):
    """Scaling g by c scales the factors by c^2 (the same eigenbases), m and sqrt(v) by c, so N_t has degree 0
    in g (eps -> 0); the decay does not read g. Rotations x -> U x V^T rotate the eigenbases (Q_L -> U Q_L) where
    the factors' eigenvalues are distinct, but not the canonical basis of a repeated one (a rectangular
    gradient's first factors), so orthogonal equivariance holds on some inputs only (not stated: None); the
    rotations mix the entries (``elementwise`` False)."""
    return {"grad_scale": True, "step_scale_free": False, "orthogonal": None, "elementwise": False}


# ---- pytorch_optimizer -----------------------------------------------------------------------------------
def pytorch_optimizer_soap(params, linear_algebra: str = "refopt", **kwargs):
    """``pytorch_optimizer.SOAP(params, **kwargs)``. ``linear_algebra``: 'refopt' replaces the package's first
    eigendecomposition by :func:`refopt.linalg.eigen.eigh_descending` and its refresh (QR in float32) by
    :func:`refopt.rules.soap.refresh_basis` in float64, through a subclass (merge_dims=False and
    data_format='channels_first' only: ValueError otherwise); 'package' is the package as it ships."""
    import torch
    from pytorch_optimizer import SOAP as PackageSOAP

    from refopt.rules.soap import refresh_basis

    if linear_algebra not in ("refopt", "package"):
        raise ValueError(f"linear_algebra must be 'refopt' or 'package', got {linear_algebra!r}")
    if linear_algebra == "package":
        return PackageSOAP(params, **kwargs)
    if kwargs.get("merge_dims", False) or kwargs.get("data_format", "channels_first") != "channels_first":
        raise ValueError("SOAP with refopt's linear algebra (docs/factories/soap.py:soap) takes merge_dims=False and "
                         "data_format='channels_first' (one factor per axis of the array as it is); soap_as_shipped "
                         "runs the package's own options")

    def back(a, like):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=like.device, dtype=like.dtype)

    class SOAPRefoptBasis(PackageSOAP):
        @staticmethod
        def get_orthogonal_matrix(mat):
            return [[] if len(m) == 0 else back(eigh_descending(m.detach().cpu().numpy())[1], m) for m in mat]

        def get_orthogonal_matrix_qr(self, state, max_precondition_dim=10000, merge_dims=False):
            v, out = state["exp_avg_sq"], []
            for axis, (f, q) in enumerate(zip(state["GG"], state["Q"])):
                if len(f) == 0:
                    out.append([])
                    continue
                qn, order = refresh_basis(f.detach().cpu().numpy(), q.detach().cpu().numpy())
                v = v.index_select(axis, torch.from_numpy(order).to(v.device))
                out.append(back(qn, q))
            state["exp_avg_sq"] = v
            return out

    return SOAPRefoptBasis(params, **kwargs)


def _pytorch_optimizer(lr, betas, shampoo_beta, weight_decay, precondition_frequency, max_precondition_dim,
                       precondition_1d, correct_bias, eps):
    return SOAP(lr=lr, beta1=betas[0], beta2=betas[1], shampoo_beta=shampoo_beta, eps=eps, weight_decay=weight_decay,
                precondition_frequency=precondition_frequency, max_precond_dim=max_precondition_dim,
                precondition_1d=precondition_1d, bias_correction=correct_bias)


def _match(rule):
    if type(rule) is not SOAP or rule.schedule is not None:
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), shampoo_beta=rule.shampoo_beta,
                weight_decay=rule.weight_decay, precondition_frequency=rule.precondition_frequency,
                max_precondition_dim=rule.max_precond_dim, precondition_1d=rule.precondition_1d,
                correct_bias=rule.bias_correction, eps=rule.eps)


def _int_at_least_1(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v >= 1


PYTORCH_OPTIMIZER = PeerMapping(
    "pytorch_optimizer.SOAP", "pytorch_optimizer", "SOAP",
    dict(lr=3e-3, betas=(0.95, 0.95), shampoo_beta=None, weight_decay=1e-2, precondition_frequency=10,
         max_precondition_dim=10000, merge_dims=False, precondition_1d=False, correct_bias=True,
         normalize_gradient=False, data_format="channels_first", eps=1e-8, maximize=False),
    _pytorch_optimizer, "soap",
    refuse={"merge_dims": (lambda v: v is False, "merge_dims=True merges adjacent axes into one factor while their "
                                                 "product is <= max_precondition_dim (a 2-D array of <= 10000 entries "
                                                 "gets one full-matrix factor); refopt's SOAP has one factor per axis"),
            "normalize_gradient": (lambda v: v is False, "normalize_gradient=True divides N_t by its RMS; refopt's "
                                                         "SOAP has no such option"),
            "data_format": (lambda v: v == "channels_first", "data_format other than 'channels_first' permutes 4-D "
                                                             "arrays before merging; refopt's SOAP takes the axes as "
                                                             "they are"),
            "eps": (lambda v: is_number(v) and v > 0, "refopt's SOAP needs a number eps > 0 (a zero second moment "
                                                    "divides 0 by 0 otherwise)"),
            "lr": (lambda v: is_number(v) and v >= 0, "lr must be a number >= 0"),
            "weight_decay": (lambda v: is_number(v) and v >= 0, "weight_decay must be a number >= 0"),
            "shampoo_beta": (lambda v: v is None or (is_number(v) and 0 <= v < 1), "shampoo_beta must be None or in "
                                                                                 "[0, 1)"),
            "precondition_1d": (lambda v: isinstance(v, bool), "precondition_1d must be True or False"),
            "correct_bias": (lambda v: isinstance(v, bool), "correct_bias must be True or False"),
            "precondition_frequency": (_int_at_least_1, "precondition_frequency must be an int >= 1"),
            "max_precondition_dim": (_int_at_least_1, "max_precondition_dim must be an int >= 1"),
            "betas": BETAS2, "maximize": NO_MAXIMIZE},
    state={"m": "exp_avg", "v": "exp_avg_sq"}, layout="transpose", tol=SOAP_ROUNDING, match=_match, factory=pytorch_optimizer_soap)


def _atlas_soap_figures(refopt_basis, shipped):
    """The package as it ships against refopt: on the stream's rectangular matrices, and on a square 6 x 6 stream
    (distinct eigenvalues) without a refresh in 50 steps and with one every 5 Adam steps (the float32 QR)."""
    from dataclasses import replace

    from refopt.crosscheck import peers
    from refopt.crosscheck.atlas import Figure
    from refopt.crosscheck.divergences import SEED, STEPS, _figures, _run
    from refopt.crosscheck.problems import make_problem

    def params(preset, leaves0, grads, **kw):
        ps = replace(preset, peer_call=(preset.peer_call[0], {**preset.peer_call[1], **kw}))
        a = _run(peers.preset_adapter(ps), leaves0, grads)
        return _figures(a, _run(PYTORCH_OPTIMIZER.rule(**ps.peer_call[1]), leaves0, grads), leaves0, None)["params"]

    prob = make_problem("stream", np.float64, SEED, matrix_only=True)
    leaves0, grads = prob.leaves, [prob.grad(prob.leaves, t) for t in range(1, STEPS + 1)]
    rng = np.random.default_rng(0)
    square = [rng.standard_normal((6, 6))]
    sq_grads = [[rng.standard_normal((6, 6))] for _ in range(STEPS)]
    rect = params(shipped, leaves0, grads)
    flat = params(shipped, square, sq_grads, precondition_frequency=100)
    qr32 = params(shipped, square, sq_grads)
    own = params(refopt_basis, square, sq_grads)
    return [Figure("pytorch_optimizer vs refopt", "params", rect, 1e-3, "min", rect >= 1e-3,
                   "the stream's matrices (the 6 x 12 and 12 x 6 ones have a 6-fold zero eigenvalue at step 1): the "
                   "solver's basis of it"),
            Figure("pytorch_optimizer vs refopt, square, no refresh", "params", flat, 1e-12, "max", flat <= 1e-12,
                   "a 6 x 6 stream, precondition_frequency 100: distinct eigenvalues, the first basis alone"),
            Figure("pytorch_optimizer vs refopt, square, refresh every 5", "params", qr32, 1e-10, "min",
                   qr32 >= 1e-10, "the same stream, the refresh's QR in float32"),
            Figure("pytorch_optimizer refopt basis vs refopt, square", "params", own, 1e-12, "max", own <= 1e-12,
                   "the same stream and refresh, the package with refopt's float64 refresh")]


def atlas_soap():
    from dataclasses import replace
    from functools import partial

    from refopt.crosscheck.atlas import Entry, peer_side

    kw = dict(lr=0.01, betas=(0.9, 0.99), weight_decay=0.01, precondition_frequency=5)
    p = PYTORCH_OPTIMIZER.preset("pytorch_optimizer.SOAP", kw, "atlas", factory=pytorch_optimizer_soap)
    shipped = replace(p, name="pytorch_optimizer.SOAP(as shipped)",
                      factory=partial(pytorch_optimizer_soap, linear_algebra="package"))
    return Entry(
        "soap-eigenbasis",
        "SOAP's eigenbases: the eigenvectors of a repeated eigenvalue of the first Kronecker factors (picked by the "
        "solver from rounding noise in the package, canonical in refopt) and the refresh's QR (float32 in the "
        "package, float64 in refopt)",
        (peer_side("pytorch_optimizer refopt basis", p, tol=SOAP_ROUNDING, tol_name="SOAP_ROUNDING",
                   source="pytorch_optimizer 4.1.0 SOAP with refopt's canonical eigh and float64 refresh "
                          "(refopt.conventions.soap.pytorch_optimizer_soap)"),),
        (),
        "The paper leaves the basis of a repeated eigenvalue open, and the first factors of a rectangular gradient "
        "have one (G G^T of an m x n gradient, m > n + 1, has m - n >= 2 zero eigenvalues): Adam's per-coordinate "
        "step in one basis of that subspace differs from its step in another, so two SOAPs that call different "
        "solvers (or one SOAP on two BLAS libraries) part at the second step. Square arrays with distinct "
        "eigenvalues agree to rounding until the first refresh, where the package's float32 QR shows. "
        "like('pytorch_optimizer.SOAP', ...) is the package with refopt's basis.",
        "Vyas et al. 2024 (arXiv:2409.11321); pytorch_optimizer 4.1.0 SOAP", matrix_only=True,
        extra=lambda: _atlas_soap_figures(p, shipped))


_KW = dict(lr=0.01, betas=(0.9, 0.99), shampoo_beta=0.9, weight_decay=0.05, precondition_frequency=4, eps=1e-7)
_F = dict(factory=pytorch_optimizer_soap, dtypes=("float64",),
          dtypes_why="float32 SOAP parts from itself by up to 1.6e-2 when one ulp of the gradients changes "
                     "(SOAP_ROUNDING)")

CONVENTIONS = Conventions(
    rules=(SOAP,),
    final="Q [(Q^T m Q) / (sqrt(v) + eps)] Q^T in the eigenbasis of the Kronecker factors: where m lives, v's "
          "order at a refresh, the first step, the decay's place, and which basis of a repeated eigenvalue (a "
          "solver's eigh picks it from rounding noise on rectangular arrays; refopt.linalg.eigen.eigh_descending is "
          "refopt's; docs/divergences.md, soap-eigenbasis)",
    per_step="lr_t sqrt(1 - beta2^k) / (1 - beta1^k), k = t - 1",
    mappings=(PYTORCH_OPTIMIZER,),
    presets=(
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.SOAP", dict(lr=3e-3),
                                 "the defaults: betas (0.95, 0.95), decay 0.01, refresh every 10 Adam steps; refopt's "
                                 "eigenbasis (pytorch_optimizer_soap)", **_F),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.SOAP(betas,shampoo_beta,wd,freq)", _KW,
                                 "betas (0.9, 0.99), shampoo_beta 0.9, decay 0.05, refresh every 4, eps 1e-7", **_F),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.SOAP(precondition_1d,no_bias_correction)",
                                 dict(lr=2e-3, precondition_1d=True, correct_bias=False, max_precondition_dim=8,
                                      precondition_frequency=3),
                                 "1-D arrays preconditioned, no bias correction, axes > 8 not preconditioned", **_F)),
    wrong=(Preset("WRONG decay: pytorch_optimizer.SOAP vs refopt SOAP(weight_decay=0)", "pytorch_optimizer", "soap",
                  ("SOAP", dict(lr=0.01, weight_decay=0.1)), lambda: PYTORCH_OPTIMIZER.rule(lr=0.01, weight_decay=0.0),
                  "the package's decay 0.1 against none", layout="transpose", expect_fail=True, tol=SOAP_ROUNDING,
                  **_F),),
    gaps=(Preset("heavyball.SOAP", "heavyball", "soap", ("SOAP", dict(lr=3e-3, storage_dtype="float64")), None,
                 "heavyball 3.2.1's SOAP",
                 gap="heavyball keeps m in the eigenbasis and rotates it into each new basis, refreshes by a QR of "
                     "GG Q + lift max|q_j^T GG q_j| Q (a lift against rank deficiency) whose columns it puts back in "
                     "the old order (v is not permuted), debiases shampoo_beta by the step (1 - (1 - beta) / (1 - "
                     "beta^t)), merges small axes by default (merge_dims=True) and takes its own eigh; refopt's SOAP "
                     "is the paper's and pytorch_optimizer's form and reproduces none of these"),),
    no_peer={"torch": "torch.optim ships no SOAP", "optax": "optax 0.2.8 ships no SOAP",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    oracle=SOAPOracle,
    variants=variants,
    counters=counters,
    facts=facts,
    atlas=(atlas_soap,),
    golden=(GoldenCase("soap", lambda: SOAP(lr=0.01, precondition_frequency=3),
                       "SOAP, lr 0.01, refresh every 3 Adam steps", ("m", "v"), tolerance=ROUNDING_GOLDEN),
            GoldenCase("soap_pytorch_optimizer", lambda: PYTORCH_OPTIMIZER.rule(**_KW),
                       "like('pytorch_optimizer.SOAP', betas (0.9, 0.99), shampoo_beta 0.9, wd 0.05, refresh every 4, "
                       "eps 1e-7)", ("m", "v"), tolerance=ROUNDING_GOLDEN)),
    cli=(CliName("soap", SOAP, {"mlp": 1e-2, "gpt": 3e-3},
                 "SOAP (Vyas et al. 2024): Adam in the eigenbasis of Shampoo's Kronecker factors on every array "
                 "(vectors: Adam), the basis refreshed every 10 Adam steps; --beta1, --beta2, --eps",
                 {"beta1": "beta1", "beta2": "beta2", "eps": "eps"}),),
    examples=(Example("soap", lambda: SOAP(lr=0.01, precondition_frequency=3), converges=False,
                      note="Adam-like steps of size about lr in the eigenbasis at constant lr: SOAP orbits the "
                           "minimum"),
              Example("soap_1d", lambda: SOAP(lr=0.01, precondition_1d=True, max_precond_dim=4, weight_decay=0.0,
                                             bias_correction=False), converges=False,
                      note="Adam-like steps of size about lr at constant lr: SOAP orbits the minimum")),
)
