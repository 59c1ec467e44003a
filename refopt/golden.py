r"""Golden vectors: versioned trajectories of refopt rules that any backend can replay.

A golden vector is one rule configuration run on one canonical problem (fixed seed; see
:mod:`refopt.crosscheck.problems`: a quadratic, a random gradient stream, the MLP, a tiny GPT) for N
steps, stored as a pair of files with the same stem ``<case>__<problem>__<dtype>``:

``<stem>.npz`` (numpy ``savez_compressed``; every array little-endian, C order)
    ``params0/<i>``        the initial value of leaf i, shape S_i
    ``grads/<i>``          the gradient fed at steps 1..N, shape (N, *S_i)
    ``params/<i>``         leaf i after steps 1..N, shape (N, *S_i)
    ``state/<field>/<i>``  the rule's per-leaf state field after steps 1..N, shape (N, *S_i)
                           (e.g. Adam ``m``, ``v``; SGD ``b``; Muon ``m``; Schedule-Free ``z``, ``x``)

``<stem>.json`` (the manifest, UTF-8 JSON)
    ``format``: ``"refopt-golden"``; ``format_version``: :data:`FORMAT_VERSION` (an integer; a reader
    must refuse a version it does not know); ``refopt_version``; ``case``; ``problem`` and
    ``problem_description``; ``seed``; ``steps`` N; ``dtype`` ('float64' | 'float32');
    ``rule``: ``{"name", "hyperparameters", "json"}`` (``json`` is :func:`refopt.checkpoint.rule_to_json`,
    so ``rule_from_json`` rebuilds the rule); ``conventions``: the convention facts in words;
    ``peers``: ``{peer: preset name}`` for the peer optimizers that reproduce the rule
    (:data:`refopt.crosscheck.presets.PRESETS`, else matched by hyperparameters,
    :mod:`refopt.crosscheck.match`), with their ``peer_call`` (in words), ``constructor`` and ``kwargs``
    (e.g. ``"AdamW"``, ``{"lr": 0.01}``), ``layout``, ``state`` ({refopt field: peer state key}; files
    written before issue 11 lack it) and ``tolerance`` ({figure: bound}, e.g. {"params": 1e-12,
    "state": 1e-12}); ``{}`` when no peer reproduces the rule;
    ``leaves``: ``[{"index", "path", "shape"}]``; ``state_fields``; ``tolerance``: the max-norm relative
    difference allowed when refopt replays its own file; ``arrays``: for every array name
    ``{"shape", "dtype", "sha256"}`` where sha256 is the hex digest of the array's raw C-order bytes.

Replaying a file in another framework (about 20 lines; docs/golden.md shows it for torch): load the npz,
build the optimizer from the manifest's ``peers`` entry, set the params to ``params0``, and for
t = 1..N set the gradient to ``grads[:, t-1]``, step, and compare the params with ``params[t-1]``.

:func:`export` writes files; :func:`verify` checks a file's format and hashes (raising
:class:`GoldenError` with the file and array named); :func:`check` replays against refopt or a peer.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

FORMAT = "refopt-golden"
FORMAT_VERSION = 1
DTYPES = ("float64", "float32")


class GoldenError(ValueError):
    """A golden file is missing, malformed, of an unknown version, or does not match its hashes."""


@dataclass(frozen=True)
class GoldenCase:
    """One rule configuration of the golden catalog. ``matrix_only``: the rule takes matrices only."""

    name: str
    make_rule: Callable[[], Any]
    conventions: str
    state_fields: tuple[str, ...] = ()
    matrix_only: bool = False


def _catalog() -> list[GoldenCase]:
    from refopt.rules.adam import Adam, AdamW
    from refopt.rules.averaging import EMA, Average
    from refopt.rules.covariant import Covariant
    from refopt.rules.hyperball import Hyperball
    from refopt.rules.muon import Muon
    from refopt.rules.partition import Partition, matrix_labels
    from refopt.rules.schedule_free import ScheduleFreeAdamW, ScheduleFreeSGD
    from refopt.rules.sgd import SGD
    from refopt.schedules import warmup_cosine

    sgd, adam, sf_sgd, sf_adamw, muon = ("b",), ("m", "v"), ("z", "x"), ("z", "x", "v"), ("m",)
    return [
        GoldenCase("sgd", lambda: SGD(lr=0.1), "plain SGD"),
        GoldenCase("sgd_momentum", lambda: SGD(lr=0.05, momentum=0.9), "heavy-ball b = mu b + g, b_1 = g_1", sgd),
        GoldenCase("sgd_momentum_dampening_wd", lambda: SGD(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=1e-2),
                   "torch SGD: L2 in g, first buffer undampened", sgd),
        GoldenCase("sgd_nesterov_wd", lambda: SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
                   "torch SGD Nesterov u = g + mu b", sgd),
        GoldenCase("adam", lambda: Adam(lr=1e-2), "Adam, eps after sqrt(vhat) (E1), t from 1", adam),
        GoldenCase("adam_l2", lambda: Adam(lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=1e-2),
                   "Adam with L2 weight decay in g", adam),
        GoldenCase("adamw", lambda: AdamW(lr=1e-2), "AdamW torch defaults: wd 1e-2 decoupled, lr-coupled", adam),
        GoldenCase("adamw_wd1e-4", lambda: AdamW(lr=1e-2, weight_decay=1e-4), "AdamW with optax's default wd", adam),
        GoldenCase("adamw_wd0.1_b0.95", lambda: AdamW(lr=3e-2, beta1=0.9, beta2=0.95, weight_decay=0.1),
                   "AdamW, decay on the pre-update x", adam),
        GoldenCase("adamw_independent", lambda: AdamW(lr=1e-2, weight_decay=1e-3, wd_mode="independent"),
                   "AdamW with lr-free (independent) decay x(1 - gamma_t wd)", adam),
        GoldenCase("adamw_warmup_cosine", lambda: AdamW(lr=1e-2, schedule=warmup_cosine(3, 20, 0.1)),
                   "AdamW with a warmup-cosine schedule gamma_t (t from 1)", adam),
        GoldenCase("muon_torch", lambda: Muon.like_torch(lr=0.02), "torch.optim.Muon conventions (on the "
                   "transposed arrays), Newton-Schulz in the param dtype", muon, True),
        GoldenCase("muon_torch_rms", lambda: Muon.like_torch(lr=0.02, weight_decay=0.05, adjust_lr_fn="match_rms_adamw"),
                   "torch Muon match_rms_adamw = rms_match", muon, True),
        GoldenCase("muon_optax", lambda: Muon.like_optax(0.02), "optax.contrib.muon conventions", muon, True),
        GoldenCase("muon_optax_wd_rms", lambda: Muon.like_optax(0.02, beta=0.9, weight_decay=0.1, consistent_rms=0.2),
                   "optax muon consistent_rms=0.2, wd 0.1", muon, True),
        GoldenCase("muon_spectral", lambda: Muon(lr=0.02), "refopt default Muon: spectral scale, exact "
                   "normalisation", muon, True),
        GoldenCase("muon_svd", lambda: Muon(lr=0.02, msign="svd", weight_decay=0.01), "exact msign by SVD", muon, True),
        GoldenCase("muon_polar_express", lambda: Muon(lr=0.02, ns_coeffs="polar_express", ns_steps=8),
                   "Polar Express coefficients", muon, True),
        GoldenCase("sf_sgd", lambda: ScheduleFreeSGD(lr=0.5, beta=0.9), "Schedule-Free SGD (FB reference)", sf_sgd),
        GoldenCase("sf_sgd_wd", lambda: ScheduleFreeSGD(lr=0.5, beta=0.8, weight_decay=1e-2),
                   "Schedule-Free SGD with L2 at y", sf_sgd),
        GoldenCase("sf_sgd_warmup_r_wd", lambda: ScheduleFreeSGD(lr=0.5, beta=0.8, weight_decay=1e-2, warmup_steps=5,
                                                                 r=0.5, weight_lr_power=1.0),
                   "Schedule-Free SGD, warmup (k+1)/W, r, weight_lr_power", sf_sgd),
        GoldenCase("sf_adamw", lambda: ScheduleFreeAdamW(lr=0.05), "Schedule-Free AdamW (FB reference HEAD)", sf_adamw),
        GoldenCase("sf_adamw_wd", lambda: ScheduleFreeAdamW(lr=0.05, weight_decay=1e-2), "Schedule-Free AdamW, wd at y",
                   sf_adamw),
        GoldenCase("sf_adamw_warmup_decay_at_z", lambda: ScheduleFreeAdamW(lr=0.05, beta1=0.8, beta2=0.99,
                                                                          weight_decay=0.05, warmup_steps=4,
                                                                          decay_at_z=True, r=1.0),
                   "Schedule-Free AdamW, decay at z, warmup, r", sf_adamw),
        GoldenCase("ema_sgd_momentum", lambda: EMA(SGD(lr=0.05, momentum=0.9), decay=0.9),
                   "debiased EMA of the iterates (optax.ema fed the iterates)", ("mu", "base.b")),
        GoldenCase("average_adam", lambda: Average(Adam(lr=1e-2)), "uniform average of the iterates (1/t)",
                   ("mu", "base.m", "base.v")),
        # issue 11: Covariant (= optax.lamb / optax.lars without momentum), Hyperball, Partition
        GoldenCase("covariant_adam", lambda: Covariant(Adam(eps=1e-6), lr=1e-2),
                   "Covariant(Adam): W - lr ||W|| u/||u|| (post 000, eq. elr-u) = optax.lamb(weight_decay=0)",
                   ("base.m", "base.v")),
        GoldenCase("covariant_sgd", lambda: Covariant(SGD(weight_decay=1e-3), lr=1e-2),
                   "Covariant(SGD) with L2 in g (eq. elr-g) = optax.lars(momentum=0, trust_coefficient=1)"),
        GoldenCase("hyperball_muon", lambda: Hyperball(Muon(lr=0.02), lr=0.05),
                   "MuonH: W <- R N(W - lr R N(u)), R = ||W_0||_F (post 000 Hyperball, post 002)", ("base.m",),
                   True),
        GoldenCase("partition_muon_adamw", lambda: Partition({"hidden": Muon(lr=0.02), "other": AdamW(lr=1e-2)},
                                                             labels=matrix_labels),
                   "Partition: Muon on the matrices, AdamW on the rest (optax.contrib.muon's split)"),
    ]


#: the golden catalog (built on first use: the rule modules load lazily)
def catalog() -> list[GoldenCase]:
    return _catalog()


def _sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _peers_for(rule) -> dict:
    """{peer: preset} for the (non-gap, correct) presets whose refopt rule equals ``rule``; for a peer with
    no such hand-written preset, the preset matched by hyperparameters (:mod:`refopt.crosscheck.match`)."""
    from refopt.crosscheck.match import preset_for
    from refopt.crosscheck.presets import PEERS, PRESETS

    out = {}
    for p in PRESETS:
        if p.make_rule is None or p.gap or p.expect_fail or p.peer in out:
            continue
        try:
            same = p.make_rule() == rule
        except Exception:  # pragma: no cover - a preset whose rule module is missing
            same = False
        if same:
            out[p.peer] = p
    for peer in PEERS:
        if peer not in out:
            p = preset_for(rule, peer)
            if p is not None:
                out[peer] = p
    return {k: out[k] for k in PEERS if k in out}


def peer_entries(rule, dtype: str, problem: str) -> dict:
    """The manifest's ``peers``: ``{peer: {preset, peer_call, constructor, kwargs, layout, state, tolerance,
    why}}`` for every peer optimizer that reproduces ``rule`` (:func:`_peers_for`)."""
    return {k: {"preset": p.name, "peer_call": p.describe_peer(), "constructor": p.peer_call[0],
                "kwargs": _plain(p.peer_call[1]), "layout": p.layout, "state": dict(p.state),
                "tolerance": p.tol.for_dtype(dtype, problem), "why": p.why} for k, p in _peers_for(rule).items()}


def _refopt_tolerance(case: GoldenCase, dtype: str) -> float:
    """Drift allowed when refopt replays its own file: 0 in principle; BLAS (Muon's matmuls) and the
    numba kernels may reassociate on another machine."""
    if case.matrix_only:
        return 1e-10 if dtype == "float64" else 2e-4
    return 1e-12 if dtype == "float64" else 2e-5


def export_case(out_dir: str, case: GoldenCase, problem: str, steps: int = 50, dtype: str = "float64",
                seed: int = 0) -> str:
    """Run ``case`` on ``problem`` and write ``<stem>.npz`` and ``<stem>.json`` into ``out_dir``; returns
    the stem path. Raises ValueError for an unknown problem or dtype, steps < 1."""
    import refopt
    from refopt.checkpoint import rule_to_json
    from refopt.crosscheck.problems import make_problem
    from refopt.crosscheck.run import refopt_trajectory

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    prob = make_problem(problem, np.dtype(dtype), seed, matrix_only=case.matrix_only)
    rule = case.make_rule()
    traj, grads = refopt_trajectory(rule, prob.leaves, prob.grad, steps, case.state_fields)
    arrays: dict[str, np.ndarray] = {}
    for i, x0 in enumerate(prob.leaves):
        arrays[f"params0/{i}"] = x0
        arrays[f"grads/{i}"] = np.stack([g[i] for g in grads])
        arrays[f"params/{i}"] = np.stack([p[i] for p in traj.params])
        for f in case.state_fields:
            arrays[f"state/{f}/{i}"] = np.stack([s[f][i] for s in traj.state])
    arrays = {k: np.ascontiguousarray(v.astype(v.dtype.newbyteorder("<"))) for k, v in arrays.items()}
    stem = f"{case.name}__{problem}__{dtype}"
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "refopt_version": refopt.__version__,
        "case": case.name,
        "problem": problem,
        "problem_description": prob.description,
        "seed": seed,
        "steps": steps,
        "dtype": dtype,
        "rule": {"name": type(rule).__name__,
                 "hyperparameters": {k: _plain(v) for k, v in rule.hyperparameters().items()},
                 "json": rule_to_json(rule)},
        "conventions": case.conventions,
        "peers": peer_entries(rule, dtype, problem),
        "leaves": [{"index": i, "path": path, "shape": list(x.shape)}
                   for i, (path, x) in enumerate(zip(prob.paths, prob.leaves))],
        "state_fields": list(case.state_fields),
        "tolerance": _refopt_tolerance(case, dtype),
        "arrays": {k: {"shape": list(v.shape), "dtype": v.dtype.name, "sha256": _sha256(v)}
                   for k, v in sorted(arrays.items())},
    }
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, stem)
    np.savez_compressed(base + ".npz", **arrays)
    with open(base + ".json", "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return base


def slug(expr: str) -> str:
    """A file-name stem for a rule expression: 'AdamW(lr=1e-3, weight_decay=0.1)' -> 'adamw_lr_1e-3_weight_decay_0.1'."""
    import re
    out = re.sub(r"[^A-Za-z0-9.+-]+", "_", expr).strip("_").lower()
    return out[:100] or "rule"


def export_rule(out_dir: str, expr, name: str | None = None, problems=("quadratic", "stream", "mlp", "gpt"),
                steps: int = 50, dtype: str = "float64", seed: int = 0) -> list[str]:
    """Export any rule configuration: ``expr`` is a rule expression (``"Adam(beta2=0.95)"``, parsed by
    :func:`refopt.crosscheck.expr.parse_rule`) or a rule. The stem is ``<name>__<problem>__<dtype>`` with
    ``name`` a slug of the expression by default; the recorded state fields are every per-leaf state array
    of the rule; the manifest's ``peers`` are matched by hyperparameters. Raises ValueError for a bad
    expression, name, problem or dtype."""
    from refopt.crosscheck.expr import parse_rule, to_expr

    rule = parse_rule(expr) if isinstance(expr, str) else expr
    text = expr if isinstance(expr, str) else to_expr(rule)
    if name is None:
        name = slug(text)
    if not isinstance(name, str) or not name or "/" in name or "__" in name or name.startswith("."):
        raise ValueError(f"--name must be a plain file stem without '/' or '__', got {name!r}")
    case = case_for_rule(rule, name, f"rule expression {text}")
    return [export_case(out_dir, case, p, steps, dtype, seed) for p in problems]


def case_for_rule(rule, name: str, conventions: str = "") -> GoldenCase:
    """A :class:`GoldenCase` for any rule: state fields are the rule's per-leaf state arrays, matrix_only
    when the rule refuses 1-D arrays (Muon)."""
    import refopt
    from refopt.testing.adapters import RuleAdapter

    try:
        refopt.init(rule, [np.ones(3)])
        matrix_only = False
        probe = [np.ones(3)]
    except ValueError:
        matrix_only = True
        probe = [np.ones((3, 2))]
    a = RuleAdapter(rule)
    try:
        fields = tuple(a.state_arrays(a.init(probe)))
    except ValueError:
        fields = ()
    return GoldenCase(name, lambda: rule, conventions or repr(rule), fields, matrix_only)


def _plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (tuple, list)):
        return [_plain(a) for a in v]
    if isinstance(v, dict):
        return {str(k): _plain(a) for k, a in v.items()}
    if callable(v) and hasattr(v, "__qualname__"):   # a function (a Partition's labels): its name, never an address
        return f"{v.__module__}.{v.__qualname__}"
    return repr(v)


def export(out_dir: str, cases: list[str] | None = None, problems=("quadratic", "stream", "mlp", "gpt"),
           steps: int = 50, dtype: str = "float64", seed: int = 0) -> list[str]:
    """Export every case of :func:`catalog` (or those named in ``cases``) on every problem.

    Raises: ValueError for an unknown case name."""
    cat = catalog()
    names = [c.name for c in cat]
    for n in cases or []:
        if n not in names:
            raise ValueError(f"unknown golden case {n!r}; choose from {names}")
    return [export_case(out_dir, c, p, steps, dtype, seed) for c in cat if not cases or c.name in cases
            for p in problems]


#: The small set committed under tests/golden/ (a drift guard for refopt itself, ~350 KB):
#: (cases or None for all, problems, steps, dtype).
COMMITTED = [
    (None, ("quadratic",), 5, "float64"),
    (["adam", "muon_torch"], ("stream",), 5, "float64"),
    (["adamw", "muon_spectral", "sf_sgd"], ("quadratic",), 5, "float32"),
]


def export_committed(out_dir: str) -> list[str]:
    """Write the :data:`COMMITTED` set (``python -c "from refopt import golden;
    golden.export_committed('tests/golden')"`` regenerates tests/golden/ after an intended change)."""
    return [s for cases, problems, steps, dtype in COMMITTED for s in export(out_dir, cases, problems, steps, dtype)]


# ---------------------------------------------------------------------------------------------------------
# Reading and verifying

@dataclass
class Golden:
    """A verified golden file: the manifest and its arrays."""

    path: str
    manifest: dict
    arrays: dict

    def leaves0(self) -> list[np.ndarray]:
        return [self.arrays[f"params0/{i}"] for i in range(len(self.manifest["leaves"]))]

    def grads(self) -> list[list[np.ndarray]]:
        n = len(self.manifest["leaves"])
        return [[self.arrays[f"grads/{i}"][t] for i in range(n)] for t in range(self.manifest["steps"])]

    def params(self) -> list[list[np.ndarray]]:
        n = len(self.manifest["leaves"])
        return [[self.arrays[f"params/{i}"][t] for i in range(n)] for t in range(self.manifest["steps"])]

    def state(self) -> list[dict]:
        n = len(self.manifest["leaves"])
        return [{f: [self.arrays[f"state/{f}/{i}"][t] for i in range(n)] for f in self.manifest["state_fields"]}
                for t in range(self.manifest["steps"])]


def verify(path: str) -> Golden:
    """Load ``path`` (the .json manifest or the .npz, or the stem) and check it: format and version, the
    set of arrays, each array's shape, dtype and sha256. Raises :class:`GoldenError` naming the file and
    the array at the first problem."""
    stem = path[:-5] if path.endswith(".json") else path[:-4] if path.endswith(".npz") else path
    jpath, npath = stem + ".json", stem + ".npz"
    for p in (jpath, npath):
        if not os.path.isfile(p):
            raise GoldenError(f"golden file {p} is missing")
    try:
        with open(jpath) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GoldenError(f"{jpath}: not a readable JSON manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise GoldenError(f"{jpath}: not a refopt golden manifest (format != {FORMAT!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise GoldenError(f"{jpath}: format_version {manifest.get('format_version')!r} is not supported "
                          f"(this refopt reads version {FORMAT_VERSION})")
    for key in ("steps", "dtype", "leaves", "state_fields", "arrays", "rule", "tolerance"):
        if key not in manifest:
            raise GoldenError(f"{jpath}: manifest lacks {key!r}")
    try:
        with np.load(npath, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # zipfile.BadZipFile, ValueError, OSError, EOFError ...
        raise GoldenError(f"{npath}: cannot read the arrays ({type(e).__name__}: {e})") from None
    expected = manifest["arrays"]
    missing = sorted(set(expected) - set(arrays))
    extra = sorted(set(arrays) - set(expected))
    if missing or extra:
        raise GoldenError(f"{npath}: arrays differ from the manifest (missing {missing}, unexpected {extra})")
    for name, rec in expected.items():
        a = arrays[name]
        if list(a.shape) != rec["shape"] or a.dtype.name != rec["dtype"]:
            raise GoldenError(f"{npath}: array {name!r} has shape {list(a.shape)} dtype {a.dtype.name}, the "
                              f"manifest says {rec['shape']} {rec['dtype']}")
        if _sha256(a) != rec["sha256"]:
            raise GoldenError(f"{npath}: array {name!r} does not match its sha256 in {os.path.basename(jpath)} "
                              f"(the file is corrupted or was edited)")
    return Golden(stem, manifest, arrays)


def find(directory: str) -> list[str]:
    """The stems of the golden manifests in ``directory`` (sorted). Raises GoldenError if there are none."""
    if not os.path.isdir(directory):
        raise GoldenError(f"{directory} is not a directory")
    stems = sorted(os.path.join(directory, f[:-5]) for f in os.listdir(directory) if f.endswith(".json"))
    if not stems:
        raise GoldenError(f"no golden manifests (*.json) in {directory}")
    return stems


def check_file(path: str, against: str = "refopt"):
    """Replay one golden file against ``against`` ('refopt', 'torch', 'optax' or 'schedulefree').

    Returns a :class:`refopt.crosscheck.run.Result` (status 'pass', 'fail', or 'skip' when the file has
    no preset for that peer or the peer is not installed). Raises GoldenError for a bad file."""
    from refopt.checkpoint import rule_from_json
    from refopt.crosscheck import peers as peer_mod
    from refopt.crosscheck.presets import PRESETS
    from refopt.crosscheck.run import Result, Trajectory, check, compare, peer_trajectory, refopt_trajectory

    g = verify(path)
    m = g.manifest
    recorded = Trajectory(g.params(), g.state())
    paths = [leaf["path"] for leaf in m["leaves"]]
    base = dict(preset=f"{m['case']}", peer=against, family=m["rule"]["name"], problem=m["problem"],
                steps=m["steps"], dtype=m["dtype"], rule=m["rule"]["name"])
    if against == "refopt":
        rule = rule_from_json(m["rule"]["json"])
        replay, _ = refopt_trajectory(rule, g.leaves0(), g.grads(), m["steps"], tuple(m["state_fields"]))
        tol = {"params": m["tolerance"], "state": m["tolerance"]}
    else:
        if against not in peer_mod.INSTALL:
            raise ValueError(f"--against must be refopt or one of {sorted(peer_mod.INSTALL)}, got {against!r}")
        from refopt.crosscheck.match import preset_for

        entry = m.get("peers", {}).get(against)
        preset = None if entry is None else next((p for p in PRESETS if p.name == entry["preset"]), None)
        if preset is None:      # matched by hyperparameters (also for files written without a peers entry)
            preset = preset_for(rule_from_json(m["rule"]["json"]), against)
        if preset is None:
            return Result(**base, status="skip", message=f"no {against} preset reproduces this rule")
        ok, why = peer_mod.available(against)
        if not ok:
            return Result(**base, status="skip", message=why)
        replay = peer_trajectory(preset, g.leaves0(), g.grads(), np.dtype(m["dtype"]).type)
        tol = preset.tol.for_dtype(m["dtype"], m["problem"])
        base["preset"] = f"{m['case']} ~ {preset.name}"
        # compare the peer's state only on the fields both sides have
        recorded = Trajectory(recorded.params, [{f: s[f] for f in preset.state if f in s} for s in recorded.state]
                              if preset.state else [])
        replay.state = [{f: s[f] for f in r} for s, r in zip(replay.state, recorded.state)] if preset.state else []
    fig = compare(recorded, replay, g.leaves0(), paths)
    bad = check(fig, tol)
    return Result(**base, status="fail" if bad else "pass", tol=tol, message="; ".join(bad), **fig)


def check(directory: str, against: str = "refopt") -> list:
    """Replay every golden file in ``directory`` (see :func:`check_file`)."""
    return [check_file(s, against) for s in find(directory)]
