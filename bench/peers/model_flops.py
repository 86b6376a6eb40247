#!/usr/bin/env python3
"""Training FLOPs per token for a flash-linear-attention "kda" config.json (KDAForCausalLM), the
one count used for both sides of bench/peers/fla_train.py's comparison (PyTorch + fla against
loom-trainer), so that their model FLOPs utilisation (MFU) compares like with like.

Model FLOPs, not hardware FLOPs: what the model's math needs for one training step (forward and
backward) divided by the tokens, whatever an implementation recomputes (activation
checkpointing, FlashAttention's backward recomputing QK^T, the delta-rule backward replaying
states) or wastes (masked halves of tiles) is not counted. A multiply-add is 2 FLOPs. The terms:

  matmul     6 x (weight-matrix parameters a token passes through): 2 per parameter in the forward,
             4 in the backward (input gradient and weight gradient). Every nn.Linear weight of
             the model (KDA q/k/v/o, the low-rank gate f_proj and output gate g_proj, b_proj, the
             GQA q/k/v/o, the SwiGLU gate/up/down, the Block AttnRes pseudo-queries
             attn_res_proj/mlp_res_proj/res_proj, which are [1, hidden] vectors, and the LM head).
             The embedding is a gather and counts 0; biases, norms, A_log, dt_bias and the short
             convolutions' weights are not matrices and count 0 (see "not counted").
  attention  causal softmax attention of the GQA layers: per head, query t scores t + 1 keys
             (QK^T: 2 x head_dim FLOPs each) and mixes t + 1 values (PV: 2 x head_dim), averaged
             over t = 0 .. T-1 of a T-token sequence: 2 x 2 x head_dim x (T + 1) / 2 forward per
             head per token; training = 3 x forward (dS -> dQ, dK and dP, dV in the backward).
  kda        the chunked delta rule of the KDA layers (fla's chunk_kda, Loom's chunked form), per
             value head, chunk C = 64, key dim K, value dim V, per token (the chunk's FLOPs / C),
             forward:
               A_kk = strictly lower (k Γ)(k / Γ)^T          (C - 1) K
               A_qk = lower incl. diagonal (q Γ)(k / Γ)^T    (C + 1) K
               (I + A_kk)^-1, unit lower triangular          C^2 / 3
               w = T (beta k Γ)                              (C + 1) K
               u = T (beta v)                                (C + 1) V
               v_new = u - w S                               2 K V
               o = (q Γ) S + A_qk v_new                      2 K V + (C + 1) V
               S <- decay(S) + (k Γ')^T v_new                2 K V
             (a lower-triangular C x C product with an n-column matrix costs C (C + 1) / 2 x 2n,
             i.e. (C + 1) n per token); training = 3 x forward. The tail chunk of a T that is not
             a multiple of C is counted as a full one's average.

  not counted (elementwise, O(hidden) per token and layer; a rough count of them comes to about
  1% of the total for bench/peers/kda_train_config.json and 5% for the small config): RMS norms,
  SwiGLU, RoPE, softmax, the KDA gate (softplus, cumulative sums, exp), the short convolutions
  (2 x conv_size FLOPs per channel), l2 norms of q and k, the output gate's sigmoid, Block
  AttnRes's softmax over its sources and weighted sum (4 x hidden per source), the cross-entropy
  softmax, the optimizer.

MFU = tokens/s x training FLOPs per token / peak, with the H200's dense peaks (NVIDIA's H200 SXM
data sheet): bf16 989 TFLOP/s, TF32 494 TFLOP/s, f32 on the CUDA cores (no tensor cores) 67
TFLOP/s.

Usage:
  python3 bench/peers/model_flops.py CONFIG.json --seq-len T    # one JSON line
  python3 bench/peers/model_flops.py --self-test                # hand counts on tiny configs
No dependency beyond Python's standard library.
"""
import argparse
import json
import math
import os
import struct
import sys

PEAK_FLOPS = {"bf16": 989e12, "tf32": 494e12, "fp32": 67e12}
KDA_CHUNK = 64


