"""pytorch_optimizer.SOAP as ``refopt crosscheck --impl`` drives it (docs/crosscheck.md, "SOAP").

SOAP's first step computes the eigenvectors of Kronecker factors built from one gradient. For an m x n
gradient with m > n + 1 the factor G G^T has a repeated zero eigenvalue, and any orthonormal basis of its
eigenspace is an eigenbasis: ``torch.linalg.eigh`` returns the one its rounding noise selects, and Adam's
per-coordinate step in that basis differs from the step in another. :func:`soap` runs pytorch_optimizer's SOAP
with refopt's canonical eigenbasis (``refopt.linalg.eigen.eigh_descending``) and its float64 refresh (the
package runs the refresh's QR in float32), through a subclass that replaces those two methods; everything else
is the package's. The keyword arguments go to ``SOAP`` as they are, so one JSON serves both sides::

    refopt crosscheck --impl docs/factories/soap.py:soap \\
        --kwargs '{"lr": 0.01, "betas": [0.9, 0.99], "weight_decay": 0.05, "precondition_frequency": 4}' \\
        --rule 'like("pytorch_optimizer.SOAP", lr=0.01, betas=(0.9, 0.99), weight_decay=0.05, precondition_frequency=4)'

:func:`soap_as_shipped` is the package as it ships; on the canonical problems it parts from refopt at the second
step (the atlas entry ``refopt divergences --only soap-eigenbasis`` measures by how much).
"""
from refopt.conventions.soap import pytorch_optimizer_soap


def soap(params, **kwargs):
    """pytorch_optimizer.SOAP on ``params`` with refopt's canonical eigenbasis and float64 refresh."""
    return pytorch_optimizer_soap(params, linear_algebra="refopt", **kwargs)


def soap_as_shipped(params, **kwargs):
    """pytorch_optimizer.SOAP as it ships (torch.linalg.eigh, the refresh's QR in float32)."""
    return pytorch_optimizer_soap(params, linear_algebra="package", **kwargs)


__all__ = ["soap", "soap_as_shipped"]
