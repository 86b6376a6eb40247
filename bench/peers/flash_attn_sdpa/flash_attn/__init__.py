"""Stand-in for the flash-attn package on a machine without it, for bench/peers/fla_train.py.

fla's GQA layer (fla/layers/attn.py) calls flash_attn_func(q, k, v, causal=True,
window_size=(-1, -1)) on [B, T, H, D] tensors and refuses to build without flash-attn. The H200
machine has PyTorch but no flash-attn (no wheel for its torch 2.11 + CUDA 13, and nothing can be
built or fetched there), so this routes the call to torch's scaled_dot_product_attention, whose
CUDA backends are FlashAttention-2 (bf16/f16) and memory-efficient attention (f32). Only what
fla's Attention uses without padding or packed sequences is provided; anything else raises.
fla_train.py puts this folder on sys.path only when `import flash_attn` fails, and says so in its
output ("attention": "sdpa").
"""
import torch
import torch.nn.functional as F

__version__ = "0.0.0-sdpa-shim"


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), **kwargs):
    if dropout_p != 0.0:
        raise NotImplementedError("flash_attn shim: dropout_p != 0")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError(f"flash_attn shim: window_size {window_size} (sliding window)")
    unsupported = {k2: v2 for k2, v2 in kwargs.items() if v2 not in (None, False, 0.0)}
    if unsupported:
        raise NotImplementedError(f"flash_attn shim: arguments {sorted(unsupported)}")
    hq, hkv = q.shape[2], k.shape[2]
    if hq != hkv:
        # GQA: repeat the kv heads (a copy of K and V) so every SDPA backend takes it; the
        # enable_gqa path is not available in every backend.
        k = k.repeat_interleave(hq // hkv, dim=2)
        v = v.repeat_interleave(hq // hkv, dim=2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=causal, scale=softmax_scale)
    return o.transpose(1, 2)


def flash_attn_varlen_func(*args, **kwargs):
    raise NotImplementedError("flash_attn shim: varlen (padding masks, cu_seqlens) is not "
                              "provided; fla_train.py passes neither")
