"""What ``refopt train`` can train: a task = model + data + batching + evaluation.

``MLPTask``: the MLP of ``refopt.models.mlp`` on scikit-learn's 8x8 digits. ``GPTTask``: the GPT of
``refopt.models.gpt`` on a character-level corpus (default: CPython's ``pydoc_data.topics``).

Batches are a pure function of ``(seed, step)``, so a run resumed from a checkpoint at step k sees the
same data as the uninterrupted run.
"""
from __future__ import annotations

import numpy as np


class MLPTask:
    """Digits classification with the reference MLP.

    Batches: epoch e (0-based) is the permutation ``default_rng([seed, e]).permutation(n_train)``, cut into
    ``batch_size`` pieces (a last, shorter piece is dropped); step s takes piece (s-1) mod steps_per_epoch.
    """

    name = "mlp"
    eval_split = "test"      # the digits have no validation split: the periodic val_* metrics use the test set

    def __init__(self, args, dtype):
        from refopt.models import mlp
        from refopt.models.data import load_digits

        self.mlp = mlp
        self.data = load_digits(dtype=dtype)
        self.dtype = dtype
        self.batch_size = args.batch_size
        self.sizes = [64, *args.hidden, 10]
        n = len(self.data.y_train)
        if not 1 <= self.batch_size <= n:
            raise ValueError(f"--batch-size must be in [1, {n}] for the digits training set, got {self.batch_size}")
        self.steps_per_epoch = n // self.batch_size
        self._perm: tuple[int, np.ndarray] | None = None

    def describe(self) -> dict:
        d = self.data
        return {"model": "mlp", "sizes": self.sizes, "data": "sklearn digits 8x8 (UCI optdigits)",
                "data_sha256": d.sha256, "n_train": len(d.y_train), "n_test": len(d.y_test)}

    def labels(self, params):
        """Which arrays are the 'hidden' matrices for Muon-like rules: :func:`refopt.mlp_labels`, exactly
        as the API labels the MLP (the same labels for the same model, from Python or the command line)."""
        return self.mlp.labels(params)

    def init_params(self, seed: int):
        return self.mlp.init(seed, self.sizes, dtype=self.dtype)

    def loss(self, params, x, y):
        return self.mlp.loss(params, x, y)

    def batch(self, seed: int, step: int):
        epoch, piece = divmod(step - 1, self.steps_per_epoch)
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([seed, epoch]).permutation(len(self.data.y_train)))
        idx = self._perm[1][piece * self.batch_size:(piece + 1) * self.batch_size]
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
        """Metrics logged every --eval-interval steps (the test split doubles as validation here)."""
        loss, acc = self._split_metrics(params, self.data.x_test, self.data.y_test)
        return {"val_loss": loss, "val_acc": acc}

    def finish(self, params, out_dir: str, seed: int) -> dict:
        return {}


class GPTTask:
    """Character-level language modelling with the reference GPT.

    Data: the corpus of ``--data`` (default ``pydoc_data.topics``), encoded with its sorted character
    vocabulary, split 90 % train / 10 % validation (the end of the text). Training batch of step s:
    ``get_batch(train, T, B, default_rng([seed, s]))``. Validation loss: the mean over ``--eval-batches``
    fixed batches drawn once from ``default_rng(12345)`` (the same for every run and seed).
    """

    name = "gpt"
    eval_split = "validation"
    EVAL_SEED = 12345
    #: the final metrics are the periodic ones (train.final_metrics reuses the last row's, if logged)
    final_is_periodic = ("val_loss",)

    def __init__(self, args, dtype):
        from refopt.models import gpt
        from refopt.models.data import CharVocab, get_batch, load_text, split_ids

        self.gpt, self.get_batch = gpt, get_batch
        self.corpus = load_text(args.data)
        self.vocab = CharVocab(self.corpus.text)
        ids = self.vocab.encode(self.corpus.text)
        self.train_ids, self.val_ids = split_ids(ids, 0.1)
        self.dtype = dtype
        if args.n_embd % args.n_head:
            raise ValueError(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head} (each head takes "
                             f"n_embd / n_head of the width)")
        self.config = gpt.GPTConfig(vocab_size=self.vocab.size, block_size=args.block_size, n_layer=args.n_layer,
                                    n_head=args.n_head, n_embd=args.n_embd, ffn=args.ffn, qk_norm=args.qk_norm,
                                    tie_head=not args.untie_head, init=args.init)
        T = self.config.block_size
        if len(self.val_ids) < T + 1:
            raise ValueError(f"the validation part of the text ({len(self.val_ids)} characters) is shorter than "
                             f"--block-size + 1 = {T + 1}; use a longer text or a smaller --block-size")
        self.batch_size = args.batch_size
        self.steps_per_epoch = max(1, len(self.train_ids) // (self.batch_size * T))
        erng = np.random.default_rng(self.EVAL_SEED)
        self.eval_batches = [get_batch(self.val_ids, T, self.batch_size, erng) for _ in range(args.eval_batches)]
        self.sample_chars = args.sample_chars
        self._checked = False

    def describe(self) -> dict:
        c = self.corpus
        return {"model": "gpt", "config": self.config.to_dict(), "num_params": self.gpt.num_params(self.config),
                "data": c.source, "data_sha256": c.sha256, "python_version": c.python_version,
                "n_chars": len(c.text), "vocab_size": self.vocab.size,
                "n_train_tokens": len(self.train_ids), "n_val_tokens": len(self.val_ids)}

    def labels(self, params):
        return self.gpt.labels(params)

    def init_params(self, seed: int):
        return self.gpt.init(self.config, seed, dtype=self.dtype)

    def _check_once(self, params) -> bool:
        """Validate the params' structure and shapes on the first call only (``gpt.check_params``, about
        0.7 ms); the training loop passes arrays of the same structure every step. Returns False."""
        if not self._checked:
            self.gpt.check_params(params, self.config)
            self._checked = True
        return False

    def loss(self, params, x, y):
        return self.gpt.loss(params, x, y, self.config, check=self._check_once(params))

    def batch(self, seed: int, step: int):
        return self.get_batch(self.train_ids, self.config.block_size, self.batch_size,
                              np.random.default_rng([seed, step]))

    def _val_loss(self, params) -> float:
        check = self._check_once(params)
        return float(np.mean([float(self.gpt.loss(params, x, y, self.config, check=check))
                              for x, y in self.eval_batches]))

    def periodic_eval(self, params) -> dict:
        return {"val_loss": self._val_loss(params)}

    def evaluate(self, params) -> dict:
        return {"val_loss": self._val_loss(params)}

    def finish(self, params, out_dir: str, seed: int) -> dict:
        import os

        prompt = self.vocab.encode(self.corpus.text[:1])[None, :]
        out = self.gpt.generate(params, prompt, self.sample_chars, temperature=0.8, seed=seed, config=self.config)
        text = self.vocab.decode(out[0])
        with open(os.path.join(out_dir, "sample.txt"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        return {"sample (temperature 0.8)": text}
