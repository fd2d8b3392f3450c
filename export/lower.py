"""Lowering the declared graphs: ONNX (torch.onnx dynamo) and ExecuTorch (.pte, XNNPACK).

Export workarounds live here, each with the problem it avoids.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import os
import tempfile
import warnings
from pathlib import Path

import torch

from hyflash.export.graphs import GraphSpec, example_inputs, graph_module, onnx_cache_specs
from hyflash.export.onnx_ops import TRANSLATIONS
from hyflash.models.quiet import quiet_loggers

ALIGN = 64  # external-data offsets aligned so onnxruntime can mmap tensors


def trace_onnx(spec: GraphSpec, target, drafter, max_context: int):
    """One graph -> a torch.onnx program with the spec's names and only static dims; its initializers are
    still the models' tensors (nothing copied yet).

    Target graphs get their per-layer cache inputs and outputs (`past_*` -> `present_*`) and
    `hyflash::cache_attention` becomes `com.microsoft.GroupQueryAttention`.
    """
    module = graph_module(spec, target, drafter, "onnx")
    past, present = onnx_cache_specs(target, max_context) if spec.model == "target" else ((), ())
    # onnx_ir warns of an empty attribute list (draft_read's scatter_add), which it then types as it should
    with warnings.catch_warnings(), quiet_loggers("torch.onnx", "onnx_ir"):
        warnings.simplefilter("ignore")
        return torch.onnx.export(module, example_inputs(spec, past), dynamo=True, verbose=False,
                                 input_names=[t.name for t in (*spec.inputs, *past)],
                                 output_names=[t.name for t in (*spec.outputs, *present)],
                                 custom_translation_table=TRANSLATIONS)


def export_onnx_proto(spec: GraphSpec, target, drafter, max_context: int):
    """One graph -> an in-memory onnx.ModelProto (every weight inline: small models only)."""
    return trace_onnx(spec, target, drafter, max_context).model_proto


def export_onnx_graph(spec: GraphSpec, target, drafter, max_context: int, weights: "OnnxWeights", transform) -> str:
    """One graph -> `weights`' folder, its weights never all in memory beside the models' own: the traced
    initializers stream into a scratch file one at a time, `transform(proto)` (the quantization passes)
    runs on a proto that refers to them there, reading a tensor when it needs it, and `weights.save` moves
    what is left into the shared weights file. The passes run with the scratch folder as the current
    directory: onnxruntime's quantizers read external tensors relative to it. -> relative path."""
    import onnx
    import onnx_ir as ir

    program = trace_onnx(spec, target, drafter, max_context)
    cwd = os.getcwd()  # (contextlib.chdir is Python 3.11+)
    with tempfile.TemporaryDirectory(prefix=".scratch-", dir=weights.folder.parent) as scratch:
        os.chdir(scratch)
        try:
            # tensors of 1 KiB or more go to the file, as OnnxWeights stores them
            ir.save(program.model, "graph.onnx", external_data="graph.data", size_threshold_bytes=1023)
            del program
            return weights.save(spec.name, transform(onnx.load("graph.onnx", load_external_data=False)))
        finally:
            os.chdir(cwd)


class OnnxWeights:
    """The ONE external-data file every ONNX graph of an export refers to, target's and drafter's alike.

    Each initializer of 1 KiB or more is stored once, deduplicated by content: a target's weights are not
    written three times (its three graphs carry the same ones), and the drafter's view of the target's
    embedding and LM head costs nothing. Each graph is written to disk as soon as it is added. A tensor
    another file holds (external data relative to the current directory: export_onnx_graph's scratch
    file) is read from there, one at a time.
    """

    def __init__(self, folder: Path, name: str = "model.weights"):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.name = folder.resolve(), name  # absolute: graphs are saved from a scratch folder
        self.blob = open(folder / name, "wb")
        self.offsets: dict[str, tuple[int, int]] = {}

    def save(self, graph: str, proto) -> str:
        """Write `proto` to folder/<graph>.onnx, its large initializers into the shared file. -> relative path."""
        from onnx import TensorProto, numpy_helper, save_model
        from onnx.external_data_helper import set_external_data

        for tensor in proto.graph.initializer:
            external = tensor.data_location == TensorProto.EXTERNAL
            if external and {e.key: e.value for e in tensor.external_data}["location"] == self.name:
                continue  # already here
            if external or not tensor.HasField("raw_data"):
                tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
            raw = tensor.raw_data
            if len(raw) < 1024:
                continue  # small constants stay inline
            key = hashlib.sha256(raw).hexdigest()
            if key not in self.offsets:
                self.blob.write(b"\0" * ((-self.blob.tell()) % ALIGN))
                self.offsets[key] = (self.blob.tell(), len(raw))
                self.blob.write(raw)
            set_external_data(tensor, self.name, *self.offsets[key])
            tensor.ClearField("raw_data")
        self.blob.flush()
        save_model(proto, self.folder / f"{graph}.onnx")
        return f"{self.folder.name}/{graph}.onnx"

    def close(self) -> None:
        self.blob.close()


