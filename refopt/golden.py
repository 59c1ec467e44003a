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
    ``inputs/<name>``      for a rule that takes inputs beyond the gradients (the manifest's ``inputs``),
                           the input at steps 1..N, shape (N,) float64 (``inputs/value``: the loss at
                           the params each gradient was taken at)

``<stem>.json`` (the manifest, UTF-8 JSON)
    ``format``: ``"refopt-golden"``; ``format_version``: :data:`FORMAT_VERSION` (an integer; a reader
    must refuse a version it does not know); ``refopt_version``; ``case``; ``problem`` and
    ``problem_description``; ``seed``; ``steps`` N; ``dtype`` ('float64' | 'float32');
    ``rule``: ``{"name", "hyperparameters", "json"}`` (``json`` is :func:`refopt.checkpoint.rule_to_json`,
    so ``rule_from_json`` rebuilds the rule); ``conventions``: the convention facts in words;
    ``peers``: ``{peer: preset name}`` for the peer optimizers that reproduce the rule
    (:data:`refopt.crosscheck.presets.PRESETS`, else matched by hyperparameters,
    :mod:`refopt.crosscheck.match`), with their ``peer_call`` (in words), ``constructor`` and ``kwargs``
    (e.g. ``"AdamW"``, ``{"lr": 0.01}``), ``layout``, ``state`` ({refopt field: peer state key}; optional:
    a file without it is valid) and ``tolerance`` ({figure: bound}, e.g. {"params": 1e-12,
    "state": 1e-12}); ``{}`` when no peer reproduces the rule;
    ``leaves``: ``[{"index", "path", "shape"}]``; ``state_fields``; ``inputs`` (optional, [] when absent): the
    names of the step's inputs beyond the gradients (:data:`refopt.core.INPUTS`, e.g. ``["value"]``);
    ``tolerance``: the max-norm relative difference allowed when refopt replays its own file; ``arrays``: for every array name
    ``{"shape", "dtype", "sha256"}`` where sha256 is the hex digest of the array's raw C-order bytes.

Replaying a file in another framework (about 20 lines; docs/golden.md shows it for torch): load the npz,
build the optimizer from the manifest's ``peers`` entry, set the params to ``params0``, and for
t = 1..N set the gradient to ``grads[:, t-1]`` (and hand over ``inputs/value[t-1]`` where the manifest lists
it: optax's ``value=``, torch's closure returning it), step, and compare the params with ``params[t-1]``.

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
    """One rule configuration of the golden catalog. ``matrix_only``: the rule takes matrices only;
    ``problems``: the problems the case is defined on (None: all; e.g. a table of per-array lrs names the
    arrays of some problems only); ``tolerance``: the float64 drift allowed when refopt replays its own file, for
    a rule that amplifies rounding (SOAP, Shampoo: another BLAS rounds their products otherwise); None: the
    default of :func:`_refopt_tolerance`."""

    name: str
    make_rule: Callable[[], Any]
    conventions: str
    state_fields: tuple[str, ...] = ()
    matrix_only: bool = False
    problems: tuple[str, ...] | None = None
    tolerance: float | None = None


def _catalog() -> list[GoldenCase]:
    """Every golden case of the conventions files (:mod:`refopt.conventions`), in file order."""
    from refopt.conventions import registry
    return [g for c in registry().values() for g in c.golden]


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
    if case.tolerance is not None and dtype == "float64":
        return case.tolerance
    if case.matrix_only:
        return 1e-10 if dtype == "float64" else 2e-4
    return 1e-12 if dtype == "float64" else 2e-5


def export_case(out_dir: str, case: GoldenCase, problem: str, steps: int = 50, dtype: str = "float64",
                seed: int = 0) -> str:
    """Run ``case`` on ``problem`` and write ``<stem>.npz`` and ``<stem>.json`` into ``out_dir``; returns
    the stem path. Raises ValueError for an unknown problem or dtype, steps < 1."""
    import refopt
    from refopt.checkpoint import rule_to_json
    from refopt.crosscheck.problems import closed_loop, make_problem
    from refopt.crosscheck.run import refopt_trajectory

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    rule = case.make_rule()
    prob = make_problem(problem, np.dtype(dtype), seed, matrix_only=case.matrix_only, full_batch=closed_loop(rule))
    traj, grads = refopt_trajectory(rule, prob.leaves, prob.grad, steps, case.state_fields)
    arrays: dict[str, np.ndarray] = {}
    for i, x0 in enumerate(prob.leaves):
        arrays[f"params0/{i}"] = x0
        arrays[f"grads/{i}"] = np.stack([g[i] for g in grads])
        arrays[f"params/{i}"] = np.stack([p[i] for p in traj.params])
        for f in case.state_fields:
            arrays[f"state/{f}/{i}"] = np.stack([s[f][i] for s in traj.state])
    for k in (k for k in rule.inputs if k != "closure"):     # the closure is the problem's own (see Golden.grads)
        arrays[f"inputs/{k}"] = np.array([g.inputs[k] for g in grads], np.float64)
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
        "inputs": list(rule.inputs),
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
            for p in problems if c.problems is None or p in c.problems]


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

    def grads(self) -> list:
        """Per step, the gradients (a :class:`refopt.crosscheck.problems.Gradients`, a list of arrays) with the
        step's inputs (``.inputs``, {'value': f} for a file whose manifest lists inputs). A manifest that lists
        ``closure`` (L-BFGS) stores none: the closure is the problem's loss, rebuilt from the manifest's
        ``problem``, ``dtype`` and ``seed`` by :func:`refopt.crosscheck.problems.make_problem` with one batch
        (``full_batch=True``, as the file was written)."""
        from refopt.crosscheck.problems import Gradients, closure_at, make_problem

        n, names = len(self.manifest["leaves"]), self.manifest.get("inputs", [])
        grad = None
        if "closure" in names:
            m = self.manifest
            prob = make_problem(m["problem"], np.dtype(m["dtype"]), m["seed"], full_batch=True)
            if [x.shape for x in prob.leaves] != [tuple(leaf["shape"]) for leaf in m["leaves"]]:
                raise GoldenError(f"{self.path}: the leaves of problem {m['problem']!r} (seed {m['seed']}) are not "
                                  f"the manifest's, so its closure cannot be rebuilt")
            grad = prob.grad
        return [Gradients([self.arrays[f"grads/{i}"][t] for i in range(n)],
                          {k: (closure_at(grad, t + 1) if k == "closure" else float(self.arrays[f"inputs/{k}"][t]))
                           for k in names})
                for t in range(self.manifest["steps"])]

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
        from refopt.testing.adapters import reads_names

        replay = peer_trajectory(preset, g.leaves0(), g.grads(), np.dtype(m["dtype"]).type,
                                 paths if reads_names(preset.factory) else None, tuple(m.get("inputs", [])))
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
