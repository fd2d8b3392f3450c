"""Attention over a cache that the graph updates in place: the target's exported form.

`hyflash::cache_attention` is one op with the semantics of onnxruntime's
`com.microsoft.GroupQueryAttention` (CPU provider) with past and present sharing one buffer:

    query (1, S, heads*hd), key/value (1, S, kvh*hd) with RoPE applied,
    past_key/past_value (1, kvh, T, hd) (BNSH), seqlens_k (1,) int32 = start + S - 1,
    total_sequence_length () int32 = start + S
    -> out (1, S, heads*hd), present_key/present_value (1, kvh, T, hd)

The S new rows are written at rows start..start+S-1 and query row i attends to cache rows
0..start+i (causal): rows at or past start+S are never read, so stale rows (rejected drafts,
padding) cost nothing and need no rollback. The export translates the op to the contrib node
(`hyflash.export.onnx_ops`); the body below is its eager reference (and what the fake kernel
is traced from), checked against `attention` in `hyflash.models.target` by the tests.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("hyflash::cache_attention", mutates_args=())
def cache_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor,
                    past_value: torch.Tensor, seqlens_k: torch.Tensor, total_sequence_length: torch.Tensor,
                    num_heads: int, kv_num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = query.shape[1]
    hd = past_key.shape[-1]
    total = int(total_sequence_length)
    start = total - s
    k_new = key.view(1, s, kv_num_heads, hd).transpose(1, 2)  # (1, kvh, S, hd)
    v_new = value.view(1, s, kv_num_heads, hd).transpose(1, 2)
    present_k, present_v = past_key.clone(), past_value.clone()
    present_k[:, :, start:total] = k_new
    present_v[:, :, start:total] = v_new
    q = query.view(1, s, num_heads, hd).transpose(1, 2)  # (1, heads, S, hd)
    rows = torch.arange(s)[:, None] + start
    mask = torch.arange(total)[None, :] <= rows  # (S, total): row i sees cache rows 0..start+i
    out = torch.nn.functional.scaled_dot_product_attention(
        q, present_k[:, :, :total], present_v[:, :, :total], attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).reshape(1, s, num_heads * hd), present_k, present_v


@cache_attention.register_fake
def _(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, num_heads, kv_num_heads):
    return torch.empty_like(query), torch.empty_like(past_key), torch.empty_like(past_value)
