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
  cannot write into a caller's buffer). The target's cache lives in `target.pte`'s mutable buffers.
- eager (`eager.py`): the models' own run-time functions (`Target.step`, `Drafter.draft_read`,
  ...) on `torch.from_numpy` views; the reference the exported graphs are checked against.

onnxruntime and ExecuTorch are imported only when their backend is opened.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from hyflash.runtime_py.manifest import Contract
from hyflash.runtime_py.state import TargetCache

BACKENDS = ("onnxruntime", "executorch", "eager")


class Call:
    """One graph with its arrays bound: fill `inputs` in place, `run()`, read `outputs`."""

    def __init__(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], run: Callable[[], None]):
        self.inputs, self.outputs, self.run = inputs, outputs, run


class Backend:
    name: str
    host_cache = True  # False: the target's cache lives inside the program, not in a TargetCache array

    def bind(self, graph: str, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray],
             cache: TargetCache | None) -> Call:
        raise NotImplementedError


class OrtBackend(Backend):
    name = "onnxruntime"

    def __init__(self, folder: Path, contract: Contract, threads: int | None = None):
        import onnxruntime as ort

        self.ort = ort
        self.contract = contract
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        # Six sessions take turns, each with its own intra-op pool: a pool whose threads spin after
        # a call steals the cores from the next session's (measured: verify 3x slower on 2 cores).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.sessions = {g: ort.InferenceSession(str(folder / spec["onnx"]), opts, providers=["CPUExecutionProvider"])
                         for g, spec in contract.graphs.items() if spec.get("onnx")}
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
        call = Call(inputs, outputs, lambda: session.run_with_iobinding(io))
        call.held = held
        return call


class PteBackend(Backend):
    name = "executorch"
    host_cache = False

    def __init__(self, folder: Path, contract: Contract, threads: int | None = None):
        from executorch.runtime import Runtime

        if contract.cache["pte"]["kernels"]:
            # the target's cache kernels (llama::update_cache, llama::custom_sdpa) for the Python runtime
            from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
        self.contract = contract
        runtime = Runtime.get()
        programs, self.methods = {}, {}
        for g, spec in contract.graphs.items():
            pte = spec.get("pte")
            if not pte:
                continue
            if pte["file"] not in programs:
                programs[pte["file"]] = runtime.load_program(str(folder / pte["file"]))
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
    "No temp allocator provided" on every call (then allocates for itself; results are exact).
    File descriptor 2 goes to a scratch file during the call; any other line is passed on."""

    NOISE = b"No temp allocator provided"

    def __init__(self):
        self.scratch = tempfile.TemporaryFile()

    def __enter__(self):
        self.saved = os.dup(2)
        self.scratch.seek(0)
        self.scratch.truncate()
        os.dup2(self.scratch.fileno(), 2)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        if self.scratch.tell():
            self.scratch.seek(0)
            for line in self.scratch.read().splitlines(keepends=True):
                if self.NOISE not in line:
                    os.write(2, line)


def open_backend(kind: str, folder: Path, contract: Contract, threads: int | None = None,
                 target: str | Path | None = None) -> Backend:
    if kind not in BACKENDS:
        raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    if kind == "eager":  # torch and the models, loaded only when asked for
        from hyflash.runtime_py.eager import EagerBackend

        return EagerBackend.open(folder, contract, threads, target)
    return (OrtBackend if kind == "onnxruntime" else PteBackend)(Path(folder), contract, threads)
