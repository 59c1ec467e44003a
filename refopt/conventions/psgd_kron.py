"""PSGD Kron (refopt/rules/psgd_kron.py) to kron_torch.Kron 0.3.3 (Evan Walters' PSGD Kron): torch's (out, in) layout
(each axis has its own factor, so the transposes take the same steps), the momentum debiased, the factors fitted on
the debiased momentum perturbed by sqrt(float32 eps) mean|m| v (the perturbed momentum is also what it
preconditions), the fit's counter against 1 / probability, the factors balanced where ``random.Random(42)`` draws
below 0.01, the update's RMS clipped at 1.1, the L2 term added after the preconditioning on arrays of ndim >= 2.

kron_torch draws the probe v with ``torch.randn_like`` inside ``torch.compile``d functions and runs its triangular
solves in float32 (``_solve_triangular_right``'s ``.float()``). :func:`kron_torch_kron` runs the package's own
functions eagerly with the probe refopt's rule draws (:meth:`refopt.PSGDKron.probe`) handed to its
``torch.randn_like`` and the solves in the factors' dtype; docs/factories/psgd_kron.py drives it from ``refopt
crosscheck --impl``. heavyball's PSGDKron is a documented known gap. torch.optim and optax ship no PSGD."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refopt.conventions._spec import (NO_MAXIMIZE, Conventions, Example, ModuleWith, Oracle, PeerMapping, Preset,
                                      gamma, is_number, patched, scalar)
from refopt.golden import GoldenCase
from refopt.rules.psgd_kron import EPS32, PSGDKron, balance_draws, diagonal_axes


@dataclass(frozen=True)
class KronTorchSchedule:
    """kron_torch's default ``precond_update_prob_schedule()``, in float32 as the package computes it: probability
    max_prob exp(-decay (n - flat_start)) clamped to [min_prob, max_prob] at its n-th step (n = t - 1)."""

    max_prob: float = 1.0
    min_prob: float = 0.03
    decay: float = 0.001
    flat_start: float = 500.0

    def __call__(self, n: int) -> np.float32:
        f = np.float32
        p = f(self.max_prob) * np.exp(-f(self.decay) * (f(n) - f(self.flat_start)))
        return np.clip(p, f(self.min_prob), f(self.max_prob)).astype(np.float32)


class PSGDKronOracle(Oracle):
    """PSGD Kron from the rule's docstring, array by array in numpy with dense Kronecker algebra: vec(A) = (Q_1 (x)
    Q_2) vec(h) row-major, B = (Q_1 (x) Q_2)^{-T} v by numpy's inverse, P = Q^T Q. Switches: ``perturb_step``
    False (the step preconditions the unperturbed momentum), ``clip`` False (no RMS clip), ``triu`` False (the
    whole difference, not its upper triangle), ``decay`` 'after_clip' (the rule's: added after the clip) or
    'before_clip'."""

    def init_leaf(self, x, path):
        scale = self.rule.precond_init_scale ** (1.0 / x.ndim)
        qs = [np.diag(np.full(n, scale)) if d else scale * np.eye(n)
              for n, d in zip(x.shape, diagonal_axes(self.rule, x.shape))]
        return {"m": np.zeros_like(x), **{f"q{i}": q.astype(x.dtype) for i, q in enumerate(qs)},
                "diag": np.array([float(d) for d in diagonal_axes(self.rule, x.shape)])}

    def glob0(self):
        return {"counter": 0}

    def direction_leaf(self, t, s, x, g, path):
        r, sw, d = self.rule, self.switches, x.dtype
        qs = [s[f"q{i}"] for i in range(x.ndim)]
        diag = [bool(v) for v in s["diag"]]
        s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1.0 - r.beta1, d) * g
        mhat = s["m"] / scalar(1.0 - r.beta1 ** t, d)
        update = _updates(r, t)
        if update and r.balance_seed is not None and balance_draws(r.balance_seed, t)[t - 1] < 0.01 and x.ndim > 1:
            norms = [np.max(np.abs(q)) for q in qs]
            mean = np.exp(np.mean(np.log(norms)))
            qs = [q * scalar(mean / n, d) for q, n in zip(qs, norms)]
        if update:
            v = r.probe(t, path, x.shape, d)
            h = mhat + scalar(np.sqrt(EPS32), d) * np.mean(np.abs(mhat)) * v
            K = qs[0] if x.ndim == 1 else np.kron(qs[0], qs[1])
            A = (K @ h.ravel()).reshape(x.shape)
            B = (np.linalg.inv(K).T @ v.ravel()).reshape(x.shape)
            new = []
            for i, q in enumerate(qs):
                Ai = np.moveaxis(A, i, 0).reshape(x.shape[i], -1)
                Bi = np.moveaxis(B, i, 0).reshape(x.shape[i], -1)
                ga, gb = Ai @ Ai.T, Bi @ Bi.T
                tiny = np.finfo(d).tiny
                if diag[i]:
                    dd = np.diag(ga) - np.diag(gb)
                    new.append(q - np.diag(scalar(r.precond_lr, d) * dd * np.diag(q) /
                                           max(np.max(np.abs(np.diag(ga) + np.diag(gb))), tiny)))
                else:
                    tot = ga + gb
                    norm = np.max(np.abs(tot))
                    lb = _lower_bound(tot / norm) * norm if norm > 0 else 0.0
                    diff = scalar(r.precond_lr, d) * (ga - gb)
                    new.append(q - ((np.triu(diff) if sw.get("triu", True) else diff) / max(lb, tiny)) @ q)
            qs = new
            if sw.get("perturb_step", True):
                mhat = h
        for i, q in enumerate(qs):
            s[f"q{i}"] = q
        K = qs[0] if x.ndim == 1 else np.kron(qs[0], qs[1])
        u = (K.T @ K @ mhat.ravel()).reshape(x.shape)
        if sw.get("decay", "after_clip") == "before_clip" and x.ndim >= 2:
            u = u + scalar(r.weight_decay, d) * x
        if sw.get("clip", True):
            u = u * min(scalar(1.0, d), scalar(1.1, d) / (np.sqrt(np.mean(u * u)) + scalar(1e-12, d)))
        if sw.get("decay", "after_clip") == "after_clip" and x.ndim >= 2:
            u = u + scalar(r.weight_decay, d) * x
        return u

    def step_leaf(self, t, s, x, g, path):
        r = self.rule
        u = self.direction_leaf(t, s, x, g, path)
        return x - scalar(r.lr * gamma(r.schedule, t), x.dtype) * u


def _updates(rule, t: int) -> bool:
    """Whether step t fits the factors: the steps since the last fit, counted from step 1, reach 1 / p(n)."""
    counter, update = 0, False
    for k in range(1, t + 1):
        p = rule.update_probability(k - 1) if callable(rule.update_probability) else rule.update_probability
        counter += 1
        update = counter >= 1.0 / p
        counter = 0 if update else counter
    return update


def _lower_bound(a):
    x = a[:, int(np.argmax(np.sum(a * a, axis=0)))]
    x = x @ a
    return float(np.linalg.norm(a @ (x / np.linalg.norm(x))))


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v

    out = [v(rule, "the unperturbed momentum preconditioned", "P m_t in place of P h: the probe's perturbation kept "
             "out of the step (it only enters the fit)", perturb_step=False),
           v(rule, "no RMS clip", "P m_t without the clip of its RMS at 1.1", clip=False),
           v(rule, "the whole difference", "Q_i <- Q_i - lr_P (A A^T - B B^T) Q_i / lb without the upper triangle",
             triu=False)]
    if rule.weight_decay > 0:
        out.append(v(rule, "decay before the clip", "lambda x added to P m_t before the RMS clip", decay="before_clip"))
    return out


def facts(rule, of):
    """The fit is driven by h and v with A = Q h and B = Q^{-T} v: with Q -> c Q the fitted P tends to |h|^-1 scale,
    but a finite number of fits from Q_0 = I is not scale-free, and the clip at RMS 1.1 acts at some scales only;
    triangular factors fix a basis (no rotation fact), the probe is drawn per path."""
    return {}


# ---- kron_torch -------------------------------------------------------------------------------------------
_COMPILED = ("_update_precond", "_precond_grad", "_clip_update_rms", "_balance_Q")


def kron_torch_kron(named_params, linear_algebra: str = "params", **kwargs):
    """``kron_torch.Kron(params, **kwargs)`` on the named parameters ``[(path, param), ...]``, its compiled functions
    run eagerly (their Python functions), its ``torch.randn_like`` handing it refopt's probe of each array
    (:meth:`refopt.PSGDKron.probe` with probe_seed 0, transposed to torch's layout), its preconditioner in the
    params' dtype (``precond_dtype``), its size printout kept off stdout. ``linear_algebra``: 'params' runs its
    triangular solves in the factors' dtype, 'package' keeps their float32."""
    import contextlib
    import io

    import torch

    import kron_torch.kron as module
    from kron_torch import Kron

    if linear_algebra not in ("params", "package"):
        raise ValueError(f"linear_algebra must be 'params' or 'package', got {linear_algebra!r}")
    named = list(named_params)
    paths = [p for p, _ in named]
    dtypes = {t.dtype for _, t in named}
    if len(dtypes) != 1:
        raise ValueError(f"kron_torch_kron needs one params dtype, got {sorted(map(str, dtypes))}")
    kwargs.setdefault("precond_dtype", dtypes.pop())
    np_dtype = {torch.float64: np.float64, torch.float32: np.float32}[kwargs["precond_dtype"]]
    probes = PSGDKron()

    def solve_in_dtype(X, A):
        return torch.linalg.solve_triangular(A, X.reshape(-1, X.size(-1)), upper=True, left=False,
                                             unitriangular=False).reshape_as(X)

    class KronSuppliedProbes(Kron):
        def step(self, closure=None):
            self.refopt_t = getattr(self, "refopt_t", 0) + 1
            group = self.param_groups[0]["params"]
            queue = [(path, p) for path, p in zip(paths, group) if p.grad is not None]

            def draw(G):
                path, p = queue.pop(0)
                v = probes.probe(self.refopt_t, path, tuple(reversed(p.shape)) if p.ndim == 2 else tuple(p.shape),
                                 np_dtype)
                v = torch.from_numpy(np.ascontiguousarray(v.T if v.ndim == 2 else v))
                if tuple(v.shape) != tuple(G.shape):
                    raise ValueError(f"kron_torch drew a probe of shape {tuple(G.shape)} for {path} {tuple(p.shape)}")
                return v.to(G.dtype)

            for g in self.param_groups:
                sched = g["preconditioner_update_probability"]
                if isinstance(sched, module.ProbScheduler):
                    sched._compiled = False
            eager = {n: getattr(getattr(module, n), "_torchdynamo_orig_callable", getattr(module, n))
                     for n in _COMPILED}
            if linear_algebra == "params":
                eager["_solve_triangular_right"] = solve_in_dtype
            with patched(module, torch=ModuleWith(torch, randn_like=lambda t, *a, **kw: draw(t)), **eager), \
                    contextlib.redirect_stdout(io.StringIO()):
                return super().step(closure)

    return KronSuppliedProbes([p for _, p in named], **kwargs)


kron_torch_kron.named_parameters = True     # the probes are drawn per path


def _kron(lr, b1, weight_decay, preconditioner_update_probability, max_size_triangular, min_ndim_triangular,
          memory_save_mode, precond_lr, precond_init_scale):
    p = preconditioner_update_probability
    return PSGDKron(lr=lr, beta1=b1, weight_decay=weight_decay, update_probability=KronTorchSchedule() if p is None
                    else float(p), max_size_triangular=max_size_triangular, min_ndim_triangular=min_ndim_triangular,
                    memory_save_mode=memory_save_mode, precond_lr=precond_lr, precond_init_scale=precond_init_scale)


def _match(rule):
    if type(rule) is not PSGDKron or rule.schedule is not None or rule.balance_seed != 42 or rule.probe_seed != 0:
        return None
    p = rule.update_probability
    if callable(p) and p != KronTorchSchedule():
        return None
    return dict(lr=rule.lr, b1=rule.beta1, weight_decay=rule.weight_decay,
                preconditioner_update_probability=None if callable(p) else p,
                max_size_triangular=rule.max_size_triangular, min_ndim_triangular=rule.min_ndim_triangular,
                memory_save_mode=rule.memory_save_mode, precond_lr=rule.precond_lr,
                precond_init_scale=rule.precond_init_scale)


KRON_TORCH = PeerMapping(
    "kron_torch.Kron", "kron_torch", "Kron",
    dict(lr=3e-4, b1=0.9, weight_decay=0.0, preconditioner_update_probability=None, max_size_triangular=8192,
         min_ndim_triangular=2, memory_save_mode=None, precond_lr=0.1, precond_init_scale=1.0),
    _kron, "psgd_kron", ignore=("merge_dims",),
    refuse={"preconditioner_update_probability": (lambda v: v is None or (is_number(v) and 0 < v <= 1),
                                                  "a probability in (0, 1] or None (the package's schedule); give "
                                                  "refopt another schedule as PSGDKron(update_probability=...)"),
            "momentum_into_precond_update": (lambda v: v is True, "refopt fits the factors on the debiased momentum "
                                                                  "(the package's default)"),
            "mu_dtype": (lambda v: v is None, "refopt keeps the momentum in the params' dtype"),
            "precond_dtype": (lambda v: v is None, "refopt keeps the factors in the params' dtype (the factory "
                                                   "docs/factories/psgd_kron.py sets it)"),
            "maximize": NO_MAXIMIZE},
    state={"m": "momentum_buffer"}, layout="transpose", match=_match, factory=kron_torch_kron)

_KW = dict(lr=0.01, b1=0.8, weight_decay=0.05, precond_lr=0.2, precond_init_scale=0.5)

CONVENTIONS = Conventions(
    rules=(PSGDKron,),
    final="P h clipped at RMS 1.1, P = Q^T Q with the factors fitted on (v, h): h's probe weight, which momentum the "
          "step preconditions, the fit's triangle and its normaliser lb, the clip, the decay's place",
    per_step="lr_t",
    mappings=(KRON_TORCH,),
    presets=(
        KRON_TORCH.preset("kron_torch.Kron", dict(lr=0.003),
                          "the defaults: the fit every step for the first 500 (the schedule's flat start), "
                          "triangular factors on matrices, diagonal on vectors; refopt's probes"),
        KRON_TORCH.preset("kron_torch.Kron(b1,wd,precond)", _KW,
                          "momentum 0.8, L2 0.05 after the preconditioning on matrices, precond_lr 0.2, initial "
                          "scale 0.5"),
        KRON_TORCH.preset("kron_torch.Kron(prob,diag)",
                          dict(lr=0.003, preconditioner_update_probability=0.4, memory_save_mode="smart_one_diag"),
                          "the fit every third step (counter >= 1 / 0.4), the larger axis of a non-square matrix "
                          "diagonal")),
    wrong=(Preset("WRONG probe: kron_torch.Kron vs refopt PSGDKron(probe_seed=1)", "kron_torch", "psgd_kron",
                  ("Kron", dict(lr=0.003)), lambda: PSGDKron(lr=0.003, update_probability=KronTorchSchedule(),
                                                             probe_seed=1),
                  "other probes than the package was handed", layout="transpose", expect_fail=True,
                  factory=kron_torch_kron),),
    gaps=(Preset("heavyball.PSGDKron", "heavyball", "psgd_kron", ("PSGDKron", dict(lr=0.001, storage_dtype="float64")),
                 None, "heavyball 3.2.1's PSGDKron",
                 gap="heavyball normalises each fit by a running lower bound of the largest eigenvalue (an EMA "
                     "over the fits, lower_bount_beta, of a power iteration's estimate) where kron_torch takes a "
                     "fresh bound every fit, and draws its probes with torch.randn_like inside torch.compile; "
                     "refopt's PSGDKron is kron_torch's form"),),
    no_peer={"torch": "torch.optim ships no PSGD", "optax": "optax 0.2.8 ships no PSGD Kron",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    oracle=PSGDKronOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("psgd_kron", lambda: PSGDKron(lr=0.01, beta1=0.8, weight_decay=0.05, precond_lr=0.2),
                       "PSGD Kron, the fit every step, refopt's probes (probe_seed 0)", ("m",)),),
    examples=(Example("psgd_kron", lambda: PSGDKron(lr=0.01), converges=False,
                      note="the RMS clip at 1.1 makes each step of size up to 1.1 lr: at constant lr it orbits "
                           "the minimum",
                      extra={"not_leafwise": "the probe v is drawn per leaf path, so a bare leaf (path <root>) "
                                             "draws another v than the same array inside the tree"}),),
)
