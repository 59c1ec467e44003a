r"""The expected outcomes: which rules satisfy which property, from the theory (not from running them).

:func:`expected` returns ``{property: True | False | None}`` for a refopt rule (None: not applicable /
not stated). The reasons, property by property (see :mod:`refopt.testing.properties`):

* gradient_scale_invariance: the step depends on g only through g/|g|-type ratios: Adam/AdamW without
  L2 decay (eps -> 0; decoupled decay does not involve g), Schedule-Free AdamW without decay, Muon
  (msign; eps_mode 'add'/'clamp' up to eps/||X||), Covariant/Hyperball of such a base or of SGD
  without L2 (u/||u|| removes a scale of u that is homogeneous in g), EMA/Average of an invariant base,
  Partition when every sub-rule is; Lion (sign(b1 c m + (1-b1) c g) = sign(b1 m + (1-b1) g), its decay
  decoupled; sign(0) = 0 either way). Not SGD (the step is linear in g), not L2 decay (g + lambda x).
  ClipByGlobalNorm(base) feeds the base g'_t = g_t min(1, M/(N_t + eps)): with c g the clip is active at
  some steps and not at others (c N_t against M), so the base sees the steps' gradients in other ratios;
  it holds only for a base that ignores a separate scale of each step's gradient (Lion with beta1 = 0,
  Muon with momentum 0, Adam with beta1 = beta2 = 0, Covariant/Hyperball of SGD without momentum or L2,
  wrappers of these), not for Clip(Adam) in general. A measurement may still find it holding: with
  max_norm below every drawn gradient norm the clip is active at every step of both runs (g'_t =
  M g_t/N_t for every c, eps = 0), and no drawn example separates the two.
* parameter_scale_covariance and reparametrization_covariance (post 000, eq. phi): Covariant and
  Hyperball (radius None) of a gradient-scale-invariant base or of SGD without L2, and Adafactor with its
  parameter scale (step max(eps2, RMS(x)) times a degree-0 function of g; up to the eps2 floor), LARS and
  LAMB without decay (the trust ratio ||x||/||u||; LARS also without eps); nothing else (SGD:
  lr c^-2; Adam, Muon: the step does not scale with w). Reparametrization runs a closed loop whose
  gradients approach 0, so with an Adam base (LAMB) it holds only as eps -> 0: not stated (None).
* orthogonal_equivariance: rules built from linear maps of g and x and orthogonally invariant norms:
  SGD (momentum, Nesterov, L2), Muon (msign(U G V^T) = U msign(G) V^T; the shape scale is fixed),
  Schedule-Free SGD, Covariant/Hyperball ('fro' norm) of such a base, ClipByGlobalNorm of such a base
  (||U G V^T||_F = ||G||_F: the same factor). Not the elementwise-adaptive ones (Adam, AdamW,
  Schedule-Free AdamW: sqrt(v) is taken per entry; Lion: sign is taken per entry).
* permutation_equivariance: every elementwise rule (SGD, Adam, AdamW, Lion, Schedule-Free) and
  Covariant/Hyperball/EMA/Average/ClipByGlobalNorm of one (the norms are permutation invariant, so the
  factor is one scalar); not Muon.
* gpt_symmetry_equivariance: a scalar joint rescaling (c up, 1/c down) commutes with the step only
  when the step of every array scales with the array itself and ignores the gradient's scale:
  Covariant and Hyperball of a gradient-scale-invariant base without eps (SGD, Muon eps_mode 'none');
  with an Adam base (LAMB) only as eps -> 0 -- the GPT's real gradients have entries near 0 (unused
  embedding rows), where eps dominates -- so the table states nothing (None). Not SGD, Adam, Muon.
* mup_step_size: Muon with exact msign ('svd'), scale 'spectral', and Nesterov or plain momentum (from
  a zero state both give msign(g) on step 1); not Newton-Schulz, not the other scales.
* averaging_identities (post 004, eqs. 2 and 18): refopt's Average, and Schedule-Free with a constant lr,
  no warmup and r = 0 (then every weight c_t = 1/t); not stated for other rules.
* purity, determinism, bit_identical_resume: every refopt rule.

Known limits of the table: Covariant/Hyperball of Muon with eps_mode 'add' hold up to eps; user norms
(a callable ``norm``) are assumed positively homogeneous; Partition is the conjunction of its
sub-rules. The table is checked against the measured outcome of a refopt rule of each family (with
wrappers around several bases) in tests/test_testing_toolkit.py, with a wrong entry as negative control.
"""
from __future__ import annotations

__all__ = ["expected", "EXPECTED_TABLES"]


def expected(rule) -> dict:
    """{property name: True (holds) | False (fails) | None (not stated)} for ``rule``, from the invariance
    facts its conventions file states (:func:`refopt.conventions.facts`; the reasons above)."""
    from refopt.conventions import facts

    f = facts(rule)
    covariant_exact = (True if f["exact_scale_free"] else None) if f["covariant"] else False
    return {
        "gradient_scale_invariance": f["grad_scale"],
        "parameter_scale_covariance": f["covariant"],
        "orthogonal_equivariance": f["orthogonal"],
        "permutation_equivariance": f["elementwise"],
        "reparametrization_covariance": covariant_exact,
        "gpt_symmetry_equivariance": covariant_exact,
        "mup_step_size": f["mup"],
        "averaging_identities": f["averaging"],
        "purity": True,
        "determinism": True,
        "bit_identical_resume": True,
    }


