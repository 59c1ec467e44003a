"""The default ``refopt train`` GPT run, in PyTorch CPU eager with torch.optim.AdamW: the wall-time peer.

Same model (``models.gpt``: by default 4 layers, n_embd 128, 4 heads, block 64, SwiGLU, tied head,
RMSNorm with gains, float32), same initial weights (refopt's ``gpt.init``, copied), same data (the
``GPTTask`` of ``refopt train``: CPython's ``pydoc_data.topics``, the batch of step s drawn from
``default_rng([seed, s])``), same number of steps, warmup and schedule, same validation batches every
``--eval-interval`` steps and at the end, and ``--sample-chars`` sampled characters at the end (drawn
with torch's generator, so not refopt's text). The optimizer differs on purpose: torch's AdamW on every
array with the settings ``refopt train --optimizer adamw`` would use (lr 3e-3, weight decay 0.01, betas
(0.9, 0.999), eps 1e-8 unless given), the usual baseline (refopt's default is Muon +
AdamW). ``refopt train --optimizer adamw`` with the same options runs the same optimizer in refopt, for
a comparison of the libraries alone.

Usage (torch must be installed: ``pip install torch==2.13.0``)::

    PYTHONPATH=. python benchmarks/train_gpt_torch.py [--threads 2] [--malloc keep] [REFOPT TRAIN OPTIONS]

Every other option is ``refopt train``'s, parsed, defaulted and checked by it (``--steps``, ``--seed``,
``--lr``, ``--weight-decay``, ``--beta1``, ``--n-embd 256 --n-layer 6``, ``--batch-size``, ...; a bad one
exits with status 2 and one line, as there). Refused, because this twin does not implement them: another
``--model`` or ``--optimizer``, ``--wd-mode independent`` (torch's AdamW decays as 'decoupled'), ``--ffn``
other than swiglu, ``--untie-head``, ``--qk-norm``, and the options about a run directory or its
checkpoints (``--out``, ``--overwrite``, ``--resume``, ``--stop-after``, ``--checkpoint-interval``,
``--diagnostics``, ``--no-progress``).

Prints the validation losses, the final one, and the wall time of the run (training, evaluations and
sampling; imports and data loading excluded, as in ``refopt train``'s "N steps in S s" line, which
also excludes them). Freed heap pages are reused as in ``refopt train`` unless ``--malloc default``. Not a
test; the time depends on the machine and its load.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

#: refopt train options about a run directory, its checkpoints or its outputs: this twin has none
NOT_HERE = ("out", "overwrite", "resume", "stop_after", "checkpoint_interval",
            "diagnostics", "no_progress")


def _error(msg: str):
    print(f"train_gpt_torch.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Every other option is refopt train's (refopt train --help), checked as there; see the module "
               "docstring for the few this twin refuses.")
    ap.add_argument("--threads", type=int, default=2, help="torch's and the BLAS's threads (>= 1)")
    ap.add_argument("--malloc", default="keep", choices=["keep", "default"],
                    help="keep: reuse freed heap pages, as refopt train does; default: glibc's settings")
    own, train_options = ap.parse_known_args()
    if own.threads < 1:
        ap.error(f"--threads must be >= 1, got {own.threads}")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(own.threads)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import refopt
    from refopt.cli import explicit_options, train

    torch.set_num_threads(own.threads)
    if own.malloc == "keep":   # the same allocator settings as refopt train (refopt.cli._memory)
        from refopt.cli._memory import keep_freed_memory

        keep_freed_memory()
    train_parser = argparse.ArgumentParser(prog="train_gpt_torch.py",
                                           usage="%(prog)s [--threads N] [--malloc M] [refopt train options]")
    train.add_arguments(train_parser)
    args = train_parser.parse_args(["--optimizer", "adamw"] + train_options)
    args.explicit_options = explicit_options(["train"] + train_options)   # checked as refopt train checks them
    if args.model != "gpt" or args.optimizer != "adamw":
        _error(f"--model {args.model} --optimizer {args.optimizer}: this twin trains the GPT with AdamW only")
    refused = sorted(set(NOT_HERE) & args.explicit_options)
    if refused:
        _error(f"{', '.join('--' + r.replace('_', '-') for r in refused)}: not in this twin, which trains the GPT "
               f"with torch's AdamW and writes no run directory")
    if args.ffn != "swiglu" or args.untie_head or args.qk_norm:
        _error("this twin implements --ffn swiglu with a tied head and no --qk-norm only")
    try:
        task, rule, _, steps = train.prepare(args)
    except (ValueError, OSError) as e:   # an impossible option value or an unreadable --data file
        _error(str(e))
    if rule.wd_mode != "decoupled":
        _error(f"--wd-mode {rule.wd_mode}: torch's AdamW decays as 'decoupled' only")
    cfg = task.config
    schedule = args.schedule_fn   # None: a constant learning rate
    H, hs, eps = cfg.n_head, cfg.head_size, cfg.norm_eps

    p0 = task.init_params(args.seed)
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

    opt = torch.optim.AdamW(refopt.tree.leaves(tp), lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps,
                            weight_decay=rule.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(   # gamma of step i + 1
        opt, lambda i: 1.0 if schedule is None else float(schedule(i + 1)))
    print(f"load average before: {os.getloadavg()}")
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = task.batch(args.seed, step)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(torch.from_numpy(x), torch.from_numpy(y))
        batch_loss = float(loss.detach())
        if not math.isfinite(batch_loss):   # as refopt train stops
            _error(f"the training loss became {batch_loss} at step {step}; lower --lr")
        loss.backward()
        opt.step()
        sched.step()
        if step % args.eval_interval == 0 or step == steps:
            final = val_loss()
            print(f"step {step}: batch loss {batch_loss:.4f}, val_loss {final:.4f}")
    gen = torch.Generator().manual_seed(args.seed)
    out = torch.from_numpy(task.vocab.encode(task.corpus.text[:1])[None, :].astype(np.int64))
    with torch.no_grad():
        for _ in range(args.sample_chars):
            lg = logits_of(out[:, -cfg.block_size:])[:, -1, :] / 0.8
            out = torch.cat([out, torch.multinomial(torch.softmax(lg, -1), 1, generator=gen)], dim=1)
    seconds = time.perf_counter() - t0
    print(f"sample: {task.vocab.decode(out[0].numpy())[:120]!r}...")
    print(f"load average after: {os.getloadavg()}")
    print(f"torch {torch.__version__} eager AdamW: val_loss={final:.4f}; {steps} steps in {seconds:.1f} s "
          f"({1000 * seconds / steps:.1f} ms/step), threads {own.threads}, malloc {own.malloc}")


if __name__ == "__main__":
    main()
