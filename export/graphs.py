"""The exported graphs, each declared once (DESIGN §3): names, dtypes, static shapes, tolerance.

Export, validation, the manifest and the runtime all read these declarations. Variants change
the set (no `state_commit` and no state inputs without memory; no `confidence` output without
the confidence head), never the meaning of a name.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..models.drafter import Drafter
from ..models.target import Target

VERIFY_ROWS = 8  # anchor + 7 drafts; also the commit width


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "float32" | "int64"
    shape: tuple[int, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    name: str
    model: str  # "drafter" | "target": which weights it holds (one ONNX weights file, one .pte each)
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    atol: float  # fp32 parity tolerance against eager PyTorch, per output
    state_atol: float = 1e-5

    def tolerance(self, output: str) -> float:
        return self.state_atol if output.endswith("_out") else self.atol


def _f(name, *shape):
    return TensorSpec(name, "float32", tuple(shape))


def _i(name, *shape):
    return TensorSpec(name, "int64", tuple(shape))


def graph_specs(target: Target, drafter: Drafter, max_context: int, prefill_chunk: int) -> dict[str, GraphSpec]:
    t, d = target.cfg, drafter.cfg
    w = d.window_size(max_context)
    kv = (t.num_layers, t.num_kv_heads, max_context, t.head_dim)
    win = (d.layers, w, d.kv_heads, d.head_dim)
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
            (_f("ssm_state_out", *ssm.shape), _f("conv_state_out", *conv.shape)), atol=1e-5)
    outputs = (_i("draft_tokens", d.block), _f("draft_logits", d.block, d.vocab_size))
    if d.confidence:
        outputs += (_f("confidence", d.block),)
    specs["draft_read"] = GraphSpec(
        "draft_read", "drafter",
        (_i("anchor_token", 1), _i("anchor_pos", 1), _f("win_k", *win), _f("win_v", *win), _i("win_pos", w)) + state,
        outputs, atol=1e-4)
    specs["window_shift"] = GraphSpec(
        "window_shift", "drafter",
        (_f("features", VERIFY_ROWS, feat), _i("positions", VERIFY_ROWS), _i("n_valid", 1),
         _f("win_k", *win), _f("win_v", *win), _i("win_pos", w)),
        (_f("win_k_out", *win), _f("win_v_out", *win), _i("win_pos_out", w)), atol=1e-5)
    for name, rows in (("target_prefill", prefill_chunk), ("target_verify", VERIFY_ROWS), ("target_decode", 1)):
        new = (t.num_layers, t.num_kv_heads, rows, t.head_dim)
        specs[name] = GraphSpec(
            name, "target",
            (_i("tokens", rows), _i("positions", rows), _i("n_valid", 1), _f("k_cache", *kv), _f("v_cache", *kv)),
            (_f("logits", rows, t.vocab_size), _f("features", rows, feat), _f("k_new", *new), _f("v_new", *new)),
            atol=1e-4)
    return specs


class DraftRead(nn.Module):
    def __init__(self, drafter: Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, anchor_token, anchor_pos, win_k, win_v, win_pos, ssm_state=None):
        tokens, logits, conf = self.drafter.draft_read(anchor_token, anchor_pos, win_k, win_v, win_pos, ssm_state)
        return (tokens, logits) if conf is None else (tokens, logits, conf)


class StateCommit(nn.Module):
    def __init__(self, drafter: Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, features, n_valid, ssm_state, conv_state):
        return self.drafter.state_commit(features, n_valid, ssm_state, conv_state)


class WindowShift(nn.Module):
    def __init__(self, drafter: Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, features, positions, n_valid, win_k, win_v, win_pos):
        return self.drafter.window_shift(features, positions, n_valid, win_k, win_v, win_pos)


class TargetStep(nn.Module):
    def __init__(self, target: Target):
        super().__init__()
        self.target = target

    def forward(self, tokens, positions, n_valid, k_cache, v_cache):
        return self.target.step(tokens, positions, n_valid, k_cache, v_cache)


def graph_module(spec: GraphSpec, target: Target, drafter: Drafter) -> nn.Module:
    if spec.model == "target":
        return TargetStep(target).eval()
    return {"draft_read": DraftRead, "state_commit": StateCommit, "window_shift": WindowShift}[spec.name](drafter).eval()


def example_inputs(spec: GraphSpec) -> tuple[torch.Tensor, ...]:
    """Tracing inputs: valid, but deliberately simple (validation uses other inputs)."""
    out = []
    for t in spec.inputs:
        if t.dtype == "int64":
            x = torch.ones(t.shape, dtype=torch.int64)
            if t.name == "win_pos":
                x = torch.arange(t.shape[0], dtype=torch.int64)
        else:
            x = torch.zeros(t.shape)
        out.append(x)
    return tuple(out)
