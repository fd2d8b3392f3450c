"""Quantization with the libraries that do it: onnxruntime's quantizers and torchao.

- drafter `int8`: ONNX dynamic int8 (MatMulInteger); `.pte` 8da8w (int8 weights, per-token int8
  activations), through torchao and XNNPACK.
- drafter `int4`: ONNX MatMulNBits (int4 weights group-wise, asymmetric; int8 compute with each row's
  activations quantized per block, accuracy_level 4); `.pte` 8da4w.
- target `int4`: ONNX MatMulNBits with fp32 compute (accuracy_level 0: verifying 8 rows must give each
  row what decoding it alone would, to fp32's rounding: ACCURACY; a target's quantized vocabulary tables
  compute in fp32 too), or with `--target-compute int8` int8 compute (accuracy_level 4) and single-token
  steps through the two-row verify graph (TARGET_COMPUTE); `.pte` 8da4w (per-token activation quantization,
  which turns any rounding difference between a verify row and its decode step into a quantization step:
  the `.pte` verify rows attend as their decode steps do, bit for bit, export.graphs.TargetPte).
  Dynamic int8 has per-tensor activation scales that couple rows: never used for the target.

In `int4` the vocabulary projection (hidden -> vocab, the largest matmul, whose error lands on
the logits directly) stays fp32, in both formats and both models. Measured on the reference
drafter (on format 1; draft-token agreement with fp32 on onnxruntime, target-
written / held-out text): 86.8% / 86.1% with a 4-bit projection, 91.7% / 91.4% with it fp32;
an 8-bit projection agrees as well but makes `draft_read` 1.8x slower than fp32 (MatMulNBits
at 8 bits has no fast weight-only kernel here).

`--quantize-embeddings int8|int4` quantizes the vocabulary tables of both models on top of that
(the embedding, the LM head, the drafter's Markov tables), group 32, symmetric: ONNX
GatherBlockQuantized / MatMulNBits, with a tied embedding and LM head (and the drafter's view of
the target's) stored once; `.pte` torchao weight-only embeddings (ExecuTorch's quantized embedding
kernels) and 8da8w / 8da4w projections (XNNPACK).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from torch import nn

from hyflash.models.drafter import Drafter
from hyflash.models.target import Target

DRAFTER_MODES = ("none", "int8", "int4")
TARGET_MODES = ("none", "int4")
GROUP = 32  # int4 group size (weights are quantized in groups of 32 input channels)
# MatMulNBits' accuracy_level per model. The drafter's: 4, int8 compute with each row's activations quantized per
# block of K, as onnxruntime-genai builds for CPUs (at Qwen3-0.6B's geometry, `scripts/real_geometry.py`'s dry run,
# busy machine: draft_read 135 -> 57 ms against fp32 compute). The target's: 0, fp32 compute on the dequantized
# weights. The greedy loop gives target-only's tokens only if a verify block's rows are what decoding them one at a
# time gives. onnxruntime's kernels for one row and for several round differently: in fp32 compute by 1e-5 in the
# reference target's logits (an argmax moves only at a near-tie), with int8 compute by 0.035-0.040, and there the
# speculative output parted from target-only's on held-out prompts. The drafter's numbers never reach the output.
# (The target's int8 compute had made its verify 118 -> 56 ms at Qwen3-0.6B's geometry: the price of exactness.)
ACCURACY = {"target": 0, "drafter": 4}
# `--target-compute` -> the int4 target's accuracy_level. int8 is exact only with the step graph it needs: with
# block 32, MatMulNBits at accuracy 4 gives a row the same bits whatever the rows beside it (1 to 64,
# research/int8-verify/matmulnbits_rows.py), and GroupQueryAttention does for 2 rows or more but rounds a lone
# row differently (gqa_rows.py), which int8 activations turn into logit gaps up to 1.3 and 7 of 336 argmaxes
# moved on SmolLM2-135M. A single-token step therefore runs the two-row verify graph (its second row a
# padding the loop never reads; the manifest's target.step_rows): then every verify row equals that step bit for
# bit (336 of 336; research/int8-verify/verify_rows.py). Other CPUs' kernels may differ: validate checks it.
TARGET_COMPUTE = {"fp32": ACCURACY["target"], "int8": 4}


def _accuracy(model: str, accuracy: int | None) -> int:
    return ACCURACY[model] if accuracy is None else accuracy


def quantize_onnx(proto, mode: str, model: str, vocab_weight=None, accuracy: int | None = None):
    """An onnx.ModelProto of `model` ("target" | "drafter") -> its quantized form. Its tensors may be external
    data relative to the current directory (lower.export_onnx_graph); int4 reads them one at a time, int8
    (drafters) loads them. vocab_weight: the vocabulary projection's (hidden, vocab) weight as numpy, which
    int4 leaves fp32. accuracy: MatMulNBits' accuracy_level (default ACCURACY[model])."""
    import onnx

    if mode == "none":
        return proto
    if mode == "int4":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        vocab = vocab_projections(proto, vocab_weight) if vocab_weight is not None else []
        quantizer = MatMulNBitsQuantizer(proto, bits=4, block_size=GROUP, is_symmetric=False,
                                         accuracy_level=_accuracy(model, accuracy),
                                         nodes_to_exclude=vocab + rotations(proto))
        quantizer.process()
        return quantizer.model.model
    if mode == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        onnx.load_external_data_for_model(proto, ".")  # a drafter's weights, into memory
        exclude = rotations(proto)
        with tempfile.TemporaryDirectory() as tmp:  # files with external data: a proto over 2 GB saves too
            src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
            onnx.save_model(proto, src, save_as_external_data=True, location="in.data")
            # reduce_range: 7-bit weights. On x86 CPUs without VNNI (AVX2 only) onnxruntime's u8 x s8 kernel
            # sums pairs of products in 16 bits, which saturates with full-range weights (measured: a test
            # drafter's int8 draft_read agreed 39.5% with eager on an AVX2 machine, the bar being 50%)
            quantize_dynamic(src, dst, op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8,
                             nodes_to_exclude=exclude, use_external_data_format=True, reduce_range=True)
            return onnx.load(dst)
    raise ValueError(f"unknown quantization {mode!r}")


