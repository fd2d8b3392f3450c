"""Graph calls bound once and fed by name, on onnxruntime, ExecuTorch, or eager PyTorch.

`Backend.bind(graph, inputs, outputs, cache)` takes numpy arrays keyed by the contract's names
and returns a `Call`: the caller writes into `call.inputs[...]` in place, calls `run()`, and
reads `call.outputs[...]`. Nothing is allocated per call where the runtime allows it:

- onnxruntime: every input and output is an `OrtValue` over the caller's array (zero-copy),
  bound once through IOBinding; the target's `present_*` outputs are bound to the very
  `OrtValue`s given as `past_*`, so GroupQueryAttention writes the new rows in place.
- ExecuTorch: inputs are `torch.from_numpy` views made once (the programs are exported with
  unplanned inputs, so the method reads them where they are); the Python runtime copies each
  output out of its arena on every call, and `run` copies it again into the bound array (its API
  cannot write into a caller's buffer). The target's cache lives in `model.pte`'s mutable buffers.
- eager (`eager.py`): the models' own run-time functions (`Target.step`, `Drafter.draft_read`,
  ...) on `torch.from_numpy` views; the reference the exported graphs are checked against.

onnxruntime and ExecuTorch are imported only when their backend is opened.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from hyflash.models.quiet import quiet_loggers
from hyflash.runtime_py import ptekernels
from hyflash.runtime_py.manifest import ArtifactError, Contract, pte_verify_attention
from hyflash.runtime_py.state import TargetCache

BACKENDS = ("onnxruntime", "executorch", "eager")


class Call:
    """One graph with its arrays bound: fill `inputs` in place, `run()`, read `outputs`."""

    def __init__(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], run: Callable[[], None],
                 held: tuple = ()):
        self.inputs, self.outputs, self.run = inputs, outputs, run
        self.held = held  # what the backend's binding refers to and must outlive it (onnxruntime's OrtValues)


class Backend:
    name: str
    host_cache = True  # False: the target's cache lives inside the program, not in a TargetCache array
    kernels: str | None = None  # ExecuTorch programs: whose build of the cache kernels runs (`ptekernels`)
    threads: int | None = None  # ExecuTorch programs: the size of its thread pool

    def bind(self, graph: str, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray],
             cache: TargetCache | None) -> Call:
        raise NotImplementedError


class OrtBackend(Backend):
    name = "onnxruntime"

    def __init__(self, folder: Path, contract: Contract, threads: int | None = None):
        import onnxruntime as ort

        self.ort = ort
        self.contract = contract
        self.sessions = {}
        for g, spec in contract.graphs.items():
            if not spec.get("onnx"):
                continue
            opts = ort_session_options(ort, threads)
            session = ort.InferenceSession(str(folder / spec["onnx"]), opts, providers=["CPUExecutionProvider"])
            declared = _declared_io(contract, g, onnx_cache=True)
            for kind, actual in (("inputs", session.get_inputs()), ("outputs", session.get_outputs())):
                check_io(f"{folder / spec['onnx']}", kind, declared[kind],
                         [(v.name, ORT_TYPES.get(v.type, v.type), list(v.shape)) for v in actual])
            self.sessions[g] = session
        if not self.sessions:
            raise ValueError(f"{folder}: this export has no ONNX graphs; use --backend executorch")

    def bind(self, graph, inputs, outputs, cache):
        value = self.ort.OrtValue.ortvalue_from_numpy  # zero-copy over a contiguous numpy array
        io = self.sessions[graph].io_binding()
        held = []  # the OrtValues must outlive the binding
        for name, arr in inputs.items():
            held.append(value(arr))
            io.bind_ortvalue_input(name, held[-1])
        for name, arr in outputs.items():
            held.append(value(arr))
            io.bind_ortvalue_output(name, held[-1])
        if cache is not None:
            past, present = self.contract.onnx_cache_io()
            buffers = [b for i in range(cache.layers) for b in cache.layer(i)]
            for p_in, p_out, buf in zip(past, present, buffers):
                held.append(value(buf))
                io.bind_ortvalue_input(p_in, held[-1])
                io.bind_ortvalue_output(p_out, held[-1])  # the same buffer: rows written in place
        session = self.sessions[graph]
        return Call(inputs, outputs, lambda: session.run_with_iobinding(io), tuple(held))


def ort_session_options(ort, threads: int | None):
    """The options of every graph's session, target's and drafter's alike. The graphs are many small
    nodes, so a pool that sleeps after each task pays a wake-up on every one; a pool that keeps spinning
    after its call returns steals the cores from the next session's (the six sessions take turns: every
    drafter ran at 0.3x). So every pool spins while its call runs and stops when it returns
    (`session.force_spinning_stop`). Measured against pools that sleep, in one process on held-out
    prompts (research/scripts/ort_threading_ab.py, research/results/ort_threading_ab.json)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    return opts


ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64"}
PTE_TYPES = {6: "float32", 5: "float16", 4: "int64"}  # ExecuTorch ScalarType codes