#: The documented expected tables of ``refopt invariants`` for the peers (docs/crosscheck.md), as
#: (implementation, kwargs, framework, rule expression) -> {property: outcome of the implementation}.
#: Measured with the default tolerance policy (1e-5; torch Muon: 0.06, its bfloat16 Newton-Schulz) and
#: max_examples=8; every row's exit status is 0 (each property the refopt rule has, the peer has too).
EXPECTED_TABLES: dict = {
    'torch.optim.SGD': {
        "kwargs": {'lr': 0.1}, "rule": 'SGD(lr=0.1)',
        "outcomes": {
            'gradient_scale_invariance': 'fails',
            'parameter_scale_covariance': 'fails',
            'orthogonal_equivariance': 'holds',
            'permutation_equivariance': 'holds',
            'reparametrization_covariance': 'fails',
            'gpt_symmetry_equivariance': 'fails',
            'mup_step_size': 'fails',
            'purity': 'n/a',
            'determinism': 'holds',
            'bit_identical_resume': 'holds',
        },
    },
    'torch.optim.Adam': {
        "kwargs": {'lr': 0.01}, "rule": 'Adam(lr=0.01)',
        "outcomes": {
            'gradient_scale_invariance': 'holds',
            'parameter_scale_covariance': 'fails',
            'orthogonal_equivariance': 'fails',
            'permutation_equivariance': 'holds',
            'reparametrization_covariance': 'fails',
            'gpt_symmetry_equivariance': 'fails',
            'mup_step_size': 'fails',
            'purity': 'n/a',
            'determinism': 'holds',
            'bit_identical_resume': 'holds',
        },
    },
    'torch.optim.AdamW': {
        "kwargs": {'lr': 0.01}, "rule": 'AdamW(lr=0.01)',
        "outcomes": {
            'gradient_scale_invariance': 'holds',
            'parameter_scale_covariance': 'fails',
            'orthogonal_equivariance': 'fails',
            'permutation_equivariance': 'holds',
            'reparametrization_covariance': 'fails',
            'gpt_symmetry_equivariance': 'fails',
            'mup_step_size': 'fails',
            'purity': 'n/a',
            'determinism': 'holds',
            'bit_identical_resume': 'holds',
        },
    },
    'torch.optim.Muon': {
        "kwargs": {'lr': 0.02}, "rule": 'Muon.like_torch(lr=0.02)',
        "outcomes": {
            'gradient_scale_invariance': 'holds',
            'parameter_scale_covariance': 'fails',
            'orthogonal_equivariance': 'holds',
            'permutation_equivariance': 'fails',
            'reparametrization_covariance': 'fails',
            'gpt_symmetry_equivariance': 'fails',
            'mup_step_size': 'fails',
            'purity': 'n/a',
            'determinism': 'holds',
            'bit_identical_resume': 'holds',
        },
    },
    'optax.adam': {
        "kwargs": {'learning_rate': 0.01}, "rule": 'Adam(lr=0.01)',
        "outcomes": {
            'gradient_scale_invariance': 'holds',
            'parameter_scale_covariance': 'fails',
            'orthogonal_equivariance': 'fails',
            'permutation_equivariance': 'holds',
            'reparametrization_covariance': 'fails',
            'gpt_symmetry_equivariance': 'fails',
            'mup_step_size': 'fails',
            'purity': 'n/a',
            'determinism': 'holds',
            'bit_identical_resume': 'holds',
        },
    },
    'optax.lamb': {
        "kwargs": {'learning_rate': 0.01}, "rule": 'Covariant(Adam(eps=1e-6), lr=0.01)',
        "outcomes": {
            'gradient_scale_invariance': 'holds',
            'parameter_scale_covariance': 'holds',
            'orthogonal_equivariance': 'fails',
            'permutation_equivariance': 'holds',
            'reparametrization_covariance': 'fails',
            'gpt_symmetry_equivariance': 'fails',
            'mup_step_size': 'fails',
            'purity': 'n/a',
            'determinism': 'holds',
            'bit_identical_resume': 'holds',
        },
    },
    'optax.contrib.muon': {
        "kwargs": {'learning_rate': 0.02}, "rule": 'Muon.like_optax(0.02)',
        "outcomes": {
            'gradient_scale_invariance': 'holds',
            'parameter_scale_covariance': 'fails',
            'orthogonal_equivariance': 'holds',
            'permutation_equivariance': 'fails',
            'reparametrization_covariance': 'fails',
            'gpt_symmetry_equivariance': 'fails',
            'mup_step_size': 'fails',
            'purity': 'n/a',
            'determinism': 'holds',
            'bit_identical_resume': 'holds',
        },
    },
}