def vocab_projections(proto, *weights) -> list[str]:
    """Names of the MatMul nodes whose constant weight is one of `weights` (same shape, same values)."""
    same = constants_equal_to(proto, weights)
    return [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in same]


def constants_equal_to(proto, arrays) -> dict:
    """name -> initializer, for the graph's constants equal to one of `arrays` (same shape, same values)."""
    import numpy as np
    from onnx import numpy_helper

    found = {}
    for t in proto.graph.initializer:
        same_shape = [a for a in arrays if a.shape == tuple(t.dims)]
        if same_shape:
            w = numpy_helper.to_array(t)
            if any(np.array_equal(w, a) for a in same_shape):
                found[t.name] = t
    return found


def rotations(proto) -> list[str]:
    """MatMul nodes whose constant weight is a signed permutation (every entry 0 or ±1, one nonzero
    per column): RoPE's rotate-half (`models.target.half_turn`), exact in fp32, never quantized
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


def quantize_module(module: nn.Module, mode: str, embeddings: str = "none", in_place: bool = False) -> nn.Module:
    """A copy of `module` (or `module` itself, in_place) with its Linear layers quantized by torchao for
    XNNPACK (8da8w / 8da4w; int4 leaves the LM head fp32), and with `embeddings` != none its vocabulary
    tables (quantize_vocab_module). A copy shares the target's tables a drafter reads: quantizing replaces
    tensors, it never writes into them, so they need not be duplicated (1.2 GB each at 1.7 B)."""
    if mode == "none" and embeddings == "none":
        return module
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    if not in_place:
        shared = {id(t): t for m in module.modules() if isinstance(m, Drafter) for t in (m.embed, m.lm_head)}
        module = copy.deepcopy(module, shared)
    if mode == "int4":
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(GROUP))
        # the group must divide the input size (torchao asserts otherwise): such layers stay fp32
        quantize_(module, config, filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and m.in_features % GROUP == 0
                  and not fqn.endswith("lm_head"))
    elif mode == "int8":
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
        quantize_(module, config, filter_fn=lambda m, _: isinstance(m, nn.Linear))
    elif mode != "none":
        raise ValueError(f"unknown quantization {mode!r}")
    if embeddings != "none":
        quantize_vocab_module(module, embeddings)
    return module


def quantize_vocab_module(module: nn.Module, mode: str) -> None:
    """In place: the vocabulary projections not yet quantized (the target's LM head, the drafter's view of
    it and its Markov head) 8da8w per channel (int8) or 8da4w group 32 (int4) for
    XNNPACK; every nn.Embedding weight-only, group 32, which ExecuTorch's quant fusion turns into
    quantized_decomposed::embedding_byte / embedding_4bit (its quantized kernels library)."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.utils import TorchAOBaseTensor

    tables = set()  # ids of the vocabulary modules
    for m in module.modules():
        if isinstance(m, Drafter):
            m.vocabulary_modules()
            tables |= {id(m.embed_module), id(m.head_module)}
            if m.cfg.markov_rank:
                tables |= {id(m.markov_in), id(m.markov_out)}
        elif isinstance(m, Target):
            tables |= {id(m.embed), id(m.lm_head)}
    dtype = torch.int4 if mode == "int4" else torch.int8
    quantize_(module, Int8DynamicActivationIntxWeightConfig(
        weight_dtype=dtype, weight_granularity=PerGroup(GROUP) if mode == "int4" else PerAxis(0)),
        filter_fn=lambda m, _: isinstance(m, nn.Linear) and id(m) in tables and m.in_features % GROUP == 0
        and not isinstance(m.weight, TorchAOBaseTensor))
    quantize_(module, IntxWeightOnlyConfig(weight_dtype=dtype, granularity=PerGroup(GROUP)),
              filter_fn=lambda m, _: isinstance(m, nn.Embedding) and id(m) in tables and m.embedding_dim % GROUP == 0)


