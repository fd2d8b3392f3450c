"""The target decoder: the Llama family (Llama, Mistral, Qwen2, Qwen3, Phi-3/Phi-4) in one module.

Two entry points over the same weights:

- `step(tokens[n], positions[n], n_valid, k_cache, v_cache)`: the export form. Functional over
  an explicit static cache `[L, kv_heads, T_max, head_dim]` that the caller owns and writes;
  returns the new rows' K/V instead of writing them. Cache row j holds position j; rows at or
  past `positions[0]` are stale (rejected drafts, old padding) and masked, so nothing is ever
  rolled back.
- `forward(tokens[B, T])`: plain causal forward for training and reference runs.

Both return `features`: the residual stream after each tap layer, concatenated (docs/design.md).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from hyflash.models.config import TargetConfig, rope_inv_freq


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x / sqrt(...), not x * rsqrt(...): onnxruntime fuses this form into one
        # SimplifiedLayerNormalization node (the rsqrt form stays 7 nodes; measured: 343 of the
        # reference target_decode's 805 nodes were unfused norms)
        # in fp32 whatever x is (a half-precision square overflows): no node at all for an fp32 x
        y = x.float()
        return (y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Rope(NamedTuple):
    """RoPE at some positions: cos/sin (n, rot) and the rotate-half matrix they are applied with."""

    cos: torch.Tensor
    sin: torch.Tensor
    turn: torch.Tensor

    def map(self, fn) -> Rope:
        """The angles reshaped by fn (the matrix as it is)."""
        return Rope(fn(self.cos), fn(self.sin), self.turn)


class Rotary(nn.Module):
    """cos/sin from absolute positions, computed in the graph (no position table to size)."""

    def __init__(self, inv_freq: list[float], scale: float = 1.0):
        super().__init__()
        self.register_buffer("inv_freq", torch.tensor(inv_freq, dtype=torch.float32), persistent=False)
        self.register_buffer("turn", half_turn(2 * len(inv_freq)), persistent=False)
        self.scale = scale

    def forward(self, positions: torch.Tensor) -> Rope:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # (n, rot/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (n, rot)
        return Rope(emb.cos() * self.scale, emb.sin() * self.scale, self.turn)


def to_fp16(module: nn.Module) -> nn.Module:
    """In place: fp16 weights and buffers, except RoPE's inverse frequencies (the angles stay fp32: in
    fp16 they are off by radians a few thousand positions in)."""
    keep = {id(m.inv_freq) for m in module.modules() if isinstance(m, Rotary)}
    return module._apply(lambda t: t.half() if t.is_floating_point() and id(t) not in keep else t)


def half_turn(rot: int) -> torch.Tensor:
    """(rot, rot) R = [[0, I], [-I, 0]], so that x @ R = cat(-x[half:], x[:half]): rotate-half as one
    exact MatMul (entries 0 and ±1) instead of slice, slice, neg, concat in every exported layer. A buffer
    (`Rotary.turn`), so every export holds it as one constant weight: built in the graph from eye and cat,
    ExecuTorch kept the construction and ran it with the product in portable kernels on every call."""
    eye = torch.eye(rot // 2)
    zero = torch.zeros_like(eye)
    return torch.cat([torch.cat([zero, eye], 1), torch.cat([-eye, zero], 1)], 0)


def apply_rotary(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x: (..., n, head_dim); rope's cos/sin: (n, rot), or (n, 1, rot) for x (..., n, heads, head_dim).
    Dims past `rot` pass through (partial rotary). Angles are computed in fp32 and applied in x's dtype."""
    cos, sin, turn = (t.to(x.dtype) for t in rope)
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + (x @ turn) * sin
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    out = x_rot * cos + (x_rot @ turn) * sin
    return torch.cat([out, x_pass], dim=-1)


