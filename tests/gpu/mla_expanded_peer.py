#!/usr/bin/env python3
"""Peer numbers for tests/gpu/mla_expanded_cuda_bench.cc: PyTorch's scaled_dot_product_attention
on the same shapes (B = 1, H = 32, q/k head dim 192, v head dim 128, bf16, causal with the
diagonal at the bottom right: row i of T new rows sees past + i + 1 keys), timed with CUDA
events (median of several calls after a warm-up), in one call over all keys (no key blocks).

Backends:
  - flash (FlashAttention-2 inside PyTorch): needs equal head dims, so v is padded with zeros to
    192 (the padded columns are computed and thrown away: 1.2x the useful P V work);
  - cudnn (cuDNN's fused attention): takes v of 128 as it is, where the installed cuDNN allows.
TFLOP/s count the useful FLOPs of the Loom benchmark, 2 * visible pairs * H * (192 + 128), for
both. Prints a markdown table. Needs only torch.
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

H, DQK, DV = 32, 192, 128
PEAK = 989.0
SHAPES = [("fresh_T8192", 8192, 0), ("fresh_T16384", 16384, 0), ("past122880_T8192", 8192, 122880)]


def time_ms(fn, iters, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main():
    dev = torch.device("cuda")
    rows = []
    for name, T, past in SHAPES:
        S = past + T
        g = torch.Generator(device=dev).manual_seed(1)
        q = torch.randn(1, H, T, DQK, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, H, S, DQK, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, H, S, DV, device=dev, dtype=torch.bfloat16, generator=g)
        scale = DQK ** -0.5
        pairs = T * past + T * (T + 1) / 2
        flop = 2.0 * pairs * H * (DQK + DV)
        iters = 5 if flop > 5e12 else 15
        causal = dict(is_causal=True) if past == 0 else dict(attn_mask=causal_lower_right(T, S))
        vp = F.pad(v, (0, DQK - DV))
        for backend, label, vv in ((SDPBackend.FLASH_ATTENTION, "flash (v padded to 192)", vp),
                                   (SDPBackend.CUDNN_ATTENTION, "cudnn", v)):
            try:
                with sdpa_kernel([backend]):
                    fn = lambda: F.scaled_dot_product_attention(q, k, vv, scale=scale, **causal)
                    ms = time_ms(fn, iters)
                rows.append((name, label, ms, flop / (ms * 1e9)))
            except Exception as e:  # a backend that refuses the shape
                rows.append((name, label, float("nan"), float("nan")))
                print(f"{name} {label}: {type(e).__name__}: {str(e).splitlines()[0][:160]}",
                      file=sys.stderr)
        del q, k, v, vp
        torch.cuda.empty_cache()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| shape | backend | ms | TFLOP/s | of 989 peak |")
    print("|---|---|---|---|---|")
    for name, label, ms, tf in rows:
        print(f"| {name} | {label} | {ms:.3f} | {tf:.1f} | {100 * tf / PEAK:.1f}% |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