def quantized_op_counts(proto) -> dict[str, int]:
    """How many quantized nodes a graph holds (the tests assert these are really there)."""
    counts: dict[str, int] = {}
    for node in proto.graph.node:
        if node.op_type in ("MatMulNBits", "MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


# ---------------------------------------------------------------- vocabulary tables (--quantize-embeddings)

EMBEDDING_MODES = ("none", "int8", "int4")
DRAFTER_EMBEDDING_MODES = ("drafter-int8", "drafter-int4")  # the drafter's graphs only: the target stays exact
BITS = {"int8": 8, "int4": 4}


def quantize_vocab_onnx(proto, mode: str, tables: list, model: str, accuracy: int | None = None):
    """A graph's vocabulary tables -> `mode` bits, group 32, symmetric (accuracy_level `accuracy`, default
    `model`'s: ACCURACY).
    `tables`: the models' (V, D) tables as numpy (vocabulary_tables), found in the graph by value: a
    MatMul whose constant weight is a table's transpose becomes MatMulNBits (onnxruntime's quantizer), a
    Gather on a table becomes
    com.microsoft.GatherBlockQuantized. Both quantize a table by the same routine, row by row, so a
    lookup tied to a projection (or the drafter's view of the target's) gives the very same bytes and
    `OnnxWeights` stores them once."""
    if mode == "none":
        return proto
    from onnx import helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    bits = BITS[mode]
    _fold_transposes(proto, tables)
    names = set(vocab_projections(proto, *(t.T for t in tables)))
    if names:
        others = [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.name not in names]
        quantizer = MatMulNBitsQuantizer(proto, bits=bits, block_size=GROUP, is_symmetric=True,
                                         accuracy_level=_accuracy(model, accuracy), nodes_to_exclude=others)
        quantizer.process()
        proto = quantizer.model.model
    tabs = constants_equal_to(proto, tables)
    done: dict[str, tuple[str, str]] = {}
    for i, node in enumerate(proto.graph.node):
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        t = tabs.get(node.input[0]) if node.op_type == "Gather" and axis == 0 else None
        if t is None or t.dims[1] % GROUP:
            continue
        if t.name not in done:
            packed, scales = block_quantize(numpy_helper.to_array(t), bits)
            done[t.name] = (f"{t.name}_q{bits}", f"{t.name}_q{bits}_scales")
            proto.graph.initializer.extend([numpy_helper.from_array(packed, done[t.name][0]),
                                            numpy_helper.from_array(scales, done[t.name][1])])
        data, scales = done[t.name]
        proto.graph.node[i].CopyFrom(helper.make_node(
            "GatherBlockQuantized", [data, node.input[1], scales], list(node.output), name=node.name,
            domain="com.microsoft", bits=bits, block_size=GROUP, gather_axis=0, quantize_axis=1))
    if done:
        used = {x for n in proto.graph.node for x in n.input}
        keep = [t for t in proto.graph.initializer if t.name in used]
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(keep)
        if not any(o.domain == "com.microsoft" for o in proto.opset_import):
            proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return proto


def _fold_transposes(proto, tables: list) -> None:
    """Transpose(table) of a constant vocabulary table (a tied LM head, a projection several nodes use)
    -> a constant of its own, so the MatMuls reading it see a constant weight to quantize."""
    from onnx import numpy_helper

    inits = constants_equal_to(proto, tables)
    folded = {}
    for node in list(proto.graph.node):
        t = inits.get(node.input[0]) if node.op_type == "Transpose" else None
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        if t is None or perm != [1, 0]:
            continue
        proto.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(t).T.copy(), f"{t.name}_T"))
        folded[node.output[0]] = f"{t.name}_T"
        proto.graph.node.remove(node)
    for node in proto.graph.node:
        for i, name in enumerate(node.input):
            if name in folded:
                node.input[i] = folded[name]


def block_quantize(table, bits: int):
    """(N, D) fp32 table -> packed (N, D * bits / 8) uint8 and scales (N, D / 32): each row in blocks of 32,
    symmetric (zero point 2^(bits-1), implied), by onnxruntime's MatMulNBits routine on table.T, so the
    bytes are those of the tied projection's MatMulNBits weight."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, DefaultWeightOnlyQuantizer

    quantizer = DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(block_size=GROUP, is_symmetric=True, bits=bits))
    packed, scales, _ = quantizer.qbits_block_quant(table.T.copy())
    return packed.reshape(packed.shape[0], -1), scales