class Layer(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        h, hd = cfg.hidden_size, cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * hd, cfg.num_kv_heads * hd
        self.attn_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.qkv = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.o = nn.Linear(self.q_size, h, bias=cfg.o_bias)
        self.mlp_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=cfg.mlp_bias)

    def project(self, x, rope: Rope):
        """x: (B, n, H) -> q (B, heads, n, hd), k and v (B, kv_heads, n, hd), RoPE applied."""
        q, k, v = self.project_rows(x, rope)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def project_rows(self, x, rope: Rope):
        """x: (B, n, H); rope's cos/sin (n, rot), or (B, n, rot) when each sequence has its own positions ->
        q (B, n, heads, hd), k and v (B, n, kv_heads, hd), RoPE applied: the layout the in-place cache
        kernels take, with no transpose in the graph."""
        b, n, _ = x.shape
        hd = self.cfg.head_dim
        q, k, v = self.qkv(self.attn_norm(x)).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k, v = q.view(b, n, -1, hd), k.view(b, n, -1, hd), v.view(b, n, -1, hd)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        # (n, 1, rot), or (B, n, 1, rot) for per-sequence positions: one angle per row, for every head
        rope = rope.map(lambda t: t.unsqueeze(-2))
        return apply_rotary(q, rope), apply_rotary(k, rope), v

    def finish(self, x, attn):
        """attn: (B, heads, n, hd) -> the layer's output (B, n, H)."""
        b, _, n, _ = attn.shape
        return self.finish_rows(x, attn.transpose(1, 2).reshape(b, n, self.q_size))

    def finish_rows(self, x, attn):
        """attn: (B, n, heads*hd), heads side by side per row -> the layer's output (B, n, H)."""
        x = x + self.o(attn)
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def attention(q, k_ctx, v_ctx, k_new, v_new, ctx_mask, new_mask):
    """Attention over a context (cache or window) plus the block's own rows, without copying either.

    q: (B, heads, n, hd); k_ctx/v_ctx: (B|1, kvh, T, hd); k_new/v_new: (B, kvh, n, hd);
    ctx_mask: (B|1, n, T) and new_mask: (B|1, n, n), True where a query may look.
    Scores against the context and the new rows are computed apart and only the scores are
    concatenated: a `cat` of K/V would copy the whole cache in every layer.
    """
    b, heads, n, hd = q.shape
    kvh, t = k_ctx.shape[1], k_ctx.shape[2]
    g = heads // kvh
    q = q.reshape(b, kvh, g * n, hd)  # the g query heads of one kv head, stacked
    s_ctx = q @ k_ctx.transpose(-1, -2)  # (B, kvh, g*n, T)
    s_new = q @ k_new.transpose(-1, -2)  # (B, kvh, g*n, n)
    scores = torch.cat([s_ctx, s_new], dim=-1) * hd ** -0.5
    new_mask = new_mask.expand(ctx_mask.shape[0], -1, -1)
    mask = torch.cat([ctx_mask, new_mask], dim=-1).repeat(1, g, 1)[:, None]  # (B|1, 1, g*n, T+n)
    scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    p = torch.softmax(scores, dim=-1)
    out = p[..., :t] @ v_ctx + p[..., t:] @ v_new  # (B, kvh, g*n, hd)
    return out.reshape(b, heads, n, hd)


