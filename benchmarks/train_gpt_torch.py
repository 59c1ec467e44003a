"""The default ``refopt train`` GPT run, in PyTorch CPU eager with torch.optim.AdamW: the wall-time peer.

Same model (``models.gpt`` default config: 4 layers, n_embd 128, 4 heads, block 64, SwiGLU, tied head,
RMSNorm with gains, float32), same initial weights (refopt's ``gpt.init``, copied), same data (the
``GPTTask`` of ``refopt train``: CPython's ``pydoc_data.topics``, the batch of step s drawn from
``default_rng([seed, s])``), same number of steps, warmup and cosine schedule, same validation batches
every ``--eval-interval`` steps and at the end, and the same 300 sampled characters at the end. The
optimizer differs on purpose: AdamW on every array (lr 3e-3, weight decay 0.01, betas (0.9, 0.999), eps
1e-8, or ``--beta1``, ``--beta2``, ``--eps`` when given), the comparison the issue asks for (refopt's
default is Muon + AdamW). ``refopt train --optimizer adamw`` runs the same optimizer in refopt, for a
comparison of the libraries alone.

Usage (torch must be installed: ``pip install torch==2.13.0``)::

    PYTHONPATH=. python benchmarks/train_gpt_torch.py [--threads 2] [--steps N] [--lr 3e-3] [MODEL OPTIONS]

MODEL OPTIONS are ``refopt train``'s, passed on to it (``--n-embd 256 --n-layer 6``, ``--batch-size``,
``--eval-interval``, ...; an unknown one exits with ``refopt train``'s usage error); the feed-forward,
head and QK-norm must stay at their defaults (SwiGLU, tied, none), which this twin implements, and
``--model``, ``--optimizer``, ``--resume`` and ``--diagnostics`` are refused.

Prints the validation losses, the final one, and the wall time of the run (training, evaluations and
sampling; imports and data loading excluded, as in ``refopt train``'s "N steps in S s" line, which
also excludes them). Freed heap pages are reused as in ``refopt train`` unless ``--malloc default``. Not a test; the time depends on the machine and its load.
"""
from __future__ import annotations

import argparse
import os
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="default: refopt train's GPT default")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--malloc", default="keep", choices=["keep", "default"],
                    help="keep: reuse freed heap pages, as refopt train does; default: glibc's settings")
    a, model_options = ap.parse_known_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import refopt
    from refopt.cli import explicit_options, train

    torch.set_num_threads(a.threads)
    if a.malloc == "keep":   # the same allocator settings as refopt train (refopt.cli._memory)
        from refopt.cli._memory import keep_freed_memory

        keep_freed_memory()
    p = argparse.ArgumentParser()
    train.add_arguments(p)
    args = p.parse_args(["--optimizer", "adamw", "--seed", str(a.seed)]
                        + ([] if a.steps is None else ["--steps", str(a.steps)]) + model_options)
    args.explicit_options = explicit_options(["train"] + model_options)   # checked as refopt train checks them
    if args.model != "gpt" or args.optimizer != "adamw" or args.resume or args.diagnostics:
        raise SystemExit("train_gpt_torch.py: the twin trains the GPT with torch's AdamW from its init "
                         "(no --model, --optimizer, --resume or --diagnostics)")
    try:
        task, _, _, steps = train.prepare(args)
    except ValueError as e:   # an impossible option value, worded as refopt train words it
        raise SystemExit(f"train_gpt_torch.py: {e}") from None
    cfg = task.config
    if cfg.ffn != "swiglu" or not cfg.tie_head or cfg.qk_norm:
        raise SystemExit("train_gpt_torch.py: this twin covers --ffn swiglu with a tied head and no --qk-norm only")
    schedule = args.schedule_fn
    H, hs, eps = cfg.n_head, cfg.head_size, cfg.norm_eps

    p0 = task.init_params(a.seed)
    tp = refopt.tree.tree_map(lambda w: torch.nn.Parameter(torch.from_numpy(w.copy())), p0)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def logits_of(x):
        B, T = x.shape
        h = tp["wte"][x] + tp["wpe"][:T]
        for blk in tp["blocks"]:
            at, ml = blk["attn"], blk["mlp"]
            z = rms(h, blk["attn_norm"])
            q, k, v = ((z @ at[n]).view(B, T, H, hs).transpose(1, 2) for n in ("w_q", "w_k", "w_v"))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + o.transpose(1, 2).reshape(B, T, -1) @ at["w_o"]
            z = rms(h, blk["mlp_norm"])
            h = h + (F.silu(z @ ml["w_gate"]) * (z @ ml["w_up"])) @ ml["w_down"]
        return rms(h, tp["final_norm"]) @ tp["wte"].T

    def loss_of(x, y):
        lg = logits_of(x)
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))

    def val_loss():
        with torch.no_grad():
            return float(np.mean([float(loss_of(torch.from_numpy(x), torch.from_numpy(y)))
                                  for x, y in task.eval_batches]))

    opt = torch.optim.AdamW(refopt.tree.leaves(tp), lr=a.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                            weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: float(schedule(i + 1)))  # gamma of step i + 1
    print(f"load average before: {os.getloadavg()}")
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = task.batch(a.seed, step)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        opt.step()
        sched.step()
        if step % args.eval_interval == 0 or step == steps:
            final = val_loss()
            print(f"step {step}: batch loss {float(loss.detach()):.4f}, val_loss {final:.4f}")
    gen = torch.Generator().manual_seed(a.seed)
    out = torch.from_numpy(task.vocab.encode(task.corpus.text[:1])[None, :].astype(np.int64))
    with torch.no_grad():
        for _ in range(args.sample_chars):
            lg = logits_of(out[:, -cfg.block_size:])[:, -1, :] / 0.8
            out = torch.cat([out, torch.multinomial(torch.softmax(lg, -1), 1, generator=gen)], dim=1)
    seconds = time.perf_counter() - t0
    print(f"sample: {task.vocab.decode(out[0].numpy())[:120]!r}...")
    print(f"load average after: {os.getloadavg()}")
    print(f"torch {torch.__version__} eager AdamW: val_loss={final:.4f}; {steps} steps in {seconds:.1f} s "
          f"({1000 * seconds / steps:.1f} ms/step), threads {a.threads}, malloc {a.malloc}")


if __name__ == "__main__":
    main()
