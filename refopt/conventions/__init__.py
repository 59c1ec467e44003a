r"""What each rule means elsewhere: one conventions file per rule family, gathered by a registry.

``refopt/rules/<rule>.py`` holds a rule's arithmetic; ``refopt/conventions/<rule>.py`` holds everything
about what the rule means to the peers and to the tests, as one :class:`~refopt.conventions._spec.Conventions`
named ``CONVENTIONS``: the peer mappings of :func:`like` with their tolerance tiers, the checked peer calls
and the deliberately wrong ones, the plain-numpy restatement of the equations (the tests' oracle and the
source of the diagnosis variants), the golden cases, the generic tests' configurations, the invariance
facts, the atlas entries about the rule and its command-line names. The cross-check, atlas, golden,
testing and CLI layers read them through this registry, discovered from the folder: adding a rule adds a
file here, never a line elsewhere.

:func:`like` -- ``refopt.like("torch.optim.AdamW", lr=1e-3, weight_decay=0.1)`` is the refopt rule that
reproduces that call of the peer, with the peer's own argument names and defaults.
"""
from __future__ import annotations

import importlib
import pkgutil

from refopt.conventions._spec import (EXACT, MUON_OPTAX, MUON_TORCH_BF16, OPTAX_F32_WARMUP, PEERS, CliName,
                                      ALL_PEERS, PACKAGES,
                                      Conventions, Example, Oracle, PeerMapping, Preset, Tol)

__all__ = ["like", "peers", "registry", "for_rule", "facts", "oracle", "missing", "markdown", "presets_markdown",
           "Conventions", "PeerMapping",
           "Preset", "Tol", "Example", "Oracle", "CliName", "EXACT", "MUON_OPTAX", "MUON_TORCH_BF16",
           "OPTAX_F32_WARMUP", "PEERS", "PACKAGES", "ALL_PEERS"]

_REGISTRY: dict | None = None


def registry() -> dict:
    """{module name: Conventions} of every conventions file of this folder, in file-name order."""
    global _REGISTRY
    if _REGISTRY is None:
        found = {}
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            if info.name.startswith("_"):
                continue
            mod = importlib.import_module(f"{__name__}.{info.name}")
            conv = getattr(mod, "CONVENTIONS", None)
            if not isinstance(conv, Conventions):
                raise TypeError(f"refopt/conventions/{info.name}.py defines no CONVENTIONS = Conventions(...)")
            found[info.name] = conv
        _REGISTRY = found
    return _REGISTRY


def for_rule(rule) -> Conventions | None:
    """The conventions of ``rule`` (a rule or a rule class; a subclass falls back to its nearest
    registered class), or None."""
    cls = rule if isinstance(rule, type) else type(rule)
    owners = {r: c for c in registry().values() for r in c.rules}
    for k in cls.__mro__:
        if k in owners:
            return owners[k]
    return None


def peers() -> dict:
    """{peer call name: PeerMapping} of every conventions file (``"torch.optim.AdamW"``, ``"optax.adamw"``)."""
    return {m.peer: m for c in registry().values() for m in c.mappings}


def like(peer: str, **kwargs):
    """The refopt rule that reproduces the peer call ``peer(**kwargs)``, taking the peer's own argument
    names and defaults: ``like("torch.optim.AdamW", lr=1e-3, weight_decay=0.1)``, ``like("optax.adamw",
    learning_rate=1e-3)`` (optax's default decay 1e-4 included), ``like("torch.optim.Muon", lr=0.02,
    adjust_lr_fn="match_rms_adamw")``. The layout and tolerance at which the rule reproduces the peer are
    in the mapping (:func:`peers`); a torch matrix rule (Muon) reproduces the peer on the transposes of
    torch's (out, in) arrays.

    Raises: ValueError for an unknown peer (listing the known ones), an argument the peer does not take,
    or one that refopt cannot reproduce (naming it, with the reason)."""
    known = peers()
    if peer not in known:
        raise ValueError(f"unknown peer {peer!r}; refopt reproduces: {', '.join(sorted(known))}")
    return known[peer].rule(**kwargs)


def oracle(rule, **switches):
    """The plain-numpy restatement of ``rule`` (an :class:`Oracle`, with convention ``switches``)."""
    conv = for_rule(rule)
    if conv is None or conv.oracle is None:
        raise ValueError(f"no plain-numpy oracle is registered for {type(rule).__name__}")
    return conv.oracle(rule, **switches)


FACTS = ("grad_scale", "step_scale_free", "homogeneous", "plain_direction", "orthogonal", "elementwise",
         "covariant", "exact_scale_free", "mup", "averaging")


def facts(rule) -> dict:
    """The invariance facts of ``rule`` from its conventions file ({fact: bool or None}; missing ones False,
    ``averaging`` None): see :mod:`refopt.testing.expected`."""
    conv = for_rule(rule)
    got = conv.facts(rule, facts) if conv is not None and conv.facts is not None else {}
    out = {f: False for f in FACTS}
    out["averaging"] = None
    out.update(got)
    return out


