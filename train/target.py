"""`hyflash train-target`: the reference target, a small Qwen3 trained on the stdlib corpus."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch

from hyflash.models.config import TargetConfig
from hyflash.models.loading import load_target, save_target
from hyflash.models.target import Target
from hyflash.train.copytrain import CopyCurriculum
from hyflash.train.data import EOS, check_corpus, sample_windows, token_stream
from hyflash.train.loop import TrainConfig, is_writer, lm_loss, train, write_folder


def reference_config(vocab_size: int, eos_id: int, layers: int = 12, hidden: int = 256) -> dict:
    """A Hugging Face Qwen3 config.json for the reference target.

    12 layers so that a 2-layer drafter is 1/6 of its depth; 2,560 positions so an export holds
    a 2,048-token prompt plus generation (the model is trained at 2,048).
    """
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers, "num_attention_heads": hidden // 64, "num_key_value_heads": max(1, hidden // 128),
        "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 2560, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": None,
        "bos_token_id": eos_id, "eos_token_id": eos_id, "torch_dtype": "float32",
        "transformers_version": "4.57.6",
    }


def init_weights(model: Target, seed: int) -> None:
    """GPT-2 style init: N(0, 0.02), residual outputs scaled by 1/sqrt(2L)."""
    g = torch.Generator().manual_seed(seed)
    std_out = 0.02 / (2 * model.cfg.num_layers) ** 0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif p.dim() == 2:
                p.normal_(0.0, std_out if name.endswith(("o.weight", "down.weight")) else 0.02, generator=g)
            else:
                p.zero_()


def train_target(corpus: Path, tokenizer: Path, out: Path, cfg: TrainConfig, seq_len: int = 2048,
                 layers: int = 12, hidden: int = 256, init_from: Path | None = None,
                 curriculum: str | None = None, probe_every: int | None = None) -> Path:
    """Train and write a Hugging Face folder to `out/model` (config, weights, tokenizer).

    `init_from`: continue from that target folder's weights (its config; `layers`/`hidden`
    unused). `curriculum` ("copy", train/repeats.py) and `probe_every` (copy rate and held-out
    loss in the log): train/copytrain.py. Without them, the original recipe unchanged.
    """
    from tokenizers import Tokenizer

    check_corpus(corpus, tokenizer)
    tok = Tokenizer.from_file(str(tokenizer))
    if init_from is not None:
        model, raw = _init_from(Path(init_from), tokenizer)
    else:
        raw = reference_config(tok.get_vocab_size(), tok.token_to_id(EOS), layers, hidden)
        model = Target(TargetConfig.from_hf(raw))
        init_weights(model, cfg.seed)
    stream = token_stream(corpus, tokenizer, "train")
    if curriculum or probe_every:
        heldout = token_stream(corpus, tokenizer, "heldout") if probe_every else None
        cur = CopyCurriculum(stream, heldout, tok.get_vocab_size(), tok.token_to_id(EOS), seq_len, out,
                             curriculum, probe_every)
        log = train(model, cur.loss_fn, cur.batch_fn, cfg, "target")
    else:
        log = train(model, lm_loss, lambda rng, n: sample_windows(stream, n, seq_len + 1, rng), cfg, "target")
    dest = out / "model"

    def fill(tmp: Path) -> None:
        save_target(model.eval(), tmp, raw, dtype=torch.bfloat16)
        shutil.copy(tokenizer, tmp / "tokenizer.json")

    write_folder(dest, fill)
    if is_writer():
        (out / "train_config.json").write_text(json.dumps(
            {**{k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(cfg).items()},
             "seq_len": seq_len, "steps_done": len(log),
             **({"init_from": str(init_from), "curriculum": curriculum, "probe_every": probe_every}
                if init_from or curriculum or probe_every else {})}, indent=1))
    return dest


def _init_from(folder: Path, tokenizer: Path) -> tuple[Target, dict]:
    """An existing target folder's weights (fp32) and config; its tokenizer must be `tokenizer`."""
    own = folder / "tokenizer.json"
    if own.is_file() and own.read_bytes() != Path(tokenizer).read_bytes():
        raise ValueError(f"{own} differs from {tokenizer}: the token ids would not match the weights")
    model = load_target(folder).train()
    return model, json.loads((folder / "config.json").read_text())
