"""Quantization with the libraries that do it: onnxruntime's quantizers and torchao.

- drafter `int8`: ONNX dynamic int8 (MatMulInteger); `.pte` 8da8w (int8 weights, per-token int8
  activations), through torchao and XNNPACK.
- drafter `int4`: ONNX MatMulNBits (weight-only, group-wise, asymmetric: onnxruntime's default);
  `.pte` 8da4w.
- target `int4`: the same two forms. Both keep the rows of a block independent (weight-only, or
  per-token activation scales), so verifying 8 rows gives each row what decoding it alone would.
  Dynamic int8 has per-tensor activation scales that couple rows: never used for the target.

In `int4` the vocabulary projection (hidden -> vocab, the largest matmul, whose error lands on
the logits directly) stays fp32, in both formats and both models. Measured on the reference
drafter by `scripts/int4_ablation.py` (draft-token agreement with fp32 on onnxruntime, target-
written / held-out text): 86.8% / 86.1% with a 4-bit projection, 91.7% / 91.4% with it fp32;
an 8-bit projection agrees as well but makes `draft_read` 1.8x slower than fp32 (MatMulNBits
at 8 bits has no fast weight-only kernel here).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from torch import nn

DRAFTER_MODES = ("none", "int8", "int4")
TARGET_MODES = ("none", "int4")
GROUP = 32  # int4 group size (weights are quantized in groups of 32 input channels)


def quantize_onnx(proto, mode: str, vocab_weight=None):
    """An in-memory onnx.ModelProto -> its quantized form (also in memory). vocab_weight: the
    vocabulary projection's (hidden, vocab) weight as numpy, which int4 leaves fp32."""
    import onnx

    if mode == "none":
        return proto
    if mode == "int4":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        vocab = vocab_projections(proto, vocab_weight) if vocab_weight is not None else []
        quantizer = MatMulNBitsQuantizer(proto, bits=4, block_size=GROUP, is_symmetric=False,
                                         nodes_to_exclude=vocab + rotations(proto))
        quantizer.process()
        return quantizer.model.model
    if mode == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
            onnx.save_model(proto, src)
            quantize_dynamic(src, dst, op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8,
                             nodes_to_exclude=rotations(proto))
            return onnx.load(dst)
    raise ValueError(f"unknown quantization {mode!r}")


def vocab_projections(proto, weight) -> list[str]:
    """Names of the MatMul nodes whose constant weight is `weight` (same shape, same values)."""
    import numpy as np
    from onnx import numpy_helper

    same = {t.name for t in proto.graph.initializer
            if tuple(t.dims) == weight.shape and np.array_equal(numpy_helper.to_array(t), weight)}
    return [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in same]


def rotations(proto) -> list[str]:
    """MatMul nodes whose constant weight is a signed permutation (every entry 0 or ±1, one nonzero
    per column): RoPE's rotate-half (`models.target._half_turn`), exact in fp32, never quantized
    (dynamic int8 would round the activations it rotates; MatMulNBits would only add a kernel)."""
    import numpy as np
    from onnx import numpy_helper

    turns = set()
    for t in proto.graph.initializer:
        if len(t.dims) == 2 and t.dims[0] == t.dims[1] and t.dims[0] <= 1024:
            w = numpy_helper.to_array(t)
            if np.isin(w, (-1.0, 0.0, 1.0)).all() and (np.abs(w).sum(0) == 1).all():
                turns.add(t.name)
    return [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in turns]


def quantize_module(module: nn.Module, mode: str) -> nn.Module:
    """A copy of `module` with its Linear layers quantized by torchao for XNNPACK (8da8w / 8da4w)."""
    if mode == "none":
        return module
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    import torch

    module = copy.deepcopy(module)
    if mode == "int4":
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig

        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(GROUP))
        # the group must divide the input size (torchao asserts otherwise): such layers stay fp32
        quantize_(module, config, filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and m.in_features % GROUP == 0
                  and not fqn.endswith("lm_head"))
    elif mode == "int8":
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig

        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
        quantize_(module, config, filter_fn=lambda m, _: isinstance(m, nn.Linear))
    else:
        raise ValueError(f"unknown quantization {mode!r}")
    return module


def quantized_op_counts(proto) -> dict[str, int]:
    """How many quantized nodes a graph holds (the tests assert these are really there)."""
    counts: dict[str, int] = {}
    for node in proto.graph.node:
        if node.op_type in ("MatMulNBits", "MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
