"""Target configuration: one validated dataclass read from a Hugging Face `config.json`.

The decoder in `target.py` covers the Llama family as `transformers` defines it. Everything
that family does not share (fused projections, q/k norms, biases, RoPE variants) is a field
here, so the forward pass reads flags and never architecture names.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any


class UnsupportedModelError(ValueError):
    """The checkpoint is readable but uses something a static export cannot follow."""


# architecture name -> (model_type, fused qkv/gate_up as stored on disk, q/k RMSNorm, qkv bias default)
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", False, False, None),
    "MistralForCausalLM": ("mistral", False, False, False),
    "Qwen2ForCausalLM": ("qwen2", False, False, True),
    "Qwen3ForCausalLM": ("qwen3", False, True, None),
    "Phi3ForCausalLM": ("phi3", True, False, False),
}
ROPE_TYPES = ("default", "linear", "llama3", "longrope")
ACTIVATIONS = ("silu",)


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    architecture: str
    vocab_size: int
    hidden_size: int  # H
    intermediate_size: int  # MLP width
    num_layers: int  # L_t
    num_heads: int
    num_kv_heads: int  # GQA: num_heads is a multiple of it
    head_dim: int
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: bias on q/k/v (o_proj never has one)
    o_bias: bool = False  # Llama's attention_bias covers o_proj too
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    fused_on_disk: bool = False  # Phi-3 stores qkv_proj and gate_up_proj fused
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_scaling: dict | None = None
    partial_rotary_factor: float = 1.0  # rotary dims = head_dim * factor, rest passes through
    max_position_embeddings: int = 4096
    original_max_position_embeddings: int | None = None  # longrope: short factors hold up to here
    sliding_window: int | None = None  # None when the checkpoint's window is inactive
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"config: {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"config: num_attention_heads ({self.num_heads}) must be a multiple "
                             f"of num_key_value_heads ({self.num_kv_heads})")
        if self.architecture not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {self.architecture!r}; supported: {', '.join(ARCHITECTURES)}")
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedModelError(
                f"unsupported rope type {self.rope_type!r}"
                + (" (dynamic NTK scaling changes with the sequence length, which a static export "
                   "cannot follow)" if self.rope_type == "dynamic" else "")
                + f"; supported: {', '.join(ROPE_TYPES)}")
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ValueError(f"config: partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")
        if self.rotary_dim % 2:
            raise ValueError(f"config: rotary dims ({self.rotary_dim}) must be even")

    @property
    def model_type(self) -> str:
        return ARCHITECTURES[self.architecture][0]

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def default_taps(self) -> tuple[int, ...]:
        """Low, middle and high layers (docs/design.md, "The pieces"), duplicates dropped for shallow targets."""
        n = self.num_layers
        return tuple(sorted({min(1, n - 1), n // 2, max(n - 2, 0)}))

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_value

    def num_parameters(self) -> int:
        h, i, hd = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        if self.qkv_bias:
            attn += hd * (self.num_heads + 2 * self.num_kv_heads)
        if self.o_bias:
            attn += h
        if self.qk_norm:
            attn += 2 * hd
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + h

    def max_supported_context(self) -> int:
        """The longest context a static export reproduces exactly."""
        limit = self.max_position_embeddings
        if self.rope_type == "longrope":
            # transformers switches to the long factors past this length; a static graph can't.
            limit = min(limit, self.original_max_position_embeddings or limit)
        return limit

    def check_context(self, max_context: int) -> None:
        """Refuse an export context this model cannot be run at exactly (one-line error)."""
        if max_context < 16:
            raise ValueError(f"--max-context must be at least 16, got {max_context}")
        if self.rope_type == "longrope" and max_context > self.max_supported_context():
            raise UnsupportedModelError(
                f"--max-context {max_context} exceeds original_max_position_embeddings "
                f"({self.max_supported_context()}): past it longrope switches factors with the "
                "sequence length, which a static export cannot follow; use a smaller --max-context")
        if max_context > self.max_position_embeddings:
            raise ValueError(f"--max-context {max_context} exceeds max_position_embeddings "
                             f"({self.max_position_embeddings}); use a smaller --max-context")
        if self.sliding_window is not None and self.sliding_window < max_context:
            raise UnsupportedModelError(
                f"sliding-window attention (window {self.sliding_window}) is active and smaller than "
                f"the context {max_context}; use --max-context {self.sliding_window} or less")

    def default_max_context(self) -> int:
        return min(self.max_supported_context(), 4096,
                   self.sliding_window if self.sliding_window is not None else 1 << 30)

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "TargetConfig":
        """Build from the dict of a Hugging Face config.json, refusing what we cannot run."""
        try:
            return cls._from_hf(raw)
        except (TypeError, AttributeError) as e:
            raise ValueError(f"config.json has a field of the wrong type ({e})") from None

    @classmethod
    def _from_hf(cls, raw: dict[str, Any]) -> "TargetConfig":
        arch = _supported_architecture(raw)
        model_type, fused, qk_norm, qkv_bias_default = ARCHITECTURES[arch]
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        scaling = raw.get("rope_scaling")
        rope_type = "default"
        if scaling:
            rope_type = scaling.get("rope_type", scaling.get("type", "default"))
            if model_type == "phi3" and rope_type in ("su", "yarn"):
                rope_type = "longrope"  # transformers' Phi3Config renames these the same way
        attention_bias = bool(raw.get("attention_bias", False))
        qkv_bias = qkv_bias_default if qkv_bias_default is not None else attention_bias

        sliding = raw.get("sliding_window")
        if model_type in ("qwen2", "qwen3"):
            types = raw.get("layer_types")
            active = bool(raw.get("use_sliding_window")) and (types is None or "sliding_attention" in types)
            sliding = sliding if active else None
        elif model_type == "llama":
            sliding = None
        eos = raw.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=attention_bias if model_type in ("llama", "qwen3") else False,
            mlp_bias=bool(raw.get("mlp_bias", False)) if model_type == "llama" else False,
            qk_norm=qk_norm,
            fused_on_disk=fused,
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            rope_type=rope_type,
            rope_scaling=dict(scaling) if scaling else None,
            partial_rotary_factor=float(raw.get("partial_rotary_factor", 1.0)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            original_max_position_embeddings=raw.get("original_max_position_embeddings"),
            sliding_window=sliding,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos,
            torch_dtype=str(raw.get("torch_dtype", "float32")),
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> "TargetConfig":
        if not Path(folder).is_dir():
            raise FileNotFoundError(f"{folder}: not a folder; pass a Hugging Face checkpoint folder")
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no config.json; pass a Hugging Face checkpoint folder")
        return cls.from_hf(read_json_object(path))


def read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object; one-line ValueError otherwise."""
    try:
        raw = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return raw


