"""Real models' geometries, as their `config.json` has them, and random-weight checkpoints of them.

`hyflash memory --preset` computes a budget from these; `write_random_checkpoint` writes a Hugging Face
folder with a preset's exact geometry and random weights, so exports and timings at real sizes can be
measured on a machine that cannot download the real weights (random weights cost what real ones do).
"""

from __future__ import annotations

import json
from pathlib import Path

_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_attention_heads": 16,
          "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
          "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
          "bos_token_id": 151643, "eos_token_id": 151645}

PRESETS = {
    "qwen3-0.6b": {**_QWEN3, "num_hidden_layers": 28, "hidden_size": 1024, "intermediate_size": 3072},
    "qwen3-1.7b": {**_QWEN3, "num_hidden_layers": 28, "hidden_size": 2048, "intermediate_size": 6144},
    "qwen3-4b": {**_QWEN3, "num_hidden_layers": 36, "hidden_size": 2560, "num_attention_heads": 32,
                 "intermediate_size": 9728},
    "llama-3.2-1b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 16,
                     "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True,
                     "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                     "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                     "bos_token_id": 128000, "eos_token_id": 128009},
    "phi-4-reasoning": {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "num_hidden_layers": 40,
                        "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 10, "head_dim": 128,
                        "intermediate_size": 17920, "vocab_size": 100352, "tie_word_embeddings": False,
                        "max_position_embeddings": 32768, "rope_theta": 250000.0, "rms_norm_eps": 1e-5},
}


def preset(name: str) -> dict:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; use one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def write_random_checkpoint(name: str, out: Path, seed: int = 0, dtype: str = "bfloat16",
                            layers: int | None = None) -> Path:
    """A Hugging Face folder (config.json + model.safetensors) with the preset's geometry and random
    weights, built by `transformers` itself (its own initialiser, in `dtype`). layers: fewer decoder
    layers than the preset (a quicker stand-in with the same widths and vocabulary)."""
    import transformers

    raw = preset(name)
    if layers:
        raw["num_hidden_layers"] = layers
    tag = f"{name}/{raw['num_hidden_layers']}"
    out = Path(out)
    if (out / "config.json").is_file() and json.loads((out / "config.json").read_text()).get("hyflash_preset") == tag:
        return out  # already written
    config = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
    transformers.set_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config.hyflash_preset = tag
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100GB")
    return out
