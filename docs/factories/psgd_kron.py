"""kron_torch.Kron as ``refopt crosscheck --impl`` drives it (docs/crosscheck.md, "PSGD Kron").

kron_torch draws its probe vectors with ``torch.randn_like`` inside ``torch.compile``d functions, whose random
numbers differ from eager torch's, so no shared seed reproduces them. :func:`psgd_kron` asks the cross-check for
named parameters (``named_parameters = True``) and hands the package, at every fit, the probe refopt's rule draws for
that array and step (``refopt.PSGDKron().probe(t, path, shape, dtype)``, transposed to torch's layout). It runs the
package's own functions eagerly, its preconditioner in the params' dtype (``precond_dtype``) and its triangular
solves in that dtype; the keyword arguments go to ``Kron`` as they are, so one JSON serves both sides::

    refopt crosscheck --impl docs/factories/psgd_kron.py:psgd_kron \\
        --kwargs '{"lr": 0.01, "b1": 0.8, "weight_decay": 0.05, "precond_lr": 0.2, "precond_init_scale": 0.5}' \\
        --rule 'like("kron_torch.Kron", lr=0.01, b1=0.8, weight_decay=0.05, precond_lr=0.2, precond_init_scale=0.5)'

:func:`psgd_kron_float32_solves` keeps the package's float32 triangular solves (``_solve_triangular_right`` casts
to float32), the one place its float64 run rounds to float32.
"""
from refopt.conventions.psgd_kron import kron_torch_kron


def psgd_kron(named_params, **kwargs):
    """kron_torch.Kron with refopt's probes, eager, its solves in the params' dtype."""
    return kron_torch_kron(named_params, linear_algebra="params", **kwargs)


def psgd_kron_float32_solves(named_params, **kwargs):
    """The same, with the package's float32 triangular solves."""
    return kron_torch_kron(named_params, linear_algebra="package", **kwargs)


psgd_kron.named_parameters = psgd_kron_float32_solves.named_parameters = True

__all__ = ["psgd_kron", "psgd_kron_float32_solves"]