def _kda_geometry(cfg):
    """The sizes fla's KDAForCausalLM builds from a "kda" config.json (fla/models/kda,
    fla/layers/kda.py, fla/layers/attn.py, fla/modules/mlp.py), with its defaults."""
    if cfg.get("model_type") != "kda":
        raise ValueError(f"model_flops: model_type {cfg.get('model_type')!r}: only fla's 'kda' "
                         "config.json is counted here")
    for key in ("allow_neg_eigval", "use_l2warp"):
        if cfg.get(key):
            raise ValueError(f"model_flops: {key} = true is not counted (Loom refuses it too)")
    if cfg.get("use_short_conv", True) is False:
        raise ValueError("model_flops: use_short_conv = false is not counted (Loom refuses it)")
    d = int(cfg["hidden_size"])
    g = {
        "hidden": d,
        "layers": int(cfg["num_hidden_layers"]),
        "vocab": int(cfg["vocab_size"]),
        "tie": bool(cfg.get("tie_word_embeddings", False)),
        "heads": int(cfg.get("num_heads", 16)),
        "head_k": int(cfg.get("head_dim", 128)),
        "conv": int(cfg.get("conv_size", 4)),
        "attnres": cfg.get("attnres_block_size") is not None,
    }
    g["v_heads"] = int(cfg.get("num_v_heads") or g["heads"])
    expand_v = float(cfg.get("expand_v", 1.0))
    g["head_v"] = int(g["head_k"] * expand_v)
    if g["head_v"] != g["head_k"] * expand_v:
        raise ValueError("model_flops: head_dim * expand_v must be an integer")
    g["key_dim"] = g["heads"] * g["head_k"]
    g["value_dim"] = g["v_heads"] * g["head_v"]
    g["gate_dim"] = g["v_heads"] * g["head_k"]
    inter = cfg.get("intermediate_size")
    if inter is None:  # fla's GatedMLP rule: 2/3 of hidden x ratio, up to a multiple of 256
        ratio = cfg.get("hidden_ratio") or 4
        inter = 256 * ((int(d * ratio * 2 / 3) + 255) // 256)
    g["inter"] = int(inter)
    attn = cfg.get("attn")
    g["attn_layers"] = set()
    if attn is not None:
        if isinstance(attn, list):
            raise ValueError("model_flops: a list of attn specs is not counted (Loom reads one)")
        g["attn_layers"] = set(int(x) for x in attn["layers"])
        g["attn_heads"] = int(attn["num_heads"])
        g["attn_kv_heads"] = int(attn.get("num_kv_heads") or g["attn_heads"])
        if d % g["attn_heads"]:
            raise ValueError("model_flops: attn.num_heads must divide hidden_size")
        g["attn_head_dim"] = d // g["attn_heads"]  # fla's Attention: hidden_size / num_heads
        g["attn_bias"] = bool(attn.get("qkv_bias", False))
        g["attn_window"] = attn.get("window_size")
        if any(l < 0 or l >= g["layers"] for l in g["attn_layers"]):
            raise ValueError("model_flops: attn.layers outside [0, num_hidden_layers)")
    return g


def parameter_counts(cfg):
    """{"total", "matmul", "embedding", "other"}: every parameter of KDAForCausalLM, split into
    weight matrices a token's forward multiplies by (the "matmul" term's N), the embedding table,
    and the rest (norms, biases, convolutions, A_log, dt_bias)."""
    g = _kda_geometry(cfg)
    d = g["hidden"]
    matmul = other = 0
    for layer in range(g["layers"]):
        other += 2 * d  # attn_norm, mlp_norm
        if g["attnres"]:
            matmul += 2 * d  # attn_res_proj, mlp_res_proj: [1, hidden]
            other += 2 * d  # attn_res_norm, mlp_res_norm
        if layer in g["attn_layers"]:
            hd, kv = g["attn_head_dim"], g["attn_kv_heads"] * g["attn_head_dim"]
            matmul += d * d + 2 * d * kv + d * d  # q, k, v, o
            if g["attn_bias"]:
                other += d + 2 * kv
        else:
            kd, vd, gd, hv = g["key_dim"], g["value_dim"], g["gate_dim"], g["head_v"]
            matmul += 2 * d * kd + d * vd  # q, k, v projections
            matmul += d * hv + hv * gd  # f_proj: low rank (head_v_dim) gate
            matmul += d * g["v_heads"]  # b_proj
            matmul += d * hv + hv * vd  # g_proj: low rank output gate
            matmul += vd * d  # o_proj
            other += (2 * kd + vd) * g["conv"]  # q/k/v short convolutions, no bias
            other += g["v_heads"] + gd  # A_log, dt_bias
            other += vd  # g_proj's second Linear's bias
            other += hv  # o_norm (FusedRMSNormGated over head_v_dim)
        matmul += 3 * d * g["inter"]  # SwiGLU gate, up, down
    other += d  # final norm
    if g["attnres"]:
        matmul += d  # res_proj
        other += d  # res_norm
    embedding = g["vocab"] * d
    matmul += g["vocab"] * d  # LM head (the embedding matrix when tied: multiplied all the same)
    # Tied: the LM head's matrix is the embedding table, one tensor.
    total = matmul + other + (0 if g["tie"] else embedding)
    return {"total": total, "matmul": matmul, "embedding": embedding, "other": other}


def attention_pairs_per_token(seq_len, window=None):
    """Mean number of keys a query scores in a causal T-token sequence (with a sliding window:
    at most `window`)."""
    if window is None:
        return (seq_len + 1) / 2
    w = int(window)
    return sum(min(t + 1, w) for t in range(seq_len)) / seq_len


def kda_forward_flops_per_token_head(k, v, chunk=KDA_CHUNK):
    c = chunk
    return ((c - 1) * k + (c + 1) * k + c * c / 3 + (c + 1) * k + (c + 1) * v
            + 2 * k * v + 2 * k * v + (c + 1) * v + 2 * k * v)


def training_flops_per_token(cfg, seq_len):
    """Training FLOPs per token and its terms (see the module's docstring)."""
    if seq_len < 1:
        raise ValueError("model_flops: seq_len must be >= 1")
    g = _kda_geometry(cfg)
    p = parameter_counts(cfg)
    n_attn = len(g["attn_layers"])
    n_kda = g["layers"] - n_attn
    terms = {"matmul": 6.0 * p["matmul"], "attention": 0.0, "kda": 0.0}
    if n_attn:
        pairs = attention_pairs_per_token(seq_len, g["attn_window"])
        fwd = g["attn_heads"] * pairs * (2 * g["attn_head_dim"] + 2 * g["attn_head_dim"])
        terms["attention"] = 3.0 * n_attn * fwd
    terms["kda"] = 3.0 * n_kda * g["v_heads"] * kda_forward_flops_per_token_head(
        g["head_k"], g["head_v"])
    return {
        "flops_per_token": sum(terms.values()),
        "terms": terms,
        "params": p,
        "seq_len": seq_len,
        "kda_layers": n_kda,
        "attention_layers": n_attn,
        "kda_chunk": KDA_CHUNK,
    }


def mfu(tokens_per_s, flops_per_token):
    """{"bf16": ..., "tf32": ..., "fp32": ...}: achieved model FLOP/s over each H200 peak."""
    return {k: tokens_per_s * flops_per_token / peak for k, peak in PEAK_FLOPS.items()}


def safetensors_numel(path):
    """Sum of the element counts of the tensors in a .safetensors file (or of every
    *.safetensors in a folder), read from the headers alone."""
    files = ([os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".safetensors")]
             if os.path.isdir(path) else [path])
    if not files:
        raise ValueError(f"model_flops: no .safetensors under {path}")
    total, count = 0, 0
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                total += math.prod(t["shape"])
                count += 1
    return total, count


