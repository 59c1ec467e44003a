"""What ``refopt train`` can train: a task = model + data + batching + evaluation.

``MLPTask``: the MLP of ``models.mlp`` on scikit-learn's 8x8 digits. (``GPTTask`` follows.)
A task's batches come from the ``numpy.random.Generator`` the trainer passes in, so the data order
depends only on the seed.
"""
from __future__ import annotations

import numpy as np


class MLPTask:
    """Digits classification with the reference MLP.

    Batches: each epoch is a fresh permutation of the training set from the trainer's Generator,
    cut into ``batch_size`` pieces (the last, shorter piece is dropped).
    """

    name = "mlp"

    def __init__(self, args, dtype):
        from models import mlp
        from models.data import load_digits

        self.mlp = mlp
        self.data = load_digits(dtype=dtype)
        self.dtype = dtype
        self.batch_size = args.batch_size
        self.sizes = [64, *args.hidden, 10]
        n = len(self.data.y_train)
        if not 1 <= self.batch_size <= n:
            raise ValueError(f"--batch-size must be in [1, {n}] for the digits training set, got {self.batch_size}")
        self.steps_per_epoch = n // self.batch_size
        self._queue: list[np.ndarray] = []

    def describe(self) -> dict:
        d = self.data
        return {"model": "mlp", "sizes": self.sizes, "data": "sklearn digits 8x8 (UCI optdigits)",
                "data_sha256": d.sha256, "n_train": len(d.y_train), "n_test": len(d.y_test)}

    def init_params(self, seed: int):
        return self.mlp.init(seed, self.sizes, dtype=self.dtype)

    def loss(self, params, x, y):
        return self.mlp.loss(params, x, y)

    def batch(self, rng: np.random.Generator):
        if not self._queue:
            perm = rng.permutation(len(self.data.y_train))
            self._queue = [perm[i * self.batch_size:(i + 1) * self.batch_size]
                           for i in range(self.steps_per_epoch)][::-1]
        idx = self._queue.pop()
        return self.data.x_train[idx], self.data.y_train[idx]

    def _split_metrics(self, params, x, y) -> tuple[float, float]:
        logits = np.asarray(self.mlp.apply(params, x), dtype=np.float64)
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        loss = float(-logp[np.arange(len(y)), y].mean())
        acc = float((logits.argmax(axis=1) == y).mean())
        return loss, acc

    def evaluate(self, params) -> dict:
        d = self.data
        tr_loss, tr_acc = self._split_metrics(params, d.x_train, d.y_train)
        te_loss, te_acc = self._split_metrics(params, d.x_test, d.y_test)
        return {"train_loss": tr_loss, "train_acc": tr_acc, "test_loss": te_loss, "test_acc": te_acc}

    def periodic_eval(self, params) -> dict:
        """Cheap metrics logged every --eval-interval steps."""
        loss, acc = self._split_metrics(params, self.data.x_test, self.data.y_test)
        return {"val_loss": loss, "val_acc": acc}

    def finish(self, params, out_dir: str, seed: int) -> dict:
        return {}