def _declared_io(contract: Contract, graph: str, onnx_cache: bool) -> dict[str, list[tuple]]:
    """(name, dtype, shape) of a graph's inputs and outputs as the manifest declares them; the ONNX
    target graphs also take and give the cache, layer by layer."""
    spec = contract.graph(graph)
    io = {kind: [(t["name"], t["dtype"], list(t["shape"])) for t in spec[kind]] for kind in ("inputs", "outputs")}
    if onnx_cache and spec["model"] == "target":
        cache = contract.cache
        past, present = contract.onnx_cache_io()
        io["inputs"] += [(n, cache["dtype"], list(cache["onnx"]["shape"])) for n in past]
        io["outputs"] += [(n, cache["dtype"], list(cache["onnx"]["shape"])) for n in present]
    return io


def check_io(where: str, kind: str, declared: list[tuple], actual: list[tuple]) -> None:
    """The graph's own inputs or outputs must be the manifest's, in order: names (where the format
    keeps them), dtypes, shapes. One line naming the tensor and both values otherwise."""
    if len(declared) != len(actual):
        raise ArtifactError(f"{where}: the manifest declares {len(declared)} {kind}, the graph has {len(actual)}; "
                            "re-export")
    for i, ((name, dtype, shape), (a_name, a_dtype, a_shape)) in enumerate(zip(declared, actual)):
        for field, mine, theirs in (("name", name, a_name), ("dtype", dtype, a_dtype), ("shape", shape, a_shape)):
            if theirs is not None and mine != theirs:
                raise ArtifactError(f"{where}: {kind[:-1]} {i} ({name}) has {field} {mine!r} in the manifest but "
                                    f"{theirs!r} in the graph; re-export")


def _load_global(library: str) -> None:
    """One of the ExecuTorch wheel's C++ libraries (lib/), its symbols global to the process."""
    import ctypes

    import executorch

    ctypes.CDLL(str(Path(list(executorch.__path__)[0]) / "lib" / library), mode=ctypes.RTLD_GLOBAL)


def load_quantized_kernels() -> None:
    """ExecuTorch's quantized kernels (quantized_decomposed::embedding_byte / embedding_4bit, which
    --quantize-embeddings programs call) into the Python runtime: the wheel ships them as a library of
    the C++ runtime the Python bindings share, which registers them when loaded."""
    _load_global("libexecutorch_kernels_quantized.so")


def load_executorch_blas() -> None:
    """ExecuTorch's `custom_sdpa` multiplies through an external `sgemm_`. An app linking ExecuTorch's LLM
    kernels resolves it to ExecuTorch's own BLAS (in libexecutorch_kernels_optimized.so); in this process the
    wheel's kernel library would resolve it to torch's MKL, whose last bits differ (enough to move greedy
    tokens on an 8da4w target). Making the optimized kernels library global first gives the apps' BLAS."""
    _load_global("libexecutorch_kernels_optimized.so")


