#!/usr/bin/env python3
"""Training speed of flash-linear-attention's KDAForCausalLM in PyTorch: the peer side of issue
14's comparison with loom-trainer (bench/peers/README.md).

Builds fla's KDAForCausalLM from a "kda" config.json (fla's KDAConfig), random init from --seed
(fla's own _init_weights), fp32 parameters and torch's fused AdamW (betas 0.9/0.95, eps 1e-8,
weight decay 0.1 on matrices only, global-norm clipping at 1.0: loom-trainer's defaults), and
trains on B x T token windows on one CUDA GPU: --warmup steps (Triton compiles and autotunes
fla's kernels there), then timed steps until --steps or --seconds, whichever comes first. The
loss is fla's own (labels = inputs, shifted inside the model; with the config's
fuse_cross_entropy the fused linear + cross-entropy, which never forms the [B*T, V] logits).

Precisions (--precision, a comma list; each one a fresh model and optimizer from the same seed):
  bf16  fp32 master weights and AdamW state, forward and backward under
        torch.autocast(cuda, bfloat16): what fla's users do on one GPU (flame trains with FSDP's
        bf16 param_dtype and fp32 master weights, the same arithmetic).
  f32   no autocast; torch's matmuls in true f32 (torch.backends.cuda.matmul.allow_tf32 False,
        torch's default). fla's Triton kernels given f32 inputs use Triton's default dot
        precision, TF32: chunk_kda does not ask for more.
  bf16w bf16 parameters, AdamW state and activations (model.to(bfloat16)), no autocast: for
        configs where autocast's mix of bf16 and f32 tensors fails in fla's Triton kernels (its
        Block AttnRes kernel refuses bf16 and f32 sources together, seen at bc3b101d).
Timing: the loop does not synchronise per step (no .item(): losses stay on the GPU until the
end), as a training loop that logs every N steps runs; torch.cuda.synchronize() before the
first and after the last timed step bounds the wall time, and CUDA events give each step's
time. tokens/s = timed steps x B x T / that wall time.

Data: --shard FILE, a Loom token shard (bench/peers/random_shard.py writes one), from which each
step draws B windows of T tokens at uniform offsets on the GPU, as loom-trainer's shards task
does; without it, uniform random ids in [0, vocab) drawn on the GPU each step.

Prints one JSON line per precision ("peer": "fla"): tokens/s, step times, parameters (PyTorch's
count and bench/peers/model_flops.py's, which must agree), training FLOPs per token and MFU
against the H200's dense peaks (bf16 989, TF32 494, f32 67 TFLOP/s), peak memory, first and last
loss, and the versions. --dry-run prints the FLOPs count and exits without torch.

  PYTHONPATH=.peers/fla python3 bench/peers/fla_train.py --config bench/peers/kda_train_config.json \\
      --batch 8 --seq-len 2048 --precision bf16,f32 [--shard FILE] [--seconds 15]
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model_flops  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="a flash-linear-attention 'kda' config.json")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (B)")
    ap.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (T)")
    ap.add_argument("--precision", default="bf16", help="comma list of bf16, bf16w, f32")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compiles)")
    ap.add_argument("--steps", type=int, default=500, help="at most this many timed steps")
    ap.add_argument("--seconds", type=float, default=15.0, help="stop timing after about this long")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate (constant)")
    ap.add_argument("--shard", help="a Loom token shard to draw the windows from")
    ap.add_argument("--label", default="", help="a name carried into the JSON line")
    ap.add_argument("--dry-run", action="store_true", help="print the FLOPs count, no torch")
    a = ap.parse_args()
    if a.batch < 1 or a.seq_len < 2 or a.warmup < 1 or a.steps < 1 or a.seconds <= 0:
        ap.error("need --batch >= 1, --seq-len >= 2, --warmup >= 1, --steps >= 1, --seconds > 0")
    a.precisions = [p.strip() for p in a.precision.split(",") if p.strip()]
    bad = [p for p in a.precisions if p not in ("bf16", "bf16w", "f32")]
    if bad or not a.precisions:
        ap.error(f"--precision: {bad or a.precision!r}: each must be bf16, bf16w or f32")
    return a


def read_shard(path):
    """A Loom token shard's tokens (trainer/token_shard.h), as a numpy array."""
    import numpy as np
    with open(path, "rb") as f:
        head = f.read(32)
    if len(head) < 32 or head[:8] != b"LOOMTOKS":
        raise SystemExit(f"fla_train: {path} is not a Loom token shard (no LOOMTOKS magic)")
    version, width, docs, ntok = (int.from_bytes(head[o:o + n], "little")
                                  for o, n in ((8, 4), (12, 4), (16, 8), (24, 8)))
    if version != 1 or width not in (2, 4):
        raise SystemExit(f"fla_train: {path}: shard version {version}, width {width} unsupported")
    offset = 32 + 8 * (docs + 1)
    dtype = np.uint16 if width == 2 else np.uint32
    toks = np.fromfile(path, dtype=dtype, offset=offset)
    if toks.size != ntok:
        raise SystemExit(f"fla_train: {path}: {toks.size} tokens, header says {ntok}")
    return toks