def rope_inv_freq(cfg: TargetConfig) -> tuple[list[float], float]:
    """Inverse frequencies and the cos/sin scale, exactly as transformers computes them.

    Returns plain floats so callers choose the tensor dtype; longrope uses the short factors,
    which is what transformers does for every sequence up to original_max_position_embeddings.
    """
    try:
        return _rope_inv_freq(cfg)
    except (KeyError, TypeError) as e:
        raise ValueError(f"config: rope_scaling of type {cfg.rope_type!r} lacks or mistypes {e}") from None


def _rope_inv_freq(cfg: TargetConfig) -> tuple[list[float], float]:
    import torch

    with torch.device("cpu"):
        return _inv_freq_cpu(cfg)


def _inv_freq_cpu(cfg: TargetConfig) -> tuple[list[float], float]:
    import torch

    dim = cfg.rotary_dim
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv = 1.0 / (cfg.rope_theta ** exponent)
    scale = 1.0
    s = cfg.rope_scaling or {}
    if cfg.rope_type == "linear":
        inv = inv / s["factor"]
    elif cfg.rope_type == "llama3":
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
        inv = torch.where(medium, smoothed, scaled)
    elif cfg.rope_type == "longrope":
        original = cfg.original_max_position_embeddings
        factor = s.get("factor")
        if original:
            factor = cfg.max_position_embeddings / original
        else:
            original = cfg.max_position_embeddings
        scale = s.get("attention_factor")
        if scale is None:
            scale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        short = torch.tensor(s["short_factor"], dtype=torch.float32)
        if short.numel() != dim // 2:
            raise ValueError(f"config: longrope short_factor has {short.numel()} entries, expected {dim // 2}")
        inv = 1.0 / (short * cfg.rope_theta ** exponent)
    return inv.tolist(), float(scale)


def _supported_architecture(raw: dict[str, Any]) -> str:
    """config.json's one architecture, if hyflash exports it; a one-line refusal naming why otherwise."""
    archs = raw.get("architectures") or []
    if len(archs) != 1:
        raise UnsupportedModelError(f"config.json must name exactly one architecture, got {archs}")
    arch = archs[0]
    if arch not in ARCHITECTURES:
        hint = " (mixture-of-experts models are not supported)" if "moe" in arch.lower() else ""
        raise UnsupportedModelError(
            f"unsupported architecture {arch!r}{hint}; supported: {', '.join(ARCHITECTURES)}")
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if raw.get(key):
            raise UnsupportedModelError(f"mixture-of-experts ({key}={raw[key]}) is not supported")
    act = raw.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise UnsupportedModelError(f"unsupported activation {act!r}; supported: {', '.join(ACTIVATIONS)}")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"):
        if key not in raw:
            raise ValueError(f"config.json has no {key!r}")
    return arch
