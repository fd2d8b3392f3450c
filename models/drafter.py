"""The HyFlash drafter (docs/design.md): local attention over a window of committed target features,
plus a recurrent memory of everything committed, drafting B = 7 tokens in one pass.

Run-time form: three pure functions over explicit state, exactly the exported graphs
(`draft_read`, `state_commit`, `window_shift`). Training form: `forward_train`, one parallel
pass over a sequence of target features with many anchors at once. Tests hold the two equal.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from hyflash.models.lookup import MAX_NGRAM
from hyflash.models.memory import GatedDeltaNet, Mamba2
from hyflash.models.target import RMSNorm, Rope, Rotary, Target, apply_rotary, attention

MEMORY_KINDS = ("mamba2", "gated_deltanet", "off")
LOOKUP_WEIGHTS = ("lookup_embed", "copy_bias", "copy_gate.weight")  # the lookup input's own, all zero at first


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    vocab_size: int
    hidden_size: int  # d = the target's H: embedding and LM head are the target's, shared and frozen
    taps: tuple[int, ...]  # target layers whose outputs are concatenated into a feature (K of them)
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    layers: int = 2
    block: int = 7  # B: tokens drafted per round; the verify width is B + 1
    window: int | Literal["full"] = 128  # W committed features attended to; "full" = all of them
    memory: str = "mamba2"  # "mamba2" | "gated_deltanet" | "off" (the sliding-window baseline)
    ssm_heads: int | None = None  # None: hidden_size // 64
    ssm_head_dim: int = 64  # P (DeltaNet: value dim)
    d_state: int = 64  # N (DeltaNet: key dim)
    conv_kernel: int = 4
    markov_rank: int = 64  # DSpark's low-rank previous-token logit bias; 0 = off
    confidence: bool = True  # per-slot acceptance probability head
    memory_history: int | None = None  # ablation: memory sees only the last M features (training/eager)
    slot_attention: bool = True  # ablation: False = a slot attends to the window and itself only
    draft_vocab: int = 0  # N > 0: the head predicts only N target tokens (ids in the `d2t` buffer); 0 = all
    lookup_input: bool = False  # draft_read also reads prompt-lookup's block (docs/design.md, "The lookup input")
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    def __post_init__(self):
        object.__setattr__(self, "taps", tuple(self.taps))
        if self.ssm_heads is None:
            object.__setattr__(self, "ssm_heads", max(1, self.hidden_size // 64))
        for name in ("vocab_size", "hidden_size", "heads", "kv_heads", "head_dim", "intermediate_size", "layers",
                     "block", "ssm_heads", "ssm_head_dim", "d_state", "conv_kernel"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"drafter: {name} must be a positive integer, got {v!r}")
        if not self.taps:
            raise ValueError("drafter: taps must name at least one target layer")
        if self.memory not in MEMORY_KINDS:
            raise ValueError(f"drafter: memory must be one of {MEMORY_KINDS}, got {self.memory!r}")
        if self.window != "full" and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"drafter: window must be a positive integer or 'full', got {self.window!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"drafter: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"drafter: head_dim must be even, got {self.head_dim}")
        if self.markov_rank < 0:
            raise ValueError(f"drafter: markov_rank must be >= 0, got {self.markov_rank}")
        if self.memory_history is not None:
            if self.memory != "mamba2":
                raise ValueError("drafter: memory_history needs memory='mamba2'")
            if self.memory_history < 1:
                raise ValueError(f"drafter: memory_history must be >= 1, got {self.memory_history}")
        if not isinstance(self.draft_vocab, int) or not 0 <= self.draft_vocab <= self.vocab_size:
            raise ValueError(f"drafter: draft_vocab must be 0 (all) or at most the vocabulary ({self.vocab_size}), "
                             f"got {self.draft_vocab!r}")
        if self.window == "full" and self.memory != "off":
            raise ValueError("drafter: window='full' is the full-attention baseline; it needs memory='off'")

    @property
    def feature_size(self) -> int:
        return len(self.taps) * self.hidden_size

    @property
    def head_size(self) -> int:
        """Tokens the head scores: the draft vocabulary, or the target's whole one."""
        return self.draft_vocab or self.vocab_size

    @property
    def slots(self) -> int:
        return self.block + 1  # anchor + B mask slots

    @property
    def name(self) -> str:
        if self.window == "full":
            return "full"
        return {"mamba2": "hyflash", "gated_deltanet": "gdn", "off": "swa"}[self.memory]

    def window_size(self, max_context: int) -> int:
        return max_context if self.window == "full" else min(self.window, max_context)

    @classmethod
    def for_target(cls, target: Target, **overrides) -> "DrafterConfig":
        """Defaults from the target's geometry (as DFlash): heads, KV heads, head dim, MLP size."""
        c = target.cfg
        base = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, taps=target.taps, heads=c.num_heads,
                    kv_heads=c.num_kv_heads, head_dim=c.head_dim, intermediate_size=c.intermediate_size,
                    rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps,
                    window=256 if c.hidden_size >= 2048 else 128)
        return cls(**{**base, **overrides})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def context_bytes(self, max_context: int, occupied: int | None = None, kv_bytes: int = 2,
                      state_bytes: int = 4) -> dict:
        """Bytes of the run-time context: window K/V (allocated, and occupied after `occupied`
        committed features), window positions, recurrent state, conv state."""
        w = self.window_size(max_context)
        row = 2 * self.layers * self.kv_heads * self.head_dim * kv_bytes  # K and V of one feature
        out = {"window_allocated": w * row, "window_positions": w * 8,
               "window_occupied": min(w, occupied if occupied is not None else w) * row,
               "state": 0, "conv_state": 0}
        if self.memory != "off":
            h, p, n, k = self.ssm_heads, self.ssm_head_dim, self.d_state, self.conv_kernel
            channels = h * p + n if self.memory == "mamba2" else h * (p + n)
            out["state"] = self.layers * h * p * n * state_bytes
            out["conv_state"] = self.layers * (k - 1) * channels * state_bytes
        out["allocated"] = out["window_allocated"] + out["window_positions"] + out["state"] + out["conv_state"]
        out["occupied"] = out["window_occupied"] + out["window_positions"] + out["state"] + out["conv_state"]
        return out


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.q_size, self.kv_size = cfg.heads * hd, cfg.kv_heads * hd
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.q = nn.Linear(d, self.q_size, bias=False)
        self.kv = nn.Linear(d, 2 * self.kv_size, bias=False)  # shared by window features and slots
        self.o = nn.Linear(self.q_size, d, bias=False)
        kinds = {"mamba2": Mamba2, "gated_deltanet": GatedDeltaNet}
        self.mem = (kinds[cfg.memory](d, cfg.ssm_heads, cfg.ssm_head_dim, cfg.d_state, cfg.conv_kernel)
                    if cfg.memory != "off" else None)
        self.mlp_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.gate_up = nn.Linear(d, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, d, bias=False)

    def kv_heads(self, x, rope: Rope):
        """x: (B, n, d) -> k, v: (B, kvh, n, hd), k rotated."""
        k, v = self.kv(x).chunk(2, dim=-1)
        k = k.unflatten(-1, (-1, self.cfg.head_dim)).transpose(1, 2)
        v = v.unflatten(-1, (-1, self.cfg.head_dim)).transpose(1, 2)
        return apply_rotary(k, rope), v

    def forward(self, h, rope: Rope, k_ctx, v_ctx, ctx_mask, slot_mask, mem_read):
        """h: (B, S, d) slot states; k_ctx/v_ctx: (B|1, kvh, T, hd); mem_read(x) -> (B, S, d)."""
        x = self.norm(h)
        q = apply_rotary(self.q(x).unflatten(-1, (-1, self.cfg.head_dim)).transpose(1, 2), rope)
        k, v = self.kv_heads(x, rope)
        a = attention(q, k_ctx, v_ctx, k, v, ctx_mask, slot_mask)  # (B, heads, S, hd)
        h = h + self.o(a.transpose(1, 2).flatten(-2))
        if self.mem is not None:
            h = h + mem_read(x)
        gate, up = self.gate_up(self.mlp_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, embed: torch.Tensor, lm_head: torch.Tensor):
        """embed, lm_head: the target's (V, d) tables, used in place (the same storage, never copied:
        at a 151,936-token vocabulary each is hundreds of MB) and never trained (non-persistent buffers)."""
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.register_buffer("embed", embed.detach(), persistent=False)
        self.register_buffer("lm_head", lm_head.detach(), persistent=False)
        if cfg.draft_vocab:  # the draft vocabulary's target ids (saved with the weights), most frequent first
            self.register_buffer("d2t", torch.arange(cfg.draft_vocab), persistent=True)
        self.fuse = nn.Linear(cfg.feature_size, d, bias=False)
        self.fuse_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.mask_embed = nn.Parameter(torch.randn(d) * 0.02)
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        inv = [cfg.rope_theta ** -(i / cfg.head_dim) for i in range(0, cfg.head_dim, 2)]
        self.rotary = Rotary(inv)
        if cfg.markov_rank:
            self.markov_in = nn.Embedding(cfg.vocab_size, cfg.markov_rank)
            self.markov_out = nn.Linear(cfg.markov_rank, cfg.head_size, bias=False)
            nn.init.zeros_(self.markov_out.weight)  # starts as no bias at all
        if cfg.confidence:
            self.conf_head = nn.Linear(d, 1)
        if cfg.lookup_input:  # all zero at first: a drafter that ignores its lookup input
            self.lookup_embed = nn.Parameter(torch.zeros(MAX_NGRAM + 1, cfg.block, d))  # by match length, slot
            self.copy_bias = nn.Parameter(torch.zeros(MAX_NGRAM + 1, cfg.block))
            self.copy_gate = nn.Linear(d, 1, bias=False)
            nn.init.zeros_(self.copy_gate.weight)
        slot = torch.arange(cfg.slots)
        mask = torch.ones(cfg.slots, cfg.slots, dtype=torch.bool) if cfg.slot_attention else slot[:, None] == slot
        self.register_buffer("slot_mask", mask, persistent=False)  # bidirectional among slots
        self.embed_module: nn.Embedding | None = None  # see vocabulary_modules
        self.head_module: nn.Linear | None = None

    def vocabulary_modules(self) -> None:
        """For export: the target's embedding and the LM head the drafter scores become an nn.Embedding and
        an nn.Linear over the same tensors, read from then on, so module quantizers (torchao) find them.
        Numerically the same as the buffers."""
        self.embed_module = nn.Embedding.from_pretrained(self.embed, freeze=True)
        self.head_module = nn.Linear(self.cfg.hidden_size, self.cfg.head_size, bias=False)
        self.head_module.weight = nn.Parameter(self.head_weight, requires_grad=False)
        if hasattr(self, "head_rows"):  # the module holds the head now: no second copy in a traced graph
            del self.head_rows

    def embed_tokens(self, tokens):
        return self.embed_module(tokens) if self.embed_module is not None else F.embedding(tokens, self.embed)

    def project(self, hn):
        """(..., d) -> (..., N): the LM head's scores of the draft vocabulary."""
        return self.head_module(hn) if self.head_module is not None else F.linear(hn, self.head_weight)

    @classmethod
    def for_target(cls, target: Target, cfg: DrafterConfig) -> "Drafter":
        if cfg.hidden_size != target.cfg.hidden_size or cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"drafter (hidden {cfg.hidden_size}, vocab {cfg.vocab_size}) does not match the target "
                             f"(hidden {target.cfg.hidden_size}, vocab {target.cfg.vocab_size})")
        if tuple(cfg.taps) != tuple(target.taps):
            raise ValueError(f"drafter taps {list(cfg.taps)} differ from the target's {list(target.taps)}; "
                             "load the target with the drafter's taps")
        return cls(cfg, target.embed.weight, target.lm_head.weight)

    def fused(self, features):
        """features: (n, K*H) -> c: (n, d)."""
        return self.fuse_norm(self.fuse(features[None])[0])

    def slot_inputs(self, anchor_tokens, lookup=None):
        """anchor_tokens: (B,) -> (B, S, d): anchor embedding, then B mask embeddings. lookup: prompt-lookup's
        block (B, 7) and match lengths (B,) (`lookup_input`): slot k's mask embedding gains lookup token k's
        embedding, scaled per match length and slot."""
        b = anchor_tokens.shape[0]
        masks = self.mask_embed.expand(b, self.cfg.block, -1)
        if self.cfg.lookup_input:
            block, match = lookup
            masks = masks + self.embed_tokens(block) * self.lookup_embed[match]  # (B, 7, d)
        return torch.cat([self.embed_tokens(anchor_tokens)[:, None], masks], dim=1)

    def copy_logits(self, hn, match):
        """`lookup_input`: hn (A, 7, d) normalised slot states, match (A,) -> (A, 7), the logit added to
        each slot's lookup token (`head`'s `copy`): the drafter's trust in lookup's proposal there."""
        return self.copy_gate(hn)[..., 0] + self.copy_bias[match]

    def slot_states(self, h):
        """h: (..., S, d) final slot states -> normalised states of slots 1..7 (..., 7, d), confidence
        (..., 7) or None."""
        hn = self.norm(h[..., 1:, :])
        return hn, torch.sigmoid(self.conf_head(hn))[..., 0] if self.cfg.confidence else None

    @property
    def head_weight(self) -> torch.Tensor:
        """(N, d): the rows of the target's LM head the drafter scores (all V without a draft vocabulary)."""
        if getattr(self, "head_rows", None) is not None:
            return self.head_rows
        return self.lm_head[self.d2t] if self.cfg.draft_vocab else self.lm_head

    def materialize_head(self) -> None:
        """For export: a draft vocabulary's rows of the LM head as a tensor of their own, which a traced graph
        holds as one constant weight instead of gathering the rows on every call, and the map from target ids
        to head indices as a table (`head_index` then reads it, one gather). Numerically the same."""
        if self.cfg.draft_vocab:
            self.register_buffer("head_rows", self.lm_head[self.d2t].detach().clone(), persistent=False)
            self.register_buffer("head_of", self.head_index(torch.arange(self.cfg.vocab_size)), persistent=False)

    def head(self, hn, prev, copy=None):
        """hn (..., d) normalised slot states, prev (...) previous-slot tokens -> logits (..., N). copy:
        (lookup tokens (...), their logits `copy_logits` (...)) with `lookup_input`."""
        logits = self.project(hn)
        if self.cfg.markov_rank:
            logits = logits + self.markov(prev)
        if copy is not None:
            logits = self.add_copy_logits(logits, *copy)
        return logits

    def add_copy_logits(self, logits, tokens, value):
        """logits (..., N) + each lookup token's copy logit `value` (...) at its head index. A token outside the
        draft vocabulary cannot be drafted: it adds 0.0 to its row's first logit, which leaves the row as it was
        (its embedding still counts). Seven adds a draft, not a compare over the head (which cost ExecuTorch's
        portable kernels ~2 ms a call on SmolLM2)."""
        index = self.head_index(tokens)
        value = torch.where(index >= 0, value, 0.0).to(logits.dtype)
        return logits.scatter_add(-1, index.clamp(min=0)[..., None], value[..., None])

    def head_index(self, tokens: torch.Tensor) -> torch.Tensor:
        """Target ids -> their head indices (-1 for a token outside the draft vocabulary)."""
        if not self.cfg.draft_vocab:
            return tokens
        if getattr(self, "head_of", None) is not None:
            return self.head_of[tokens]
        index = torch.full((self.cfg.vocab_size,), -1, dtype=torch.long, device=tokens.device)
        index[self.d2t] = torch.arange(self.cfg.draft_vocab, device=tokens.device)
        return index[tokens]

    def markov(self, prev):
        """prev: (...) previous-slot tokens (target ids) -> logit bias (..., N)."""
        return self.markov_out(self.markov_in(prev))

    def target_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Head indices -> target token ids."""
        return self.d2t[index] if self.cfg.draft_vocab else index

    # ------------------------------------------------------------------ run-time form (the graphs)

    def draft_read(self, anchor_token, anchor_pos, win_k, win_v, win_pos, ssm_state=None, lookup_tokens=None,
                   lookup_match=None):
        """anchor_token, anchor_pos: (1,); win_k/win_v: (L_d, kvh, W, hd); win_pos: (W,) (-1 = empty);
        ssm_state: (L_d, h, P, N); lookup_tokens (7,), lookup_match (1,): prompt-lookup's block and its
        n-gram length (`lookup_input`). -> draft_tokens (7,) (target ids), draft_logits (7, head_size),
        confidence (7,) or None. Reads only: no state comes out."""
        cfg = self.cfg
        lookup = (lookup_tokens[None], lookup_match) if cfg.lookup_input else None
        h = self.slot_inputs(anchor_token, lookup)  # (1, S, d)
        rope = self.rotary(anchor_pos + torch.arange(cfg.slots))
        ctx_mask = (win_pos >= 0)[None, None, :].expand(1, cfg.slots, -1)  # (1, S, W)
        for i, layer in enumerate(self.layers):
            k_ctx = win_k[i][None]  # (1, kvh, W, hd): stored in the layout attention reads, no transpose
            v_ctx = win_v[i][None]
            # every linear sees a 3-D input: exported as MatMul, which onnxruntime's int4 quantizer
            # handles (a 2-D input becomes Gemm, which MatMulNBitsQuantizer silently skips)
            read = (lambda x, i=i: layer.mem.read(ssm_state[i:i + 1], x)) if layer.mem is not None else None
            h = layer(h, rope, k_ctx, v_ctx, ctx_mask, self.slot_mask[None], read)
        hn, conf = self.slot_states(h)
        base = self.project(hn)  # (1, 7, N)
        conf = conf[0] if conf is not None else None  # (7,)
        if cfg.lookup_input:  # each slot's lookup token gains its copy logit
            base = self.add_copy_logits(base, lookup_tokens[None], self.copy_logits(hn, lookup_match))  # (1, 7, N)
        # the Markov chain, unrolled: slot k's bias comes from slot k-1's token (the anchor for slot 1).
        # Kept 3-D, (1, 1, ·) per slot: five nodes a slot, and the bias a MatMul (int4 quantizes it)
        prev, tokens, logits = anchor_token[None], [], []  # prev: (1, 1)
        for k in range(cfg.block):
            lk = base[:, k:k + 1]  # (1, 1, N)
            if cfg.markov_rank:
                lk = lk + self.markov(prev)
            prev = self.target_ids(lk.argmax(-1))  # (1, 1)
            tokens.append(prev)
            logits.append(lk)
        return torch.cat(tokens, dim=1)[0], torch.cat(logits, dim=1)[0], conf

    def state_commit(self, features, n_valid, ssm_state, conv_state):
        """features: (8, K*H); n_valid: (1,); ssm_state: (L_d, h, P, N); conv_state: (L_d, k-1, C).
        Folds rows < n_valid into the memory; other rows never influence anything."""
        valid = torch.arange(features.shape[0]) < n_valid  # (8,)
        c = self.fused(torch.where(valid[:, None], features, 0.0))
        if all(isinstance(layer.mem, Mamba2) for layer in self.layers):  # all layers in one set of ops
            return Mamba2.commit_layers([layer.mem for layer in self.layers], c, valid, ssm_state, conv_state, n_valid)
        ssm, conv = [], []
        for i, layer in enumerate(self.layers):
            s, cv = layer.mem.commit(c, valid, ssm_state[i], conv_state[i], n_valid)
            ssm.append(s)
            conv.append(cv)
        return torch.stack(ssm), torch.stack(conv)

    def window_shift(self, features, positions, n_valid, win_k, win_v, win_pos):
        """Shift the window left by n_valid and append the valid rows' K/V (RoPE at their positions)."""
        n = features.shape[0]
        w = win_pos.shape[0]
        valid = torch.arange(n) < n_valid
        c = self.fused(torch.where(valid[:, None], features, 0.0))
        pos = torch.where(valid, positions, -1)
        rope = self.rotary(pos.clamp(min=0))
        keep = torch.arange(w) + n_valid  # rows n_valid .. n_valid+W-1 of [window; new]
        cfg = self.cfg
        # every layer's K/V of the new rows, then one RoPE, one concat and one selection for all layers
        kv = torch.stack([layer.kv(c[None])[0] for layer in self.layers])  # (L, n, 2*kvh*hd)
        kv = kv.unflatten(-1, (2, cfg.kv_heads, cfg.head_dim)).permute(2, 0, 3, 1, 4)  # (2, L, kvh, n, hd)
        k, v = apply_rotary(kv[0], rope), kv[1]
        return (torch.index_select(torch.cat([win_k, k], dim=2), 2, keep),
                torch.index_select(torch.cat([win_v, v], dim=2), 2, keep),
                torch.index_select(torch.cat([win_pos, pos]), 0, keep))

    def init_context(self, max_context: int, kv_dtype=torch.float32, state_dtype=torch.float32) -> dict:
        """The run-time buffers, empty: what the runtime allocates once and never grows."""
        cfg = self.cfg
        w = cfg.window_size(max_context)
        ctx = {"win_k": torch.zeros(cfg.layers, cfg.kv_heads, w, cfg.head_dim, dtype=kv_dtype),  # (L_d, kvh, W, hd)
               "win_v": torch.zeros(cfg.layers, cfg.kv_heads, w, cfg.head_dim, dtype=kv_dtype),
               "win_pos": torch.full((w,), -1, dtype=torch.int64)}
        if cfg.memory != "off":
            s_shape, c_shape = self.layers[0].mem.state_shapes()
            ctx["ssm_state"] = torch.zeros(cfg.layers, *s_shape, dtype=state_dtype)
            ctx["conv_state"] = torch.zeros(cfg.layers, *c_shape, dtype=state_dtype)
        return ctx

    # ------------------------------------------------------------------ training form

    def memory_inputs(self, features, anchors):
        """The memories' training inputs for a batch of sequences at once (a recurrent scan runs
        once for the batch): features (B, T, K*H), anchors (B, A) -> [sequence][layer] inputs
        for `forward_train(..., mem_inputs=)`."""
        c = self.fuse_norm(self.fuse(features[:, :max(1, int(anchors.max()))]))  # (B, T, d): none past the last anchor
        per_layer = [layer.mem.states_batch(c, anchors, self.cfg.memory_history) for layer in self.layers]
        return [list(seq) for seq in zip(*per_layer)]

    def forward_train(self, features, tokens, anchors, prev, mem_inputs=None, states_only: bool = False,
                      lookup=None):
        """One sequence, many anchors at once.

        features: (T, K*H) target features of tokens 0..T-1; tokens: (T,); anchors: (A,) positions
        a (features 0..a-1 are committed, token a is the anchor); prev: (A, 7) previous-slot tokens
        for the Markov head; mem_inputs: this sequence's entry of `memory_inputs` (else computed
        here); lookup: prompt-lookup's blocks (A, 7) and match lengths (A,) at the anchors
        (`lookup_input`, `lookup_many`). -> logits (A, 7, V) for positions a+1..a+7 (`states_only`: the
        normalised slot states (A, 7, d) instead, for `head` to apply in chunks), confidence (A, 7) or None.
        """
        cfg = self.cfg
        t = max(1, int(anchors.max()))  # features 0..a-1 are all an anchor reads: none past the last
        c = self.fused(features[:t])  # (T, d)
        rope_c = self.rotary(torch.arange(t, device=features.device))
        slot_pos = anchors[:, None] + torch.arange(cfg.slots, device=features.device)  # (A, S)
        rope = self.rotary(slot_pos.flatten()).map(lambda t: t.unflatten(0, slot_pos.shape)[:, None])
        if cfg.window == "full":
            pos = torch.arange(t, device=features.device)
            ctx_mask = (pos[None, :] < anchors[:, None])[:, None, :].expand(-1, cfg.slots, -1)  # (A, S, T)
            window = None
        else:  # each anchor's own window of positions a-W..a-1 (those before 0 masked), not all T of them
            w = min(cfg.window, t)
            window = anchors[:, None] - w + torch.arange(w, device=features.device)  # (A, W)
            ctx_mask = (window >= 0)[:, None, :].expand(-1, cfg.slots, -1)  # (A, S, W)
            window = window.clamp(min=0)
        h = self.slot_inputs(tokens[anchors], lookup)  # (A, S, d)
        for i, layer in enumerate(self.layers):
            k_ctx, v_ctx = layer.kv_heads(c[None], rope_c)  # (1, kvh, T, hd)
            if window is not None:  # -> (A, kvh, W, hd)
                k_ctx, v_ctx = k_ctx[0][:, window].transpose(0, 1), v_ctx[0][:, window].transpose(0, 1)
            read = None
            if layer.mem is not None:
                inputs = (mem_inputs[i] if mem_inputs is not None
                          else layer.mem.states_at(c, anchors, cfg.memory_history))
                read = lambda x, inputs=inputs, mem=layer.mem: mem.read_many(inputs, x)  # noqa: E731
            h = layer(h, rope, k_ctx, v_ctx, ctx_mask, self.slot_mask[None], read)
        hn, conf = self.slot_states(h)
        if states_only:
            return hn, conf
        copy = (lookup[0], self.copy_logits(hn, lookup[1])) if self.cfg.lookup_input else None
        return self.head(hn, prev, copy), conf
