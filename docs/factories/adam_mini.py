"""pytorch_optimizer.AdamMini as ``refopt crosscheck --impl`` drives it (docs/crosscheck.md, "Adam-mini").

AdamMini takes a model and picks each parameter's blocks by its name, so ``AdamMini(params, **kwargs)`` does not
run. :func:`adam_mini` asks the cross-check for named parameters (``named_parameters = True``: it is handed
``[(path, param), ...]`` with refopt's leaf paths), builds a ``torch.nn.Module`` whose names are those paths in
torch's spelling (``blocks[0].attn.w_q`` -> ``blocks.0.attn.wq.weight``, the names
``refopt.like("pytorch_optimizer.AdamMini", ...)`` reads) and hands the keyword arguments to ``AdamMini`` as they
are, so one JSON serves both sides (the GPT problem has C = 16 and H = 2)::

    refopt crosscheck --impl docs/factories/adam_mini.py:adam_mini \\
        --kwargs '{"lr": 0.01, "betas": [0.8, 0.99], "weight_decay": 0.05, "num_embeds": 16, "num_heads": 2}' \\
        --rule 'like("pytorch_optimizer.AdamMini", lr=0.01, betas=(0.8, 0.99), weight_decay=0.05, num_embeds=16, num_heads=2)'

The package casts the gradient to float32 and keeps m and v in float32 whatever the params' dtype. :func:`adam_mini`
runs its own code with that float32 read as the params' dtype (float64 in the cross-check), so its arithmetic is
compared at refopt's float64 tolerance; :func:`adam_mini_float32` is the package as it ships, whose float32 state
puts it about 1e-7 (relative) from the float64 reference.
"""
from refopt.conventions.adam_mini import pytorch_optimizer_adam_mini, torch_name


def adam_mini(named_params, **kwargs):
    """AdamMini on a module named after the params' paths; its float32 read as the params' dtype."""
    return pytorch_optimizer_adam_mini(named_params, state_dtype="params", **kwargs)


def adam_mini_float32(named_params, **kwargs):
    """The same module, AdamMini as pytorch_optimizer ships it (float32 gradient, m and v)."""
    return pytorch_optimizer_adam_mini(named_params, state_dtype="float32", **kwargs)


adam_mini.named_parameters = adam_mini_float32.named_parameters = True

__all__ = ["adam_mini", "adam_mini_float32", "torch_name"]
