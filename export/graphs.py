"""The exported graphs, each declared once: names, dtypes, static shapes, tolerances (docs/design.md).

Export, validation, the manifest and the runtime all read these declarations. Variants change
the set (no `state_commit` and no state inputs without memory; no `confidence` output without
the confidence head; `lookup_tokens` and `lookup_match` inputs only with the lookup input), never the
meaning of a name.

The target's graphs keep their K/V cache in place, in each format's own way:
- ONNX: per-layer `past_key.{i}` / `past_value.{i}` inputs `[1, kvh, T, hd]` and `present_*`
  outputs that the runtime binds to the same buffers; attention is onnxruntime's
  GroupQueryAttention, whose cost follows the committed length, not T.
- ExecuTorch: per-layer mutable buffers `[1, T, kvh, hd]` of `model.pte`, shared by its three
  target methods, written by `llama::update_cache` and read by `llama::custom_sdpa` (causal, so rows
  past the block are never read).
Both take only `tokens` and `positions`; the block starts at `positions[0]`.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from hyflash.models.drafter import Drafter
from hyflash.models.kv_attention import cache_attention
from hyflash.models.target import Target
from hyflash.runtime_py.manifest import (
    PAST_KEY,
    PAST_VALUE,
    PRESENT_KEY,
    PRESENT_VALUE,
    PTE_FILE,
    PTE_KERNELS,
    PTE_VERIFY_ATTENTION,
    VERIFY_ROWS,
    VERIFY_WIDTHS,
    cache_names,
    check_widths,
    verify_graph,
)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "float32" | "float16" | "int64"
    shape: tuple[int, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """An exported output passes when max|got - expected| <= atol + rtol * max|expected|: rounding
    grows with the values rounded, so a fixed absolute bar fails correct graphs of large models."""

    atol: float
    rtol: float

    def bound(self, scale: float) -> float:
        return self.atol + self.rtol * scale


# fp32 graphs against fp32 eager PyTorch, by output kind: values a block computes afresh (logits,
# features, K/V rows) and state carried from call to call (window, recurrent and conv state).
# Measured: the reference pair's worst is 1.5e-5 on logits of scale ~20; a random drafter on a target
# with weights x10 reaches 1.3e-4 on draft logits of scale 5 (2.5e-5 relative); one weight row of
# the target scaled by 1.01 moves logits by far more than 1e-4 relative (tests/test_tolerance.py).
TOLERANCES = {"values": Tolerance(1e-5, 1e-4), "state": Tolerance(1e-6, 2e-5)}
# fp16 graphs (`export --dtype fp16`) against the same fp32 eager models, fed the same fp16 inputs.
# Measured on the reference pair (research/scripts/fp16_report.py, research/results/fp16.json).
TOLERANCES_FP16 = {"values": Tolerance(1e-3, 2e-2), "state": Tolerance(1e-3, 2e-2)}
FLOAT_DTYPES = {"fp32": "float32", "fp16": "float16"}  # export --dtype -> the graphs' float dtype


def check_dtype(dtype: str, *quantize_modes: str) -> None:
    """--dtype as export (and inspect's estimate of it) takes it: one line naming the fix otherwise."""
    if dtype == "bf16":
        raise ValueError("--dtype bf16: neither CPU backend runs bf16 graphs (onnxruntime's CPU provider has no "
                         "bf16 Gemm; XNNPACK leaves bf16 matmuls to ExecuTorch's portable kernels); use --dtype fp16")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(FLOAT_DTYPES)}, got {dtype!r}")
    if dtype != "fp32" and any(m != "none" for m in quantize_modes):
        raise ValueError(f"--dtype {dtype} with --quantize*: not supported (quantized exports keep fp32 "
                         "around their integer weights); use --dtype fp32, or drop the --quantize options")


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    name: str
    model: str  # "drafter" | "target": which weights it holds (one ONNX weights file, one .pte each)
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    tolerances: dict = dataclasses.field(default_factory=lambda: dict(TOLERANCES))

    def tolerance(self, output: str) -> Tolerance:
        """The bar for a float output; int64 outputs (tokens, positions) must match exactly."""
        state = output.endswith("_out")
        return self.tolerances["state" if state else "values"]


def _float(name, *shape, dtype="float32"):
    return TensorSpec(name, dtype, tuple(shape))


def _i(name, *shape):
    return TensorSpec(name, "int64", tuple(shape))


