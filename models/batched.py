"""Many sequences at once through `Target`'s own layers: one prefill, then one row per step, with a
KV cache allocated once per batch (the copy-rate probe and `hyflash regenerate`).

Prompts of different lengths are left-padded: each sequence has its own positions (its first
real token at 0) and never attends to its padding. Each row decodes greedily or samples at its
own temperature. Tests check the rows against `hyflash.models.target.greedy` / `generate`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hyflash.models.target import Target


@torch.no_grad()
def decode_batch(model: Target, prompts: torch.Tensor, max_new: int, temperature: torch.Tensor | None = None,
                 generator: torch.Generator | None = None, pad: torch.Tensor | None = None) -> torch.Tensor:
    """prompts (B, P) int64 -> (B, max_new) new tokens.

    temperature: (B,) float, 0 = greedy for that row (default: every row greedy); sampled rows draw
    from softmax(logits / T) with `generator`. pad: (B,) int64, the left padding of each row (its
    first pad[b] tokens are not part of the prompt; default none).
    """
    b, p = prompts.shape
    pad = torch.zeros(b, dtype=torch.long) if pad is None else pad.long()
    padded = bool(pad.any())
    cfg = model.cfg
    total = p + max_new - 1  # the last new token is never fed back
    shape = (cfg.num_layers, b, cfg.num_kv_heads, total, cfg.head_dim)
    k_cache = torch.empty(shape, dtype=model.embed.weight.dtype, device=prompts.device)
    v_cache = torch.empty_like(k_cache)
    temperature = torch.zeros(b) if temperature is None else temperature.double()
    sampled = temperature > 0

    def pick(logits: torch.Tensor) -> torch.Tensor:  # (B, V) -> (B,)
        token = logits.argmax(-1)
        if sampled.any():
            probs = torch.softmax(logits[sampled].double() / temperature[sampled, None], -1)
            token[sampled] = torch.multinomial(probs, 1, generator=generator)[:, 0]
        return token

    def run(x: torch.Tensor, start: int) -> torch.Tensor:  # x (B, n) tokens at rows start.. -> last logits (B, V)
        n = x.shape[1]
        rows = torch.arange(start, start + n, device=x.device)
        if padded:  # each sequence's own positions; a query sees its row's real tokens up to itself
            pos = (rows[None, :] - pad[:, None]).clamp(min=0)  # (B, n)
            cos, sin = model.rotary(pos.flatten())
            cos, sin = cos.view(b, n, -1), sin.view(b, n, -1)
            keys = torch.arange(start + n, device=x.device)
            mask = (keys[None, None, :] <= rows[None, :, None]) & (keys[None, None, :] >= pad[:, None, None])
            mask = (mask | (keys[None, None, :] == rows[None, :, None]))[:, None]  # (B, 1, n, start + n); a pad
            # row sees itself only, so no row is all masked (its output is never read)
        else:
            cos, sin = model.rotary(rows)
            mask = None
        h = model.embed(x)
        for i, layer in enumerate(model.layers):
            q, k, v = layer.project(h, cos, sin)  # q (B, heads, n, hd); k, v (B, kvh, n, hd)
            k_cache[i, :, :, start:start + n] = k
            v_cache[i, :, :, start:start + n] = v
            ks, vs = k_cache[i, :, :, :start + n], v_cache[i, :, :, :start + n]
            attn = F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask, is_causal=start == 0 and mask is None,
                                                  enable_gqa=True)
            h = layer.finish(h, attn)
        return model.lm_head(model.norm(h[:, -1]))

    out = [pick(run(prompts, 0))]
    for i in range(max_new - 1):
        out.append(pick(run(out[-1][:, None], p + i)))
    return torch.stack(out, dim=1)
