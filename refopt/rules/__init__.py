"""The optimizer rules: each a frozen record of hyperparameters (see :mod:`refopt.core`), one small file per
family (:mod:`~refopt.rules.base` holds what they share). Every public rule class defined in a module of this
folder is exported here and by :mod:`refopt` (:func:`exported_rules`): adding a rule file needs no edit
elsewhere."""
import importlib as _importlib
import inspect as _inspect
import pkgutil as _pkgutil

from refopt.rules.adam import AdamState, AMSGradState
from refopt.rules.base import ElementwiseRule, Wrapper
from refopt.rules.partition import RefoptWarning, at_least_2d_labels, matrix_labels
from refopt.rules.sgd import SGDState


def _discover() -> dict:
    """{name: class} of the public rule classes defined in the modules of this folder, by module name."""
    from refopt.core import Rule

    found = {}
    for info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "base":
            continue
        mod = _importlib.import_module(f"{__name__}.{info.name}")
        for name, obj in vars(mod).items():
            if (_inspect.isclass(obj) and issubclass(obj, Rule) and obj.__module__ == mod.__name__
                    and not name.startswith("_") and not _inspect.isabstract(obj)):
                found[name] = obj
    return found


_RULES = _discover()
globals().update(_RULES)


def exported_rules() -> list:
    """Every public rule class of this folder (refopt.Adam, refopt.Muon, ...)."""
    return list(_RULES.values())


__all__ = [*_RULES, "SGDState", "AdamState", "AMSGradState", "RefoptWarning", "ElementwiseRule", "Wrapper",
           "matrix_labels", "at_least_2d_labels", "exported_rules"]
