"""The optimizer rules: each a frozen record of hyperparameters (see :mod:`refopt.core`)."""
from refopt.rules.adam import Adam, AdamState, AdamW
from refopt.rules.sgd import SGD, SGDState

__all__ = ["SGD", "SGDState", "Adam", "AdamW", "AdamState"]