def _self_test():
    """Hand counts on tiny configs, written out term by term, against the functions above."""
    failures = []

    def check(what, got, want):
        if abs(got - want) > 1e-9 * max(1.0, abs(want)):
            failures.append(f"{what}: got {got}, want {want}")

    # hidden 8, 2 layers: layer 0 KDA (2 heads of 4, conv 4), layer 1 GQA (2 heads of 4, 1 kv
    # head), SwiGLU 16, vocab 10, Block AttnRes on, untied.
    tiny = {"model_type": "kda", "hidden_size": 8, "num_hidden_layers": 2, "num_heads": 2,
            "head_dim": 4, "conv_size": 4, "intermediate_size": 16, "vocab_size": 10,
            "attnres_block_size": 2, "tie_word_embeddings": False,
            "attn": {"layers": [1], "num_heads": 2, "num_kv_heads": 1}}
    # KDA layer: q 8x8, k 8x8, v 8x8, f_proj 8x4 + 4x8, b_proj 8x2, g_proj 8x4 + 4x8, o 8x8
    kda_mat = 64 + 64 + 64 + (32 + 32) + 16 + (32 + 32) + 64  # 400
    kda_other = 24 * 4 + (2 + 8) + 8 + 4  # convs 96, A_log + dt_bias 10, g bias 8, o_norm 4
    # GQA layer: head_dim 8 / 2 = 4, kv_dim 4: q 64, k 32, v 32, o 64
    gqa_mat = 64 + 32 + 32 + 64  # 192
    mlp = 3 * 8 * 16  # 384
    per_layer_mat_attnres = 2 * 8  # attn_res_proj, mlp_res_proj
    per_layer_other = 2 * 8 + 2 * 8  # 2 pre-norms, 2 attnres norms
    matmul = kda_mat + gqa_mat + 2 * mlp + 2 * per_layer_mat_attnres + 8 + 80  # + res_proj, head
    other = kda_other + 2 * per_layer_other + 8 + 8  # + final norm, res_norm
    p = parameter_counts(tiny)
    check("tiny matmul params", p["matmul"], matmul)
    check("tiny other params", p["other"], other)
    check("tiny total params", p["total"], matmul + other + 80)
    # T = 4: attention pairs 1 + 2 + 3 + 4 = 10 over 4 queries; per pair per head QK 2x4 + PV 2x4
    t = 4
    attn_fwd = 2 * (10 / 4) * 16
    # KDA, C = 64, K = V = 4, 2 heads: per head forward 63*4 + 65*4 + 4096/3 + 65*4 + 65*4
    # + 3 * 2*4*4 + 65*4
    kda_fwd_head = 252 + 260 + 4096 / 3 + 260 + 260 + 96 + 260
    r = training_flops_per_token(tiny, t)
    check("tiny matmul term", r["terms"]["matmul"], 6 * matmul)
    check("tiny attention term", r["terms"]["attention"], 3 * attn_fwd)
    check("tiny kda term", r["terms"]["kda"], 3 * 2 * kda_fwd_head)
    check("tiny total", r["flops_per_token"], 6 * matmul + 3 * attn_fwd + 6 * kda_fwd_head)
    check("window pairs", attention_pairs_per_token(5, window=2), (1 + 2 + 2 + 2 + 2) / 5)
    check("causal pairs", attention_pairs_per_token(3), 2.0)
    # Tied embeddings and no AttnRes: the head's matrix is counted once in total and in matmul.
    tied = dict(tiny, tie_word_embeddings=True, attnres_block_size=None)
    pt = parameter_counts(tied)
    check("tied total", pt["total"], pt["matmul"] + pt["other"])
    check("tied matmul", pt["matmul"], matmul - 2 * per_layer_mat_attnres - 8)
    # The fla-written fixture (fla_kda_s0: fla's own state dict) holds exactly this many.
    here = os.path.dirname(os.path.abspath(__file__))
    for fx in (os.environ.get("LOOM_FIXTURES_DIR", ""), "/work/shared/fixtures",
               os.path.join(here, "..", "..", "..", "shared", "fixtures")):
        d = os.path.join(fx, "fla_kda_s0")
        if fx and os.path.exists(os.path.join(d, "model.safetensors")):
            with open(os.path.join(d, "config.json")) as f:
                fcfg = json.load(f)
            numel, _ = safetensors_numel(os.path.join(d, "model.safetensors"))
            check("fla_kda_s0 parameters (fla's state dict)", parameter_counts(fcfg)["total"], numel)
            print(f"model_flops: fla_kda_s0 fixture: {numel} parameters in fla's state dict, "
                  f"{parameter_counts(fcfg)['total']} counted")
            break
    else:
        print("model_flops: fla_kda_s0 fixture not found; its parameter check skipped")
    for bad, msg in (({"model_type": "loom"}, "model_type"),
                     (dict(tiny, allow_neg_eigval=True), "allow_neg_eigval")):
        try:
            parameter_counts(bad)
            failures.append(f"{msg}: no error")
        except ValueError:
            pass
    if failures:
        print("model_flops self-test FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("model_flops self-test: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", help="a kda config.json")
    ap.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (T)")
    ap.add_argument("--tokens-per-s", type=float, help="also print MFU at this throughput")
    ap.add_argument("--safetensors", help="a .safetensors file or folder: compare its element "
                    "count with the config's parameter count")
    ap.add_argument("--self-test", action="store_true", help="check the counts by hand")
    a = ap.parse_args()
    if a.self_test:
        return _self_test()
    if not a.config:
        ap.error("a config.json (or --self-test) is required")
    with open(a.config) as f:
        cfg = json.load(f)
    r = training_flops_per_token(cfg, a.seq_len)
    if a.tokens_per_s is not None:
        r["mfu"] = mfu(a.tokens_per_s, r["flops_per_token"])
    if a.safetensors:
        numel, count = safetensors_numel(a.safetensors)
        r["safetensors"] = {"numel": numel, "tensors": count,
                            "matches": numel == r["params"]["total"]}
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