class PteBackend(Backend):
    name = "executorch"
    host_cache = False

    def __init__(self, folder: Path, contract: Contract, threads: int | None = None):
        self.contract = contract
        # import-time notices (torchao's optional CUDA extensions, torch's pytree), ExecuTorch's CPU probe
        with _StderrFilter(), quiet_loggers("torchao", "torch.utils._pytree"):
            from executorch.runtime import Runtime

            has_pte = any(spec.get("pte") for spec in contract.graphs.values())
            if contract.cache["pte"]["kernels"] and has_pte:  # an ONNX-only export is refused below, as such
                # the target's cache kernels (llama::update_cache, llama::custom_sdpa): the project's build where
                # chosen (float32 programs), else ExecuTorch's; only that one is loaded here, so a program
                # the chosen build does not cover fails to load rather than run the other
                if ptekernels.chosen() == "hyflash" and contract.cache["dtype"] == "float32":
                    ptekernels.load()
                    self.kernels = "hyflash"
                else:
                    if pte_verify_attention(contract.cache) == "block":  # its rows are decode steps with ours only
                        raise ValueError(f"{folder}: this program's verify blocks attend in one call, exact only with "
                                         "the project's cache kernels; run it with --pte-kernels hyflash, or "
                                         "re-export with --pte-kernels executorch")
                    load_executorch_blas()
                    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401

                    self.kernels = "executorch"
            self.threads = ptekernels.set_threads(threads)
            if contract.manifest["quantization"].get("pte_kernels"):
                load_quantized_kernels()
            runtime = Runtime.get()
            programs, self.methods = {}, {}
            for g, spec in contract.graphs.items():
                pte = spec.get("pte")
                if not pte:
                    continue
                if pte["file"] not in programs:
                    programs[pte["file"]] = runtime.load_program(str(folder / pte["file"]))
                meta = programs[pte["file"]].metadata(pte["method"])
                declared = _declared_io(contract, g, onnx_cache=False)
                for kind, n, tensor in (("inputs", meta.num_inputs(), meta.input_tensor_meta),
                                        ("outputs", meta.num_outputs(), meta.output_tensor_meta)):
                    metas = [tensor(i) for i in range(n)]
                    check_io(f"{folder / pte['file']} method {pte['method']}", kind, declared[kind],
                             [(None, PTE_TYPES.get(int(t.dtype()), t.dtype()), list(t.sizes())) for t in metas])
                # one Program: the target's methods share its mutable buffers (the cache)
                self.methods[g] = programs[pte["file"]].load_method(pte["method"])
        if not self.methods:
            raise ValueError(f"{folder}: this export has no .pte programs; use --backend onnxruntime")
        self._programs = programs  # methods need their program alive
        self._quiet = _StderrFilter()

    def bind(self, graph, inputs, outputs, cache):
        import torch

        spec = self.contract.graph(graph)
        args = [torch.from_numpy(inputs[t["name"]]) for t in spec["inputs"]]
        targets = [outputs[t["name"]] for t in spec["outputs"]]
        method = self.methods[graph]
        quiet = self._quiet if spec["model"] == "target" else None

        def run():
            if quiet is not None:
                with quiet:
                    outs = method.execute(args)
            else:
                outs = method.execute(args)
            for dst, src in zip(targets, outs):
                np.copyto(dst, src.numpy())

        return Call(inputs, outputs, run)


class _StderrFilter:
    """ExecuTorch's Python runtime gives kernels no temp allocator, so `llama::custom_sdpa` logs
    "No temp allocator provided" on every call (then allocates for itself; results are exact), and its
    CPU probe logs what it reads when the runtime starts ("[cpuinfo_utils.cpp:...]").
    File descriptor 2 goes to a scratch file during the call; any other line is passed on."""

    NOISE = (b"No temp allocator provided", b"[cpuinfo_utils.cpp:")
    # fd 2 is the process's: runtimes in several threads swap it once, under one lock, for all of them
    _lock = threading.Lock()
    _users = 0
    _saved = -1
    _scratch = None

    def __enter__(self):
        cls = type(self)
        with cls._lock:
            if cls._users == 0:
                cls._scratch = cls._scratch or tempfile.TemporaryFile()
                cls._scratch.seek(0)
                cls._scratch.truncate()
                cls._saved = os.dup(2)
                os.dup2(cls._scratch.fileno(), 2)
            cls._users += 1

    def __exit__(self, *exc):
        cls = type(self)
        with cls._lock:
            cls._users -= 1
            if cls._users:
                return
            os.dup2(cls._saved, 2)
            os.close(cls._saved)
            size = os.fstat(cls._scratch.fileno()).st_size
            if size:
                cls._scratch.seek(0)
                for line in cls._scratch.read(size).splitlines(keepends=True):
                    if not any(noise in line for noise in self.NOISE):
                        os.write(2, line)


def open_backend(kind: str, folder: Path, contract: Contract, threads: int | None = None,
                 target: str | Path | None = None, memory_history: int | None = None) -> Backend:
    if kind not in BACKENDS:
        raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    if memory_history is not None and kind != "eager":
        raise ValueError("memory_history (the history-limited ablation) runs on the eager backend only: an "
                         "exported fixed-size state cannot forget; use --backend eager")
    if kind == "eager":  # torch and the models, loaded only when asked for
        from hyflash.runtime_py.eager import EagerBackend

        return EagerBackend.open(folder, contract, threads, target, memory_history)
    return (OrtBackend if kind == "onnxruntime" else PteBackend)(Path(folder), contract, threads)