def _causal_layer(layer, x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """One decoder layer over whole rows (B, T, H), causal, no cache."""
    q, k, v = layer.project(x, rope)
    return layer.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


class Target(nn.Module):
    def __init__(self, cfg: TargetConfig, taps: tuple[int, ...] | None = None):
        super().__init__()
        self.cfg = cfg
        self.taps = tuple(taps if taps is not None else cfg.default_taps)
        if not self.taps or any(not 0 <= t < cfg.num_layers for t in self.taps):
            raise ValueError(f"taps must be layer indices in [0, {cfg.num_layers}), got {self.taps}")
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rotary = Rotary(*rope_inv_freq(cfg))

    @property
    def feature_size(self) -> int:
        return len(self.taps) * self.cfg.hidden_size

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens: (B, T) -> logits (B, T, V), features (B, T, K*H). Causal, no cache."""
        hidden, features = self.trunk(tokens)
        return self.lm_head(hidden), features

    def trunk(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens: (B, T) -> the final normalised hidden states (B, T, H) (logits = lm_head of them),
        features (B, T, K*H): for a caller that needs logits at a few positions only."""
        rope = self.rotary(torch.arange(tokens.shape[1], device=tokens.device))
        x = self.embed(tokens)
        feats = []
        for i, layer in enumerate(self.layers):
            x = _causal_layer(layer, x, rope)
            if i in self.taps:
                feats.append(x)
        return self.norm(x), torch.cat(feats, dim=-1)

    def after_taps(self, features: torch.Tensor) -> torch.Tensor:
        """features (B, T, K*H) as `trunk` gives them, each row from position 0 -> the final normalised
        hidden states (B, T, H): the layers after the last tap, run on its states (so a feature cache gives
        the target's full distribution at the cost of those layers alone)."""
        last = max(self.taps)  # trunk appends taps in layer order: the last tap is the last H columns
        x = features[..., -self.cfg.hidden_size:].to(self.norm.weight.dtype)
        rope = self.rotary(torch.arange(x.shape[1], device=x.device))
        for layer in self.layers[last + 1:]:
            x = _causal_layer(layer, x, rope)
        return self.norm(x)

    def step(self, tokens, positions, n_valid, k_cache, v_cache):
        """The export form (target_prefill / target_verify / target_decode).

        tokens, positions: (n,) int64, contiguous positions starting at positions[0];
        n_valid: (1,) int64, rows >= n_valid are padding; k_cache, v_cache: (L, kvh, T_max, hd).
        Returns logits (n, V), features (n, K*H), k_new and v_new (L, kvh, n, hd).
        """
        n = tokens.shape[0]
        t_max = k_cache.shape[2]
        rope = self.rotary(positions)
        rows = torch.arange(n, device=tokens.device)
        cache_mask = (torch.arange(t_max, device=tokens.device) < positions[:1]).expand(n, t_max)
        # a row sees earlier valid rows of the block, and itself (so padding rows stay finite)
        causal = rows[None, :] <= rows[:, None]
        new_mask = causal & ((rows[None, :] < n_valid) | (rows[None, :] == rows[:, None]))
        x = self.embed(tokens)[None]  # (1, n, H): a leading batch dim keeps linears as MatMul
        feats, k_out, v_out = [], [], []
        for i, layer in enumerate(self.layers):
            q, k, v = layer.project(x, rope)  # (1, heads|kvh, n, hd)
            attn = attention(q, k_cache[i:i + 1], v_cache[i:i + 1], k, v, cache_mask[None], new_mask[None])
            x = layer.finish(x, attn)
            k_out.append(k[0])
            v_out.append(v[0])
            if i in self.taps:
                feats.append(x[0])
        logits = self.lm_head(self.norm(x))[0]
        return logits, torch.cat(feats, dim=-1), torch.stack(k_out), torch.stack(v_out)

    def step_in_place(self, tokens, positions, attend):
        """The deployed form: each layer's attention is `attend(layer, q, k, v)`, an op that writes the
        block's K/V rows into a cache it owns and attends over the committed rows plus the block.

        tokens, positions: (n,) int64, contiguous from positions[0]; q (1, n, heads, hd), k and v
        (1, n, kvh, hd) with RoPE applied; attend returns (1, n, heads*hd).
        Returns logits (n, V) and features (n, K*H).
        """
        rope = self.rotary(positions)
        x = self.embed(tokens)[None]  # (1, n, H): a leading batch dim keeps linears as MatMul
        feats = []
        for i, layer in enumerate(self.layers):
            q, k, v = layer.project_rows(x, rope)
            x = layer.finish_rows(x, attend(i, q, k, v))
            if i in self.taps:
                feats.append(x[0])
        return self.lm_head(self.norm(x))[0], torch.cat(feats, dim=-1)

    def empty_cache(self, max_context: int, dtype=torch.float32):
        c = self.cfg
        shape = (c.num_layers, c.num_kv_heads, max_context, c.head_dim)
        return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def write_cache(cache: torch.Tensor, new: torch.Tensor, start: int, n_valid: int) -> None:
    """Write the first n_valid new rows (L, kvh, n, hd) into cache rows start.. (in place).

    The one place cache rows are written; the runtime mirrors it on numpy arrays.
    """
    cache[:, :, start:start + n_valid] = new[:, :, :n_valid]


def greedy(model: Target, prompt: list[int], max_new: int, max_context: int, chunk: int = 16) -> list[int]:
    """Eager target-only greedy decoding through `step`: chunked prefill, then one row at a time.

    The oracle the exported graphs and the speculative runtime are checked against.
    """
    return generate(model, prompt, max_new, max_context, chunk)


@torch.no_grad()
def generate(model: Target, prompt: list[int], max_new: int, max_context: int, chunk: int = 16,
             generator: torch.Generator | None = None) -> list[int]:
    """Eager target-only decoding: greedy, or sampled at temperature 1 when a generator is given."""
    k_cache, v_cache = model.empty_cache(max_context)
    pos, logits = 0, None
    for start in range(0, len(prompt), chunk):
        ids = prompt[start:start + chunk]
        n = len(ids)
        tokens = torch.tensor(ids + [0] * (chunk - n))
        positions = torch.arange(pos, pos + chunk)
        logits, _, k_new, v_new = model.step(tokens, positions, torch.tensor([n]), k_cache, v_cache)
        write_cache(k_cache, k_new, pos, n)
        write_cache(v_cache, v_new, pos, n)
        pos += n
        logits = logits[n - 1]
    out = []
    while len(out) < max_new and pos < max_context:
        if generator is None:
            token = int(logits.argmax())
        else:
            token = int(torch.multinomial(torch.softmax(logits.double(), -1), 1, generator=generator))
        out.append(token)
        logits, _, k_new, v_new = model.step(torch.tensor([token]), torch.tensor([pos]), torch.tensor([1]),
                                             k_cache, v_cache)
        write_cache(k_cache, k_new, pos, 1)
        write_cache(v_cache, v_new, pos, 1)
        pos += 1
        logits = logits[0]
    return out


LOGIT_BUDGET = 1 << 24  # logits held at once, rows x vocabulary: 64 MB in fp32


def chunked_argmax(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """argmax(hidden @ weight.T) over (..., H) rows, a chunk of rows at a time (no grad)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    rows = max(1, LOGIT_BUDGET // weight.shape[0])
    out = torch.cat([(flat[i:i + rows] @ weight.t()).argmax(-1) for i in range(0, len(flat), rows)])
    return out.view(hidden.shape[:-1])
