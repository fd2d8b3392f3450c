"""Tiny random checkpoints of every supported architecture, built by `transformers` itself."""

from __future__ import annotations

import torch

VOCAB = 96
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)

# name -> (transformers config class name, overrides)
VARIANTS = {
    "llama": ("LlamaConfig", {}),
    "llama-llama3-rope-bias": ("LlamaConfig", dict(
        attention_bias=True, mlp_bias=True, num_key_value_heads=1,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "llama-linear-rope-tied": ("LlamaConfig", dict(
        tie_word_embeddings=True, rope_theta=500.0, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "mistral": ("MistralConfig", dict(sliding_window=None, head_dim=32)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=24, tie_word_embeddings=True)),
    "phi3": ("Phi3Config", dict(num_key_value_heads=4)),
    "phi3-longrope-partial": ("Phi3Config", dict(
        partial_rotary_factor=0.5, max_position_embeddings=1024, original_max_position_embeddings=256,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(4)],
                      "long_factor": [2.0 + i for i in range(4)]})),
}
ARCH_VARIANTS = ("llama", "mistral", "qwen2", "qwen3", "phi3")


def make_hf_model(variant: str, seed: int = 0, scale: float = 1.0, **config):
    """scale: every weight matrix times this, for activations and logits as large as a real model's;
    config: overrides of the variant's config (vocab_size, eos_token_id, ...)."""
    import transformers

    cls_name, overrides = VARIANTS[variant]
    cfg = getattr(transformers, cls_name)(**{**BASE, **overrides, **config})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    with torch.no_grad():  # random init is small; widen it so logits differ meaningfully
        for name, p in model.named_parameters():
            if "norm" in name or "layernorm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.normal_(0, 0.05)
            else:
                p.mul_(scale)
    return model.eval()


def save_hf_model(variant: str, folder, seed: int = 0, dtype=torch.float32, scale: float = 1.0, **config):
    model = make_hf_model(variant, seed, scale, **config)
    model.to(dtype).save_pretrained(folder, safe_serialization=True)
    return model.float()
