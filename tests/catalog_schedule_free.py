"""Catalog entries for Schedule-Free SGD and AdamW (see catalog.py)."""
from catalog import Case

from refopt.rules.schedule_free import ScheduleFreeAdamW, ScheduleFreeSGD
from refopt.schedules import WSD, warmup_cosine

CASES = [
    Case("sf_sgd", lambda: ScheduleFreeSGD(lr=0.1)),
    Case("sf_sgd_warmup_r_wd", lambda: ScheduleFreeSGD(lr=0.1, beta=0.8, warmup_steps=5, r=0.5,
                                                         weight_lr_power=1.0, weight_decay=1e-3)),
    Case("sf_sgd_schedule", lambda: ScheduleFreeSGD(lr=0.1, schedule=WSD(2, 100, 300))),
    Case("sf_sgd_warmup_lag", lambda: ScheduleFreeSGD(lr=0.1, warmup_steps=5, weight_decay=1e-3, warmup_lag=True)),
    Case("sf_adamw", lambda: ScheduleFreeAdamW(lr=0.05)),
    Case("sf_adamw_warmup_lag", lambda: ScheduleFreeAdamW(lr=0.05, warmup_steps=5, weight_decay=0.01,
                                                          warmup_lag=True)),
    Case("sf_adamw_warmup_r_wd", lambda: ScheduleFreeAdamW(lr=0.05, warmup_steps=5, r=1.0, weight_decay=0.01)),
    Case("sf_adamw_decay_at_z_schedule", lambda: ScheduleFreeAdamW(lr=0.05, weight_decay=0.01, decay_at_z=True,
                                                                     schedule=warmup_cosine(3, 300, 0.1))),
]
