"""pytorch_optimizer.NorMuon as ``refopt crosscheck --impl`` drives it (docs/crosscheck.md, "NorMuon").

NorMuon takes parameter groups, each with a ``use_muon`` flag, so ``NorMuon(params, **kwargs)`` alone does not
run. :func:`normuon` puts the arrays of ndim >= 2 in a Muon group and the others (biases, gains) in an AdamW
group, the split ``refopt.like("pytorch_optimizer.NorMuon", ...)`` reproduces (a Partition by
``refopt.at_least_2d_labels``), and hands the keyword arguments to ``NorMuon`` as they are, so one JSON serves
both sides::

    refopt crosscheck --impl docs/factories/normuon.py:normuon \\
        --kwargs '{"lr": 0.01, "momentum": 0.9, "beta2": 0.99, "weight_decay": 0.05}' \\
        --rule 'like("pytorch_optimizer.NorMuon", lr=0.01, momentum=0.9, beta2=0.99, weight_decay=0.05)'

pytorch_optimizer runs its Newton-Schulz iteration in bfloat16 (``zero_power_via_newton_schulz_5``'s
``dtype``). :func:`normuon` runs it in the parameters' dtype (float64 in the cross-check) through a subclass that
replaces the batched path's ``_orthogonalize``, so the rest of the step is compared at refopt's float64
tolerance. :func:`normuon_bfloat16` is the package as it ships: at lr 0.01 its per-step update is 4e-2 (the stream)
to 0.15 (the GPT) from the float64 iteration's, which only the cross-check's bfloat16 Newton-Schulz tier accepts
(the atlas entry ``refopt divergences --only normuon-update-scale`` measures it too, beside the rescale).
"""
from refopt.conventions.normuon import pytorch_optimizer_groups, pytorch_optimizer_normuon


def normuon(params, **kwargs):
    """NorMuon on ``params``: ndim >= 2 in the Muon group, the rest in the AdamW group; Newton-Schulz in the
    params' dtype."""
    return pytorch_optimizer_normuon(params, newton_schulz_dtype="params", **kwargs)


def normuon_bfloat16(params, **kwargs):
    """The same groups, NorMuon as pytorch_optimizer ships it (Newton-Schulz in bfloat16)."""
    return pytorch_optimizer_normuon(params, newton_schulz_dtype="bfloat16", **kwargs)


__all__ = ["normuon", "normuon_bfloat16", "pytorch_optimizer_groups"]
