"""Train the default GPT on the default corpus with AdamW (warmup + cosine) and report time and val loss.

Usage: python benchmarks/gpt_lr_probe.py [--lr 3e-3] [--steps 600] [--warmup 50] [--tie/--no-tie] ...
The probe behind the defaults of ``refopt train --model gpt``; prints one line per evaluation.
"""
import argparse
import math
import time

import numpy as np

import refopt
from refopt.models import gpt
from refopt.models.data import CharVocab, get_batch, load_text, split_ids
from refopt.autograd import value_and_grad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--final", type=float, default=0.1, help="final lr multiplier of the cosine")
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--beta2", type=float, default=0.99)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ffn", default="swiglu")
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--init", default="normal")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    corpus = load_text()
    vocab = CharVocab(corpus.text)
    train, val = split_ids(vocab.encode(corpus.text))
    cfg = gpt.GPTConfig(vocab_size=vocab.size, ffn=a.ffn, tie_head=not a.untied, init=a.init)
    params = gpt.init(cfg, a.seed)

    def schedule(t):
        if t <= a.warmup:
            return t / a.warmup
        p = min(1.0, (t - a.warmup) / max(1, a.steps - a.warmup))
        return a.final + (1 - a.final) * 0.5 * (1 + math.cos(math.pi * p))

    rule = refopt.AdamW(lr=a.lr, beta1=0.9, beta2=a.beta2, eps=1e-8, weight_decay=a.wd, schedule=schedule)
    state = refopt.init(rule, params)
    vg = value_and_grad(gpt.loss)
    rng = np.random.default_rng(a.seed)
    val_rng = np.random.default_rng(12345)
    val_batches = [get_batch(val, cfg.block_size, a.batch, val_rng) for _ in range(a.eval_batches)]

    def val_loss():
        return float(np.mean([gpt.loss(params, x, y, cfg) for x, y in val_batches]))

    t0 = time.perf_counter()
    train_time = 0.0
    for step in range(1, a.steps + 1):
        ts = time.perf_counter()
        x, y = get_batch(train, cfg.block_size, a.batch, rng)
        loss, grads = vg(params, x, y, cfg)
        params, state = refopt.update_(rule, state, params, grads)
        train_time += time.perf_counter() - ts
        if step % a.eval_every == 0 or step == a.steps:
            print(f"step {step} train {loss:.4f} val {val_loss():.4f} train_s {train_time:.1f} "
                  f"ms/step {1e3 * train_time / step:.0f} wall {time.perf_counter() - t0:.1f}", flush=True)


if __name__ == "__main__":
    main()
