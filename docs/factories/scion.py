"""pytorch_optimizer.SCION as ``refopt crosscheck --impl`` drives it (docs/crosscheck.md, "Scion").

pytorch_optimizer runs Scion's Newton-Schulz iteration (its spectral oracle) in bfloat16. :func:`scion` runs the
package with the iteration in the parameters' dtype (float64 in the cross-check): the package module's
``zero_power_via_newton_schulz_5`` is wrapped during each step; everything else is the package's. The keyword
arguments go to ``SCION`` as they are, so one JSON serves both sides::

    refopt crosscheck --impl docs/factories/scion.py:scion \\
        --kwargs '{"lr": 0.02, "momentum": 0.3, "scale": 2.0, "weight_decay": 0.1}' \\
        --rule 'like("pytorch_optimizer.SCION", lr=0.02, momentum=0.3, scale=2.0, weight_decay=0.1)'

:func:`scion_bfloat16` is the package as it ships.
"""
from refopt.conventions.scion import pytorch_optimizer_scion


def scion(params, **kwargs):
    """pytorch_optimizer.SCION on ``params`` with Newton-Schulz in the params' dtype."""
    return pytorch_optimizer_scion(params, newton_schulz_dtype="params", **kwargs)


def scion_bfloat16(params, **kwargs):
    """pytorch_optimizer.SCION as it ships (Newton-Schulz in bfloat16)."""
    return pytorch_optimizer_scion(params, newton_schulz_dtype="bfloat16", **kwargs)


__all__ = ["scion", "scion_bfloat16"]