def splits_as_slices(program):
    """In place: every split of a tensor into pieces (`split_with_sizes`, `chunk`) becomes one slice per piece.
    XNNPACK has no split, so ExecuTorch ran each in its portable kernels between two XNNPACK partitions (the
    fused QKV and gate/up projections of every layer, in every call); a slice joins its producer's partition.
    The same values (a piece is a slice). On onnxruntime the split stays (its Slice nodes ran no faster)."""
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (torch.ops.aten.split_with_sizes.default,
                                                              torch.ops.aten.chunk.default):
            continue
        if any(user.target is not operator.getitem for user in node.users):
            continue  # the pieces used as a list: left as it is
        x, dim = node.args[0], (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0))
        sizes = [piece.shape[dim] for piece in node.meta["val"]]
        starts = [0, *itertools.accumulate(sizes)]
        for user in list(node.users):
            i = user.args[1]
            with graph.inserting_before(user):
                piece = graph.call_function(torch.ops.aten.slice.Tensor, (x, dim, starts[i], starts[i] + sizes[i]))
            piece.meta = dict(user.meta)
            user.replace_all_uses_with(piece)
            graph.erase_node(user)
        graph.erase_node(node)
    graph.lint()
    program.graph_module.recompile()
    return program


def pte_drafter(drafter, quantize):
    """The drafter the .pte's methods are traced from: a draft vocabulary's head materialized, so the graph
    holds it as one constant weight (a static XNNPACK weight; without this its rows are gathered from the LM
    head and multiplied outside XNNPACK on every call: 32 ms of draft_read on SmolLM2's fp32 .pte, 6 ms
    with it), then quantized by quantize(module, "drafter") as before (the head stays out of the drafter's
    weight quantization). Numerically the same head."""
    drafter.materialize_head()
    return quantize(drafter, "drafter")


def export_pte(specs: list[GraphSpec], target, drafter, path: Path, max_context: int, pte_kernels: str = "executorch",
               quantize=None, fuse_quantized: bool = False) -> None:
    """Graphs -> one .pte whose methods are the graphs, lowered to XNNPACK. quantize(module, model) -> the
    module to trace ("target" or "drafter"). pte_kernels: the build of the cache kernels the program is made
    exact with (`graphs.TargetPte`).

    The target's methods are traced from ONE module, so their cache buffers have the same names
    and `share_mutable_buffers` gives the three methods one cache. One program for both models: ExecuTorch
    stores each constant and each XNNPACK weight once per program (by content), so the drafter's view of
    the target's embedding and LM head costs nothing. fuse_quantized: torchao's quantized embeddings become
    ExecuTorch's quantized embedding kernels (quant fusion).
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    # registers llama::update_cache / llama::custom_sdpa (the target's cache kernels) with torch
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401

    quantize = quantize or (lambda m, _: m)
    programs = {}
    target_module = quantized_drafter = None  # each model quantized once, its methods traced from it
    for spec in specs:
        if spec.model == "target":
            target_module = target_module or quantize(
                graph_module(spec, target, drafter, "pte", max_context, pte_kernels), "target")
            module = target_module
        else:
            quantized_drafter = quantized_drafter or pte_drafter(drafter, quantize)
            module = graph_module(spec, target, quantized_drafter)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            programs[spec.name] = splits_as_slices(torch.export.export(module, example_inputs(spec), strict=False))
    with quiet_loggers("executorch"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Inputs are not memory-planned: by default ExecuTorch copies every planned input into its
        # arena on each call; unplanned inputs are read where the caller keeps them.
        # share_mutable_buffers: the target's methods read and write one cache (without it each
        # method has its own copy, and verify would not see what prefill wrote).
        config = ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(
            alloc_graph_input=False, share_mutable_buffers=True), emit_mutable_buffer_names=True,
            do_quant_fusion_and_const_prop=fuse_quantized)
        program = to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()]).to_executorch(config)
    path.write_bytes(program.buffer)
