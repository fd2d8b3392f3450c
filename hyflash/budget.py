"""`hyflash memory`: the device memory budget, computed from geometry (never typed in).

Weights are counted by instantiating the models on the meta device (no memory), the target's
KV cache and the drafter's context from their shapes, with the dtypes asked for.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hyflash.export.graphs import check_dtype
from hyflash.models.config import TargetConfig
from hyflash.models.drafter import Drafter, DrafterConfig
from hyflash.models.loading import resolve
from hyflash.models.presets import PRESETS
from hyflash.models.target import Target
from hyflash.runtime_py.manifest import load_manifest

GIB = 2**30
BUDGET = 12 * GIB
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def _meta_models(target_cfg: TargetConfig, drafter_overrides: dict) -> tuple[Target, Drafter]:
    """Both models on the meta device: shapes and parameter counts, no memory."""
    with torch.device("meta"):
        target = Target(target_cfg)
        return target, Drafter.for_target(target, DrafterConfig.for_target(target, **drafter_overrides))


def _counts(target_cfg: TargetConfig, drafter_overrides: dict) -> tuple[int, int, DrafterConfig]:
    target, drafter = _meta_models(target_cfg, drafter_overrides)
    return (sum(p.numel() for p in target.parameters()), sum(p.numel() for p in drafter.parameters()), drafter.cfg)


def budget(target_cfg: TargetConfig, context: int, drafter_overrides: dict, kv_dtype: str = "bf16",
           state_dtype: str = "fp32") -> dict:
    """Bytes of everything a device holds for speculative decoding at `context` tokens."""
    if context < 1:
        raise ValueError(f"--context must be positive, got {context}")
    for name, value in (("--kv-dtype", kv_dtype), ("--state-dtype", state_dtype)):
        if value not in DTYPE_BYTES:
            raise ValueError(f"{name} must be one of {', '.join(DTYPE_BYTES)}, got {value!r}")
    target_params, drafter_params, dcfg = _counts(target_cfg, drafter_overrides)
    kv = DTYPE_BYTES[kv_dtype]
    ctx = dcfg.context_bytes(context, kv_bytes=kv, state_bytes=DTYPE_BYTES[state_dtype])
    out = {
        "target_parameters": target_params, "drafter_parameters": drafter_params,
        "target_weight_bytes": {f"{b}bit": target_params * b // 8 for b in (16, 4, 2)},
        "drafter_weight_bytes": {f"{b}bit": drafter_params * b // 8 for b in (16, 4)},
        "target_kv_bytes": target_cfg.kv_bytes_per_token(kv) * context,
        "drafter_window_bytes": ctx["window_allocated"],
        "drafter_state_bytes": ctx["state"] + ctx["conv_state"],
        "drafter_ssm_state_bytes": ctx["state"], "drafter_conv_state_bytes": ctx["conv_state"],
        "drafter_context_bytes": ctx["allocated"],
        "context": context, "kv_dtype": kv_dtype, "state_dtype": state_dtype,
        "drafter": {"memory": dcfg.memory, "window": dcfg.window_size(context), "full_attention": dcfg.window == "full",
                    "layers": dcfg.layers,
                    "ssm_heads": dcfg.ssm_heads, "ssm_head_dim": dcfg.ssm_head_dim, "d_state": dcfg.d_state},
        "budget_bytes": BUDGET,
    }
    out["total_bytes"] = {
        f"target {tb}, drafter {db}": out["target_weight_bytes"][tb] + out["drafter_weight_bytes"][db]
        + out["target_kv_bytes"] + out["drafter_context_bytes"]
        for tb in ("16bit", "4bit", "2bit") for db in ("16bit", "4bit")}
    return out


def target_from(preset: str | None, artifacts: Path | None, target: Path | None) -> tuple[TargetConfig, dict, int]:
    """(target config, drafter overrides, default context) from exactly one source."""
    if preset:
        if preset not in PRESETS:
            raise ValueError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
        return TargetConfig.from_hf(PRESETS[preset]), {"window": 256}, 32768
    if artifacts:
        m = load_manifest(artifacts)
        d = dict(m["drafter"]["config"])
        return TargetConfig.from_hf(m["target"]["config"]), d, m["max_context"]
    cfg = TargetConfig.from_folder(resolve(target, "target"))
    return cfg, {}, cfg.default_max_context()


def _fmt(n: int) -> str:
    return f"{n / GIB:8.2f} GiB" if n >= GIB else f"{n / 2**20:8.2f} MiB"


def format_budget(b: dict) -> str:
    d = b["drafter"]
    lines = [f"context {b['context']:,} tokens, KV in {b['kv_dtype']}, state in {b['state_dtype']}; "
             f"drafter: {d['layers']} layers, {d['memory']}, window {d['window']}, "
             f"{d['ssm_heads']} x {d['ssm_head_dim']} x {d['d_state']} state per layer"]
    for bits, n in b["target_weight_bytes"].items():
        lines.append(f"  {f'target weights ({bits})':<29}{_fmt(n)}   ({b['target_parameters'] / 1e9:.2f} B parameters)")
    lines.append(f"  {'target KV cache':<29}{_fmt(b['target_kv_bytes'])}")
    for bits, n in b["drafter_weight_bytes"].items():
        lines.append(f"  {f'drafter weights ({bits})':<29}{_fmt(n)}   ({b['drafter_parameters'] / 1e6:.0f} M own parameters)")
    lines.append(f"  {'drafter window K/V':<29}{_fmt(b['drafter_window_bytes'])}")
    lines.append(f"  {'drafter recurrent state':<29}{_fmt(b['drafter_ssm_state_bytes'])}   "
                 f"(+ conv state {_fmt(b['drafter_conv_state_bytes']).strip()})")
    grows = "grows with the context: full attention" if b["drafter"]["full_attention"] else "constant in the context length"
    lines.append(f"  {'drafter context, all':<29}{_fmt(b['drafter_context_bytes'])}   ({grows})")
    for label, n in b["total_bytes"].items():
        verdict = "fits" if n <= b["budget_bytes"] else "over"
        lines.append(f"  {'total, ' + label:<36}{_fmt(n)}   {verdict} a 12 GiB budget")
    return "\n".join(lines)


# Bytes per stored weight, by format and quantization mode: groups of 32 carry an fp32 scale (ONNX's
# asymmetric int4 a 4-bit zero point too; XNNPACK packs int4 with bf16 scales). TABLE_BYTES: a quantized
# vocabulary table as a lookup (--quantize-embeddings; in ONNX the projection is the same bytes).
LINEAR_BYTES = {("onnx", "none"): 4, ("onnx", "int8"): 1, ("onnx", "int4"): 0.5 + 4 / 32 + 0.5 / 32,
                ("pte", "none"): 4, ("pte", "int8"): 1, ("pte", "int4"): 0.5 + 2 / 32}
TABLE_BYTES = {"none": 4, "int8": 1 + 4 / 32, "int4": 0.5 + 4 / 32}


def export_sizes(target_cfg: TargetConfig, drafter_overrides: dict, quantize: str = "none",
                 quantize_target: str = "none", quantize_embeddings: str = "none", dtype: str = "fp32") -> dict:
    """Estimated bytes of an export's weights, per format, before anything is exported: parameters counted
    on the meta device, priced by how `hyflash export` stores them. ONNX: one weights file (a tied table
    stored once; quantized, the drafter's view of it too, while in fp32 the drafter's head is the table
    transposed). `.pte`: one program, each table stored once as a lookup and once as packed projection
    weights; the drafter's view of them is the target's. dtype fp16 (unquantized only, as `export`)
    halves every float. Graph structure (a few hundred KiB) is not counted."""
    from torch import nn

    check_dtype(dtype, quantize, quantize_target, quantize_embeddings)
    scale = DTYPE_BYTES[dtype] / 4

    target, drafter = _meta_models(target_cfg, drafter_overrides)
    v, h = target_cfg.vocab_size, target_cfg.hidden_size
    table = v * h
    markov = [drafter.markov_in, drafter.markov_out] if drafter.cfg.markov_rank else []
    own_head = drafter.cfg.draft_vocab * h if drafter.cfg.draft_vocab else 0

    def split(module, skip):  # (Linear weights, every other parameter), the `skip` modules left out
        skipped = {id(p) for m in skip for p in m.parameters()}
        linear = sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear) and m not in skip)
        rest = sum(p.numel() for p in module.parameters() if id(p) not in skipped)
        return linear, rest - linear

    t_lin, t_rest = split(target, [target.embed, target.lm_head])
    d_lin, d_rest = split(drafter, markov)
    m_table = sum(m.weight.numel() for m in markov)
    qe, qt, qd = quantize_embeddings, quantize_target, quantize

    def tables(fmt: str, model: str) -> float:
        """The vocabulary tables `model` stores in `fmt` (the drafter's own Markov tables included)."""
        if qe != "none":  # a .pte's projections are XNNPACK's packed linears
            table_b = TABLE_BYTES[qe]
            head_b = table_b if fmt == "onnx" else LINEAR_BYTES["pte", qe]
        else:  # int4 keeps the LM head fp32; an ONNX drafter in int8 quantizes the head it scores (its own copy)
            table_b, head_b = 4, 4
        if model == "target":
            if fmt == "onnx":
                return table * table_b * (1 if target_cfg.tie_word_embeddings else 2)
            return table * (table_b + head_b)
        markov_b = (table_b + head_b) / 2 if qe != "none" else (4 + LINEAR_BYTES[fmt, qd]) / 2
        own = own_head * head_b + m_table * markov_b
        if fmt == "onnx":  # quantized tables are shared with the target's; an fp32 head is the table transposed
            return own + (0 if qe != "none" or own_head else table * LINEAR_BYTES["onnx", "int8" if qd == "int8" else "none"])
        return own  # one program: its view of the target's tables is the target's bytes, stored once

    out = {}
    for fmt in ("onnx", "pte"):
        target_b = t_lin * LINEAR_BYTES[fmt, qt] + t_rest * 4 + tables(fmt, "target")
        drafter_b = d_lin * LINEAR_BYTES[fmt, qd] + d_rest * 4 + tables(fmt, "drafter")
        target_b, drafter_b = target_b * scale, drafter_b * scale
        out[fmt] = {"target": int(target_b), "drafter": int(drafter_b), "total": int(target_b + drafter_b)}
    return out
