"""`hyflash inspect`: what a checkpoint is, whether (and at what context) it can be exported, and what an
export with given options would weigh and need on a device, before anything is exported."""

from __future__ import annotations

from pathlib import Path

from hyflash.budget import budget, export_sizes
from hyflash.models.config import TargetConfig, UnsupportedModelError
from hyflash.models.loading import drafter_config_dict, load_target, resolve


def inspect_target(folder: str | Path, max_context: int | None = None, drafter: str = "random",
                   quantize: str = "none", quantize_target: str = "none", quantize_embeddings: str = "none",
                   dtype: str = "fp32") -> dict:
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
        "export": export_estimate(cfg, context, drafter, quantize, quantize_target, quantize_embeddings, dtype),
    }


def export_estimate(cfg: TargetConfig, context: int, drafter: str, quantize: str, quantize_target: str,
                    quantize_embeddings: str, dtype: str = "fp32") -> dict:
    """File sizes by format (budget.export_sizes) and the device budget at `context` (`hyflash memory`'s,
    with the KV cache and the drafter's state in `dtype`, as exports keep them) for these export options."""
    overrides = {}
    if drafter != "random":
        overrides = dict(drafter_config_dict(resolve(drafter, "drafter"))["hyflash_drafter"])
        overrides = {k: v for k, v in overrides.items() if k not in ("hidden_size", "vocab_size", "taps")}
    sizes = export_sizes(cfg, overrides, quantize, quantize_target, quantize_embeddings, dtype)
    b = budget(cfg, context, overrides, kv_dtype=dtype, state_dtype=dtype)
    return {"drafter": drafter, "quantize": quantize, "quantize_target": quantize_target,
            "quantize_embeddings": quantize_embeddings, "dtype": dtype, "bytes": sizes, "context": context,
            "target_kv_bytes": b["target_kv_bytes"], "drafter_context_bytes": b["drafter_context_bytes"],
            "device_bytes": {fmt: sizes[fmt]["total"] + b["target_kv_bytes"] + b["drafter_context_bytes"]
                             for fmt in sizes}}


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
    e = r["export"]
    mib = lambda n: f"{n / 2**20:,.1f} MiB"
    lines.append(f"  export         {e['dtype']}, drafter {e['drafter']}, quantize {e['quantize']} / target "
                 f"{e['quantize_target']} / embeddings {e['quantize_embeddings']} (estimated before export):")
    for fmt, label in (("onnx", "ONNX"), (".pte", ".pte")):
        sz = e["bytes"][fmt.strip(".")]
        lines.append(f"    {label:<5} files {mib(sz['total'])} (target {mib(sz['target'])}, drafter {mib(sz['drafter'])}); "
                     f"on a device with the {e['dtype']} KV cache at {e['context']:,} ({mib(e['target_kv_bytes'])}) and the "
                     f"drafter's context: {mib(e['device_bytes'][fmt.strip('.')])}")
    return "\n".join(lines)
