"""Catalog entries for the wrapper rules: Hyperball (AdamH, MuonH), Covariant, Average, EMA (see catalog.py).

Hyperball keeps every array on its sphere ||W|| = R = ||W_0||, which does not hold the quadratic's minimum,
so it never converges there. Covariant's step has the fixed relative size lr*gamma_t*||W||: with a
constant lr it orbits the minimum, so its cases decay lr with a cosine schedule to 0.
"""
from catalog import Case, matrix_params

from refopt.rules.adam import Adam, AdamW
from refopt.rules.averaging import EMA, Average
from refopt.rules.covariant import Covariant
from refopt.rules.hyperball import Hyperball
from refopt.rules.muon import Muon
from refopt.rules.sgd import SGD
from refopt.schedules import warmup_cosine

_SPHERE = "Hyperball stays on the sphere ||W|| = ||W_0||, which does not contain the quadratic's minimum"

CASES = [
    Case("hyperball_adam", lambda: Hyperball(Adam(beta2=0.99), lr=0.05), converges=False, note=_SPHERE),
    Case("hyperball_sgd_radius_schedule", lambda: Hyperball(SGD(momentum=0.9, nesterov=True), lr=0.1, radius=2.0,
                                                            schedule=warmup_cosine(3, 300, 0.1)),
         converges=False, note=_SPHERE),
    Case("hyperball_adamw_wd0", lambda: Hyperball(AdamW(weight_decay=0.0), lr=0.02), converges=False, note=_SPHERE),
    Case("muonh", lambda: Hyperball(Muon(), lr=0.02), matrix_params, converges=False, note=_SPHERE),
    Case("covariant_sgd", lambda: Covariant(SGD(momentum=0.9), lr=0.1, schedule=warmup_cosine(0, 300, 0.0))),
    Case("covariant_adam_rms", lambda: Covariant(Adam(), lr=0.05, norm="rms", schedule=warmup_cosine(5, 300, 0.0))),
    Case("covariant_muon", lambda: Covariant(Muon(msign="svd"), lr=0.05, schedule=warmup_cosine(0, 300, 0.0)),
         matrix_params),
    Case("average_sgd", lambda: Average(SGD(lr=0.1, momentum=0.9))),
    Case("ema_adam", lambda: EMA(Adam(lr=0.05), decay=0.9)),
    Case("ema_sgd_param_init", lambda: EMA(SGD(lr=0.1), decay=0.95, debias=False)),
    Case("ema_torch_after_first_step", lambda: EMA(SGD(lr=0.1, momentum=0.9), decay=0.9, debias=False,
                                                   start="after_first_step")),
    Case("average_hyperball_adam", lambda: Average(Hyperball(Adam(), lr=0.05)), converges=False, note=_SPHERE),
]
