#!/usr/bin/env python3
"""flash-linear-attention's recurrent KDA decode, timed like Loom's kda_decode_batched benchmark.

One token for each of B sequences (B = 1, 64, 256), H = HV = 32 heads, K = V = 128, f32 states in
a slot pool updated in place through ssm_state_indices (fla's continuous-batching decode path:
fused_recurrent_kda_fwd with inplace_final_state=True, the entry vLLM's KDA decode uses). q, k, v,
g, beta are f32 like Loom's (a bf16 q/k/v row is printed too); q and k are l2-normalised, g is the
bounded gate -5 * sigmoid(x), beta = sigmoid(x). Bytes counted: states only, read + written once,
B * 32 * 128 * 128 * 4 * 2, as in tests/gpu/kernels_cuda_bench.cc.

Timings (same definitions as the C++ benchmark):
  event: torch.cuda.Event around one call, median of 200; before each start event a 64 MiB
         read-only GEMV (flushes the states out of L2) and torch.cuda._sleep (the Python call
         path takes tens of microseconds: without it the events would time the host too).
  graph: n calls (rotating state sets) captured in one torch.cuda.CUDAGraph; median replay / n.
  do_bench: triton.testing.do_bench median (256 MB L2 clear between calls; for reference).

Usage on the GPU machine: PYTHONPATH=.peers/fla python3 bench/peers/fla_kda_decode.py
(fla's source, git-ignored, fetched from github.com/fla-org/flash-linear-attention; its commit is
in .peers/fla/COMMIT). Prints "FLABENCH <name> <us> us <GB/s> GB/s" lines and a check against a
torch reference.
"""
import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # the Triton kernel, no other backend

import torch
import triton


def import_fla():
    import fla.ops.kda.fused_recurrent as fr
    return fr.fused_recurrent_kda_fwd, os.path.dirname(fla.__file__)


import fla  # noqa: E402

fwd, fla_root = import_fla()
dev = torch.device("cuda")
H = HV = 32
K = V = 128
SLOT_BYTES = HV * K * V * 4


def make(B, dtype, sets):
    g0 = torch.Generator(device=dev).manual_seed(1234 + B)
    r = lambda *s: torch.randn(*s, device=dev, generator=g0)  # noqa: E731
    q = torch.nn.functional.normalize(r(B, 1, H, K), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(r(B, 1, H, K), dim=-1).to(dtype)
    v = r(B, 1, HV, V).to(dtype)
    g = -5.0 * torch.sigmoid(2.0 * r(B, 1, HV, K))
    beta = torch.sigmoid(r(B, 1, HV))
    pool = (0.1 * r(B * sets, HV, K, V)).contiguous()
    perm = torch.randperm(B * sets, device=dev, generator=g0).to(torch.int32)
    slots = [perm[s * B:(s + 1) * B].contiguous() for s in range(sets)]
    out = torch.empty(B, 1, HV, V, device=dev, dtype=dtype)
    return q, k, v, g, beta, pool, slots, out


def call(q, k, v, g, beta, pool, idx, out):
    return fwd(q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, scale=K ** -0.5,
               inplace_final_state=True, ssm_state_indices=idx, out=out)


def check():
    """fla's decode against the recurrence in torch (f64) on 3 sequences."""
    B = 3
    q, k, v, g, beta, pool, slots, out = make(B, torch.float32, 2)
    idx = slots[0]
    S = pool[idx.long()].double().clone()  # [B, HV, K, V]
    call(q, k, v, g, beta, pool, idx, out)
    torch.cuda.synchronize()
    qd, kd, vd = q[:, 0].double() * K ** -0.5, k[:, 0].double(), v[:, 0].double()
    S = S * torch.exp(g[:, 0].double())[..., None]
    kv = torch.einsum("bhkv,bhk->bhv", S, kd)
    u = beta[:, 0].double()[..., None] * (vd - kv)
    S = S + kd[..., None] * u[:, :, None, :]
    o = torch.einsum("bhkv,bhk->bhv", S, qd)
    eo = (out[:, 0].double() - o).abs().max().item()
    es = (pool[idx.long()].double() - S).abs().max().item()
    print(f"FLACHECK out_max_abs_err {eo:.3e} state_max_abs_err {es:.3e} "
          f"({'ok' if eo < 1e-5 and es < 1e-5 else 'MISMATCH'})", flush=True)


def bench(B, dtype):
    sets = max(3, -(-(256 << 20) // (B * SLOT_BYTES)))
    q, k, v, g, beta, pool, slots, out = make(B, dtype, sets)
    bytes_ = 2.0 * B * SLOT_BYTES
    tag = f"fla_kda_decode_B{B}_Hv32_dk128_{'f32' if dtype == torch.float32 else 'bf16qkv'}"
    for s in range(3):  # compile + warm up
        call(q, k, v, g, beta, pool, slots[s % sets], out)
    torch.cuda.synchronize()
    res = {}
    # event
    w = torch.randn(4096, 4096, device=dev)
    x = torch.randn(4096, device=dev)
    iters = 200
    st = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    en = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        torch.mv(w, x)
        torch.cuda._sleep(1_000_000)  # ~0.5 ms at 1.98 GHz: the Python call path fits inside
        st[i].record()
        call(q, k, v, g, beta, pool, slots[i % sets], out)
        en[i].record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) for a, b in zip(st, en))
    res["event"] = ts[len(ts) // 2]
    # graph
    n = max(sets, 24)
    s_ = torch.cuda.Stream()
    s_.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s_):
        for i in range(3):
            call(q, k, v, g, beta, pool, slots[i % sets], out)
    torch.cuda.current_stream().wait_stream(s_)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            call(q, k, v, g, beta, pool, slots[i % sets], out)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    reps = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        reps.append(a.elapsed_time(b) / n)
    reps.sort()
    res["graph"] = reps[len(reps) // 2]
    # do_bench
    cnt = [0]

    def fn():
        cnt[0] += 1
        call(q, k, v, g, beta, pool, slots[cnt[0] % sets], out)

    res["do_bench"] = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    for how, ms in res.items():
        print(f"FLABENCH {tag}_{how} {ms * 1e3:.3f} us {bytes_ / (ms * 1e6):.1f} GB/s", flush=True)
    if not torch.isfinite(out).all():
        print(f"FLABENCH {tag}: non-finite outputs", flush=True)
    del pool
    torch.cuda.empty_cache()


def main():
    print(f"fla: {fla_root} (commit {open(os.path.join(fla_root, '..', 'COMMIT')).read().strip() if fla_root and os.path.exists(os.path.join(fla_root, '..', 'COMMIT')) else '?'}), "
          f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}",
          flush=True)
    check()
    for B in (1, 64, 256):
        bench(B, torch.float32)
    for B in (1, 256):
        bench(B, torch.bfloat16)


if __name__ == "__main__":
    main()
