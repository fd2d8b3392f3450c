"""`hyflash inspect`: what a checkpoint is, and whether (and at what context) it can be exported."""

from __future__ import annotations

from pathlib import Path

from hyflash.models.config import TargetConfig, UnsupportedModelError
from hyflash.models.loading import load_target, resolve


def inspect_target(folder: str | Path, max_context: int | None = None) -> dict:
    """A report on the checkpoint; loads the weights (so shape mismatches surface here).

    Unreadable or inconsistent folders raise (one-line messages); a readable checkpoint that
    cannot be exported gives `supported: False` and the reason.
    """
    folder = resolve(folder, "target")
    cfg = TargetConfig.from_folder(folder)
    model = load_target(folder)
    context = max_context or cfg.default_max_context()
    reason = None
    try:
        cfg.check_context(context)
    except UnsupportedModelError as e:
        reason = str(e)
    return {
        "path": str(folder),
        "architecture": cfg.architecture,
        "layers": cfg.num_layers, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size, "tied_embeddings": cfg.tie_word_embeddings,
        "parameters": sum(p.numel() for p in model.parameters()),
        "taps": list(model.taps),
        "rope": {"theta": cfg.rope_theta, "type": cfg.rope_type, "rotary_dim": cfg.rotary_dim,
                 "scaling": cfg.rope_scaling},
        "max_position_embeddings": cfg.max_position_embeddings,
        "max_context": context,
        "kv_cache_bytes_per_token": {"bf16": cfg.kv_bytes_per_token(2), "fp32": cfg.kv_bytes_per_token(4)},
        "tokenizer": (folder / "tokenizer.json").is_file(),
        "supported": reason is None,
        "reason": reason,
    }


def format_report(r: dict) -> str:
    rope = r["rope"]
    lines = [
        f"{r['path']}",
        f"  architecture   {r['architecture']}",
        f"  geometry       {r['layers']} layers, hidden {r['hidden_size']}, MLP {r['intermediate_size']}, "
        f"{r['heads']} heads / {r['kv_heads']} KV heads x {r['head_dim']}, vocab {r['vocab_size']}"
        + (", tied embeddings" if r["tied_embeddings"] else ""),
        f"  parameters     {r['parameters']:,}",
        f"  taps           {r['taps']}",
        f"  rope           {rope['type']}, theta {rope['theta']:g}, rotary dims {rope['rotary_dim']}",
        f"  context        {r['max_context']} (max_position_embeddings {r['max_position_embeddings']})",
        f"  KV cache       {r['kv_cache_bytes_per_token']['bf16']:,} bytes/token in 16-bit "
        f"({r['kv_cache_bytes_per_token']['bf16'] * r['max_context'] / 2**20:.1f} MiB at {r['max_context']})",
        f"  tokenizer      {'tokenizer.json' if r['tokenizer'] else 'none (token ids only)'}",
        f"  supported      {'yes' if r['supported'] else 'no: ' + r['reason']}",
    ]
    return "\n".join(lines)
