#!/usr/bin/env python3
"""flash-linear-attention's chunked KDA forward, timed like Loom's tests/gpu/kda_chunked_bench.cc.

Same shapes and inputs as the C++ benchmark: H = HV = 32 heads, K = V = 128, bf16 q/k/v/beta,
f32 gates from the bounded gate -5 * sigmoid(.) (precomputed, use_gate_in_kernel=False;
safe_gate=True with lower_bound=-5, fla's fast path for bounded gates), l2-normalised q and k,
f32 initial states, final state written (output_final_state=True). Sequences are packed in one
row with cu_seqlens (and cu_seqlens_cpu, so fla's chunk indices need no device-to-host copy):
B = 1 at T = 8192 and 32768, and the same 10-sequence mix. Also f32 q/k/v at T = 8192.

Timing: torch.cuda.Event around one chunk_kda call, median of 20 (10 at T = 32768) after warm-up;
torch.cuda._sleep before each start event lets the Python call path run ahead (fla launches
several Triton kernels per call, so without it the events would time the host too). Bytes and
FLOPs are counted as in the C++ benchmark (the same formulas, so the ratios compare directly).

Usage on the GPU machine: PYTHONPATH=.peers/fla python3 bench/peers/fla_chunk_kda.py
Prints "FLACHUNK <name> <median ms> <TFLOP/s> <GB/s>" lines; the names match Loom's KDACHUNK
lines. A check against fla's own naive recurrence on a small problem comes first.
"""
import math
import os

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # the Triton kernels, no other backend

import torch  # noqa: E402
import triton  # noqa: E402

import fla  # noqa: E402
from fla.ops.kda import chunk_kda  # noqa: E402

dev = torch.device("cuda")
H = 32
D = 128


def make(lens, dtype, seed=1234):
    gen = torch.Generator(device=dev).manual_seed(seed)
    N = sum(lens)
    r = lambda *s: torch.randn(*s, device=dev, generator=gen)  # noqa: E731
    q = torch.nn.functional.normalize(r(1, N, H, D), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(r(1, N, H, D), dim=-1).to(dtype)
    v = r(1, N, H, D).to(dtype)
    a = torch.exp(-2.0 + 2.5 * (torch.arange(H, device=dev) + 0.5) / H)  # exp(A_log), as Loom's
    g = -5.0 * torch.sigmoid(a[:, None] * 2.0 * r(1, N, H, D))
    beta = torch.sigmoid(r(1, N, H)).to(dtype)
    h0 = 0.1 * r(len(lens), H, D, D)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.long)
    return q, k, v, g.float(), beta, h0, cu.to(dev), cu


def call(q, k, v, g, beta, h0, cu, cu_cpu):
    return chunk_kda(q, k, v, g, beta, scale=D ** -0.5, initial_state=h0, output_final_state=True,
                     safe_gate=True, lower_bound=-5.0, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)


def counts(lens, bf16):
    flops = 0.0
    for n in lens:
        flops += math.ceil(n / 64) * H * (2 * 10 * 2 * 16 * 16 * D + 2 * 64 * 64 * D +
                                          2 * 2 * 64 * 64 * D + 3 * 2 * 64 * D * D)
    es = 2 if bf16 else 4
    N = sum(lens)
    bytes_ = N * H * (D * es * 4 + D * 4 + es) + 2 * len(lens) * H * D * D * 4
    return flops, bytes_


def check():
    from fla.ops.kda.naive import naive_recurrent_kda
    lens = [200, 7, 65]
    q, k, v, g, beta, h0, cu, cu_cpu = make(lens, torch.float32, seed=7)
    with torch.inference_mode():
        o, ht = call(q, k, v, g, beta, h0, cu, cu_cpu)
        errs = []
        for i, (a, b) in enumerate(zip(cu_cpu[:-1].tolist(), cu_cpu[1:].tolist())):
            o_ref, s_ref = naive_recurrent_kda(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b],
                                               beta[:, a:b], scale=D ** -0.5,
                                               initial_state=h0[i:i + 1], output_final_state=True)
            errs.append(((o[:, a:b] - o_ref).norm() / o_ref.norm()).item())
            errs.append(((ht[i:i + 1] - s_ref).norm() / s_ref.norm()).item())
    print(f"FLACHECK chunk_kda f32 vs naive_recurrent_kda: max rel L2 {max(errs):.3e} "
          f"({'ok' if max(errs) < 1e-2 else 'MISMATCH'}; fla's Triton dots on f32 inputs run in tf32)", flush=True)


def bench(name, lens, dtype, iters):
    q, k, v, g, beta, h0, cu, cu_cpu = make(lens, dtype)
    with torch.inference_mode():
        for _ in range(3):
            o, ht = call(q, k, v, g, beta, h0, cu, cu_cpu)
        torch.cuda.synchronize()
        st = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        en = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            torch.cuda._sleep(2_000_000)  # ~1 ms: the Python call path runs ahead of the GPU
            st[i].record()
            o, ht = call(q, k, v, g, beta, h0, cu, cu_cpu)
            en[i].record()
        torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in zip(st, en))[iters // 2]
    flops, bytes_ = counts(lens, dtype == torch.bfloat16)
    ok = bool(torch.isfinite(o).all()) and bool(torch.isfinite(ht).all())
    print(f"FLACHUNK {name} {ms:.4f} {flops / (ms * 1e9):.1f} {bytes_ / (ms * 1e6):.1f}"
          f"{'' if ok else ' NONFINITE'}", flush=True)
    del q, k, v, g, beta, h0, o, ht
    torch.cuda.empty_cache()


def main():
    root = os.path.dirname(fla.__file__)
    commit_file = os.path.join(root, "..", "COMMIT")
    commit = open(commit_file).read().strip() if os.path.exists(commit_file) else "?"
    print(f"fla: {root} (commit {commit}), torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    check()
    mix = [4096, 2048, 1024, 512, 300, 65, 9, 3, 1000, 1]
    bench("kda_chunk_B1_H32_T8192_bf16", [8192], torch.bfloat16, 20)
    bench("kda_chunk_B1_H32_T32768_bf16", [32768], torch.bfloat16, 10)
    bench("kda_chunk_varlen10_H32_N9058_bf16", mix, torch.bfloat16, 20)
    bench("kda_chunk_B1_H32_T8192_f32", [8192], torch.float32, 5)


if __name__ == "__main__":
    main()