def graph_specs(target: Target, drafter: Drafter, max_context: int, prefill_chunk: int,
                dtype: str = "float32", verify_widths: tuple[int, ...] = VERIFY_WIDTHS) -> dict[str, GraphSpec]:
    """Every graph's declaration; float tensors in `dtype` (float32 | float16), the cache too; a verify graph
    for each of `verify_widths` (`verify_graph`: target_verify for the full block)."""
    t, d = target.cfg, drafter.cfg
    _f = functools.partial(_float, dtype=dtype)
    w = d.window_size(max_context)
    win = (d.layers, d.kv_heads, w, d.head_dim)  # the window in the layout its attention reads
    feat = target.feature_size
    specs = {}
    state = ()
    if d.memory != "off":
        s_shape, c_shape = drafter.layers[0].mem.state_shapes()
        ssm, conv = _f("ssm_state", d.layers, *s_shape), _f("conv_state", d.layers, *c_shape)
        state = (ssm,)
        specs["state_commit"] = GraphSpec(
            "state_commit", "drafter",
            (_f("features", VERIFY_ROWS, feat), _i("n_valid", 1), ssm, conv),
            (_f("ssm_state_out", *ssm.shape), _f("conv_state_out", *conv.shape)))
    outputs = (_i("draft_tokens", d.block), _f("draft_logits", d.block, d.head_size))
    if d.confidence:
        outputs += (_f("confidence", d.block),)
    lookup = (_i("lookup_tokens", d.block), _i("lookup_match", 1)) if d.lookup_input else ()
    specs["draft_read"] = GraphSpec(
        "draft_read", "drafter",
        (_i("anchor_token", 1), _i("anchor_pos", 1), _f("win_k", *win), _f("win_v", *win), _i("win_pos", w))
        + state + lookup, outputs)
    specs["window_shift"] = GraphSpec(
        "window_shift", "drafter",
        (_f("features", VERIFY_ROWS, feat), _i("positions", VERIFY_ROWS), _i("n_valid", 1),
         _f("win_k", *win), _f("win_v", *win), _i("win_pos", w)),
        (_f("win_k_out", *win), _f("win_v_out", *win), _i("win_pos_out", w)))
    widths = [(verify_graph(w), w) for w in check_widths(verify_widths)]
    for name, rows in (("target_prefill", prefill_chunk), *widths, ("target_decode", 1)):
        specs[name] = GraphSpec(name, "target", (_i("tokens", rows), _i("positions", rows)),
                                (_f("logits", rows, t.vocab_size), _f("features", rows, feat)))
    if dtype != "float32":
        specs = {k: dataclasses.replace(s, tolerances=dict(TOLERANCES_FP16)) for k, s in specs.items()}
    return specs


def cache_spec(target: Target, max_context: int, dtype: str = "float32", pte_kernels: str = "executorch") -> dict:
    """The manifest's `cache` entry: where the target's K/V rows live in each format. pte_kernels: the build
    of the cache kernels the .pte is exact with (`TargetPte`), hence how its verify blocks attend."""
    c = target.cfg
    return {"layers": c.num_layers, "kv_heads": c.num_kv_heads, "rows": max_context, "head_dim": c.head_dim,
            "dtype": dtype,
            "onnx": {"past": [PAST_KEY, PAST_VALUE], "present": [PRESENT_KEY, PRESENT_VALUE],
                     "shape": [1, c.num_kv_heads, max_context, c.head_dim], "layout": "BNSH",
                     "op": "com.microsoft.GroupQueryAttention",
                     "binding": "bind present_* to the very buffer given as past_* (IOBinding): rows written in place"},
            "pte": {"buffers": ["k_cache_{layer}", "v_cache_{layer}"],
                    "shape": [1, max_context, c.num_kv_heads, c.head_dim], "layout": "BSNH",
                    "where": f"mutable buffers of {PTE_FILE}, shared by its target methods "
                             "(load them all from one Program)",
                    "kernels": list(PTE_KERNELS), "verify_attention": PTE_VERIFY_ATTENTION[pte_kernels]}}