def import_fla():
    """fla with a flash_attn it can import: the real package if installed, else the SDPA stand-in
    in bench/peers/flash_attn_sdpa (fla's GQA layer refuses to build without one)."""
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # fla's Triton kernels only
    try:
        import flash_attn  # noqa: F401
        attention = f"flash_attn {getattr(flash_attn, '__version__', '?')}"
    except ImportError:
        sys.path.insert(0, os.path.join(HERE, "flash_attn_sdpa"))
        attention = "sdpa (torch scaled_dot_product_attention; no flash-attn package)"
    try:
        import fla
        from fla.models import KDAConfig, KDAForCausalLM
    except ImportError as e:
        raise SystemExit(f"fla_train: cannot import fla ({e}); put its source on PYTHONPATH "
                         "(PYTHONPATH=.peers/fla, bench/peers/README.md says how to get it)")
    return fla, KDAConfig, KDAForCausalLM, attention


def main():
    a = parse_args()
    with open(a.config) as f:
        cfg_json = json.load(f)
    flops = model_flops.training_flops_per_token(cfg_json, a.seq_len)
    if a.dry_run:
        print(json.dumps({"peer": "fla", "dry_run": True, "config": a.config,
                          "flops_per_token": flops["flops_per_token"], "terms": flops["terms"],
                          "params_counted": flops["params"]["total"]}))
        return 0

    try:
        import torch
    except ImportError:
        raise SystemExit("fla_train: PyTorch is not installed here (the H200 machine has it)")
    if not torch.cuda.is_available():
        raise SystemExit("fla_train: no CUDA GPU: fla's Triton kernels need one")
    fla, KDAConfig, KDAForCausalLM, attention = import_fla()
    import transformers
    import triton

    config = KDAConfig.from_dict(cfg_json)
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 mode: true f32 matmuls (torch default)
    if a.shard:
        tokens = torch.from_numpy(read_shard(a.shard).astype("int64")).to(dev)
        if tokens.numel() < a.seq_len + 1:
            raise SystemExit(f"fla_train: {a.shard} holds fewer than {a.seq_len + 1} tokens")
        if int(tokens.max()) >= config.vocab_size:
            raise SystemExit(f"fla_train: {a.shard} holds ids outside the vocabulary")
    commit = ""
    commit_file = os.path.join(os.path.dirname(os.path.dirname(fla.__file__)), "COMMIT")
    if os.path.exists(commit_file):
        with open(commit_file) as f:
            commit = f.read().strip()

    for precision in a.precisions:
        torch.manual_seed(a.seed)
        torch.cuda.reset_peak_memory_stats()
        model = KDAForCausalLM(config).to(dev)  # fp32 parameters, fla's init
        if precision == "bf16w":
            model = model.to(torch.bfloat16)
        model.train()
        params = sum(p.numel() for p in model.parameters())
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
        gen = torch.Generator(device=dev).manual_seed(a.seed)
        span = torch.arange(a.seq_len, device=dev)

        def batch():
            if a.shard:
                start = torch.randint(0, tokens.numel() - a.seq_len, (a.batch, 1), device=dev,
                                      generator=gen)
                return tokens[start + span]
            return torch.randint(0, config.vocab_size, (a.batch, a.seq_len), device=dev,
                                 generator=gen)

        def step():
            x = batch()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        t0 = time.perf_counter()
        losses = [step() for _ in range(a.warmup)]
        torch.cuda.synchronize()
        warmup_s = time.perf_counter() - t0
        first_loss = float(losses[0])

        events = []
        losses = []
        t0 = time.perf_counter()
        while len(events) < a.steps and (not events or time.perf_counter() - t0 < a.seconds):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            losses.append(step())
            e1.record()
            events.append((e0, e1))
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        step_ms = sorted(e0.elapsed_time(e1) for e0, e1 in events)
        n = len(events)
        tps = n * a.batch * a.seq_len / wall
        fpt = flops["flops_per_token"]
        m = model_flops.mfu(tps, fpt)
        out = {
            "peer": "fla", "label": a.label, "config": a.config, "precision": precision,
            "attention": attention, "batch": a.batch, "seq_len": a.seq_len,
            "tokens_per_step": a.batch * a.seq_len, "warmup_steps": a.warmup,
            "warmup_s": round(warmup_s, 2), "timed_steps": n, "timed_s": round(wall, 3),
            "step_ms_mean": round(1e3 * wall / n, 3), "step_ms_median": round(step_ms[n // 2], 3),
            "tokens_per_s": round(tps, 1), "params": params,
            "params_counted": flops["params"]["total"],
            "params_match": params == flops["params"]["total"],
            "flops_per_token": fpt, "flop_terms": flops["terms"],
            "model_tflops": round(tps * fpt / 1e12, 4),
            "mfu_bf16": round(m["bf16"], 6), "mfu_tf32": round(m["tf32"], 6),
            "mfu_fp32": round(m["fp32"], 6),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "loss_first": round(first_loss, 4), "loss_last": round(float(losses[-1]), 4),
            "data": f"shard {a.shard}" if a.shard else "uniform random ids",
            "fuse": {k: bool(getattr(config, k)) for k in
                     ("fuse_norm", "fuse_swiglu", "fuse_cross_entropy")},
            "fla_commit": commit, "torch": torch.__version__, "triton": triton.__version__,
            "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name(),
        }
        print(json.dumps(out), flush=True)
        del model, opt, decay, no_decay, losses, events
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