def missing(rule_classes=None) -> list[str]:
    """What the registry lacks, as messages: for every rule class (default: every rule exported by refopt)
    a conventions file, a golden case, an oracle, its invariance facts, and for every peer (torch, optax,
    schedulefree) a mapping or the reason none exists. Empty when complete."""
    if rule_classes is None:
        from refopt.rules import exported_rules
        rule_classes = exported_rules()
    out = []
    for cls in rule_classes:
        conv = for_rule(cls)
        name = cls.__name__
        if conv is None:
            out.append(f"{name}: no conventions file (refopt/conventions/<rule>.py with CONVENTIONS)")
            continue
        if not any(type(g.make_rule()) is cls for g in conv.golden):
            out.append(f"{name}: no golden case")
        if conv.oracle is None:
            out.append(f"{name}: no plain-numpy oracle")
        if conv.facts is None:
            out.append(f"{name}: no invariance facts")
        covered = {m.adapter for m in conv.mappings} | set(conv.no_peer)
        for p in PEERS:
            if p not in covered:
                out.append(f"{name}: no {p} mapping and no reason why {p} has none (Conventions.no_peer)")
    return out


def _rule_text(p) -> str:
    from refopt.crosscheck.expr import ExprError, to_expr
    try:
        return to_expr(p.make_rule())
    except ExprError:
        return repr(p.make_rule())


PRESETS_BEGIN = "<!-- the presets table: generated by `python -m refopt.conventions --presets`; do not edit -->"
PRESETS_END = "<!-- end of the generated presets table -->"


def _cell(text) -> str:
    """A Markdown table cell: a literal ``|`` (as in ``|g|`` or ``||x||``) escaped, so it does not split the
    row (GFM and MyST read ``\\|`` as ``|``, also inside code spans)."""
    return str(text).replace("|", "\\|")


def presets_markdown() -> str:
    """The cross-check's table of checked calls (docs/crosscheck.md, between :data:`PRESETS_BEGIN` and
    :data:`PRESETS_END`; a test keeps it current): every preset of every conventions file, peer by peer, as
    run (``describe_peer()``), its refopt rule, the problems it runs on and the conventions it relies on; then
    the deliberately wrong rows (which must be caught) and the known gaps."""
    from refopt.crosscheck.presets import KNOWN_GAPS, MISCONFIGURED, PRESETS

    def where(p):
        return "all" if not p.problems else ", ".join(p.problems)

    lines = [PRESETS_BEGIN, "", "| checked call | refopt rule | problems | conventions it relies on |",
             "|---|---|---|---|"]
    lines += [f"| `{_cell(p.describe_peer())}` | `{_cell(_rule_text(p))}` | {where(p)} | {_cell(p.why)} |"
              for p in PRESETS]
    lines += [f"| wrong on purpose: `{_cell(p.describe_peer())}` | `{_cell(_rule_text(p))}` | {where(p)} | must be "
              f"caught: {_cell(p.why)} |" for p in MISCONFIGURED]
    lines += [f"| known gap: `{_cell(p.describe_peer())}` | none | - | {_cell(p.gap)} |" for p in KNOWN_GAPS]
    return "\n".join(lines + ["", PRESETS_END]) + "\n"


def markdown() -> str:
    """The conventions as a Markdown page (docs/conventions_generated.md is this text; a test keeps it current):
    per conventions file, its rules, its peer mappings (call, defaults, what is refused and why, layout,
    tolerance tier), the peers without the optimizer, and the checked calls."""
    lines = ["# The conventions of every rule (generated)", "",
             "Generated from `refopt/conventions/*.py` by `python -m refopt.conventions > "
             "docs/conventions_generated.md`; `refopt.like(PEER, **kwargs)` reads the same mappings.", ""]
    for name, conv in registry().items():
        lines += [f"## {', '.join(c.__name__ for c in conv.rules)} (`refopt/conventions/{name}.py`)", ""]
        doc = (importlib.import_module(f"{__name__}.{name}").__doc__ or "").strip()
        if doc:
            lines += [" ".join(doc.split()), ""]
        if conv.mappings:
            lines += ["| peer call | defaults refopt reproduces | refused (why) | layout | tier |", "|---|---|---|---|---|"]
            for m in conv.mappings:
                defaults = ", ".join(f"{k}={v!r}" for k, v in m.defaults.items() if k not in m.refuse)
                req = ", ".join(m.required)
                refused = "; ".join(f"{k}: {why}" for k, (_, why) in m.refuse.items()) or "-"
                tier = ", ".join(f"{k} {v:g}" for k, v in m.tol.float64.items())
                lines.append(f"| `{_cell(m.peer)}` | {_cell((req + ' (required); ') if req else '')}"
                             f"{_cell(defaults or '-')} | {_cell(refused)} | {m.layout} | {tier} |")
            lines.append("")
        for peer, why in conv.no_peer.items():
            lines.append(f"- no {peer} mapping: {why}")
        if conv.no_peer:
            lines.append("")
        if conv.presets:
            lines += ["| checked call | refopt rule | why |", "|---|---|---|"]
            for p in conv.presets:
                lines.append(f"| `{_cell(p.describe_peer())}` | `{_cell(_rule_text(p))}` | {_cell(p.why)} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