def onnx_cache_specs(target: Target, max_context: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The ONNX target graphs' cache inputs and outputs, in graph order, in the target's dtype."""
    c = target.cfg
    shape, dtype = (1, c.num_kv_heads, max_context, c.head_dim), str(target.embed.weight.dtype).removeprefix("torch.")
    past = [_float(n, *shape, dtype=dtype) for n in cache_names(PAST_KEY, PAST_VALUE, c.num_layers)]
    present = [_float(n, *shape, dtype=dtype) for n in cache_names(PRESENT_KEY, PRESENT_VALUE, c.num_layers)]
    return past, present


class DrafterGraph(nn.Module):
    """A drafter graph (`draft_read`, `state_commit`, `window_shift`): the drafter's function of that name,
    its inputs passed by the spec's names (the variants' optional ones included); outputs in spec order."""

    def __init__(self, drafter: Drafter, spec: GraphSpec):
        super().__init__()
        self.drafter, self.graph, self.names = drafter, spec.name, [t.name for t in spec.inputs]

    def forward(self, *inputs):
        outs = getattr(self.drafter, self.graph)(**dict(zip(self.names, inputs, strict=True)))
        return tuple(o for o in outs if o is not None)  # draft_read without the confidence head: no confidence


class TargetOnnx(nn.Module):
    """(tokens, positions, past_key.0, past_value.0, ...) -> (logits, features, present_key.0, ...)."""

    def __init__(self, target: Target):
        super().__init__()
        self.target = target

    def forward(self, tokens, positions, *past):
        c = self.target.cfg
        n = tokens.shape[0]
        seqlens_k = positions[-1:].to(torch.int32)  # (1,): total - 1, GroupQueryAttention's convention
        total = (positions[-1] + 1).to(torch.int32)  # (): rows of the cache once this block is written
        present = []

        def attend(i, q, k, v):  # q (1, n, heads, hd), k/v (1, n, kvh, hd) -> (1, n, heads*hd)
            out, k_all, v_all = cache_attention(
                q.reshape(1, n, -1), k.reshape(1, n, -1), v.reshape(1, n, -1), past[2 * i], past[2 * i + 1],
                seqlens_k, total, c.num_heads, c.num_kv_heads)
            present.extend((k_all, v_all))
            return out

        logits, features = self.target.step_in_place(tokens, positions, attend)
        return (logits, features, *present)


class TargetPte(nn.Module):
    """(tokens, positions) -> (logits, features); the cache is this module's mutable buffers.

    A verify row must be bit for bit the decode step at its position (the rest of a row is elementwise, a
    reduction over that row, or an integer-exact product; in an 8da4w target, whose activations are quantized
    per token, a last-bit difference in attention moves a quantization step: logits up to 0.21 apart in 5 of 12
    random blocks of the reference target, research/scripts/pte_verify_rows.sh, and speculative output that
    parts from target-only's). How a verify block (2..VERIFY_ROWS rows) attends depends on the build of the
    `custom_sdpa` kernel the program will run with (`pte_kernels`):
    - "hyflash" (the project's, runtime_cpp/src/kernels.cc): one call for the block. That kernel computes every
      query vector by the same operations whatever the call's row count, so each row is its one-row call's;
      the block reads the cache once.
    - "executorch" (ExecuTorch's LLM kernels, as the Android AAR links them): row by row, each row by the
      one-row call `target_decode` makes at its position, since ExecuTorch's kernel rounds a row of a block
      differently in the last bits. Exact with either build; each row reads the whole cache again.
    Prefill chunks wider than a verify block, shared by every mode, attend in one call.

    Needs ExecuTorch's LLM custom ops registered (`hyflash.export.lower` imports them).
    """

    def __init__(self, target: Target, max_context: int, pte_kernels: str = "executorch"):
        super().__init__()
        c = target.cfg
        self.target = target
        self.rows = max_context
        self.rows_apart = PTE_VERIFY_ATTENTION[pte_kernels] == "rows"
        shape, dtype = (1, max_context, c.num_kv_heads, c.head_dim), target.embed.weight.dtype  # the cache follows
        for i in range(c.num_layers):  # names as the manifest's cache.pte.buffers
            self.register_buffer(f"k_cache_{i}", torch.zeros(shape, dtype=dtype))
            self.register_buffer(f"v_cache_{i}", torch.zeros(shape, dtype=dtype))

    def forward(self, tokens, positions):
        n = tokens.shape[0]
        start = positions[0].item()
        torch._check_is_size(start)
        torch._check(start + n <= self.rows)

        def attend(i, q, k, v):
            k_cache, v_cache = getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")
            torch.ops.llama.update_cache(k, k_cache, start)  # (1, n, kvh, hd) at rows start..
            torch.ops.llama.update_cache(v, v_cache, start)
            if 1 < n <= VERIFY_ROWS and self.rows_apart:  # row r: causal from start + r, as target_decode there
                out = torch.cat([torch.ops.llama.custom_sdpa(q[:, r:r + 1], k_cache, v_cache, start + r, None, 0, True)
                                 for r in range(n)], dim=1)
            else:
                out = torch.ops.llama.custom_sdpa(q, k_cache, v_cache, start, None, 0, True)
            return out.reshape(1, n, -1)  # (1, n, heads, hd) -> (1, n, heads*hd)

        return self.target.step_in_place(tokens, positions, attend)


def graph_module(spec: GraphSpec, target: Target, drafter: Drafter, fmt: str = "onnx",
                 max_context: int | None = None, pte_kernels: str = "executorch") -> nn.Module:
    """The module a graph is traced from. fmt "onnx" | "pte" (and pte_kernels) matter for the target only."""
    if spec.model == "target":
        return (TargetOnnx(target) if fmt == "onnx" else TargetPte(target, max_context, pte_kernels)).eval()
    return DrafterGraph(drafter, spec).eval()


def example_inputs(spec: GraphSpec, cache: list[TensorSpec] = ()) -> tuple[torch.Tensor, ...]:
    """Tracing inputs: valid, but deliberately simple (validation uses other inputs)."""
    out = []
    for t in (*spec.inputs, *cache):
        if t.name in ("positions", "win_pos"):
            x = torch.arange(t.shape[0], dtype=torch.int64)
        elif t.dtype == "int64":
            x = torch.ones(t.shape, dtype=torch.int64)
        else:
            x = torch.zeros(t.shape, dtype=getattr(torch, t.dtype))
        out.append(x)
    return tuple(out)
