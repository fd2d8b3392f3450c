"""One interface over the exported graphs: `run(graph, inputs) -> outputs`, numpy in and out.

onnxruntime and ExecuTorch are imported only when their backend is opened.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

BACKENDS = ("onnxruntime", "executorch")


class Graphs:
    name: str

    def run(self, graph: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError


class OrtGraphs(Graphs):
    name = "onnxruntime"

    def __init__(self, folder: Path, manifest: dict, threads: int | None = None):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        # Six sessions take turns, each with its own intra-op pool: a pool whose threads spin after
        # a call steals the cores from the next session's (measured: verify 3x slower on 2 cores).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.inputs = {g: [t["name"] for t in spec["inputs"]] for g, spec in manifest["graphs"].items()}
        self.sessions = {g: ort.InferenceSession(str(folder / spec["onnx"]), opts, providers=["CPUExecutionProvider"])
                         for g, spec in manifest["graphs"].items() if spec.get("onnx")}
        if not self.sessions:
            raise ValueError(f"{folder}: this export has no ONNX graphs; use --backend executorch")

    def run(self, graph, inputs):
        return self.sessions[graph].run(None, dict(zip(self.inputs[graph], inputs)))


class PteGraphs(Graphs):
    name = "executorch"

    def __init__(self, folder: Path, manifest: dict, threads: int | None = None):
        from executorch.runtime import Runtime

        runtime = Runtime.get()
        programs = {}
        self.methods = {}
        for g, spec in manifest["graphs"].items():
            pte = spec.get("pte")
            if not pte:
                continue
            if pte["file"] not in programs:
                programs[pte["file"]] = runtime.load_program(str(folder / pte["file"]))
            self.methods[g] = programs[pte["file"]].load_method(pte["method"])
        if not self.methods:
            raise ValueError(f"{folder}: this export has no .pte programs; use --backend onnxruntime")
        self._programs = programs  # methods need their program alive

    def run(self, graph, inputs):
        import torch

        outs = self.methods[graph].execute([torch.from_numpy(np.ascontiguousarray(x)) for x in inputs])
        return [o.numpy() for o in outs]


def open_graphs(kind: str, folder: Path, manifest: dict, threads: int | None = None) -> Graphs:
    if kind not in BACKENDS:
        raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    return (OrtGraphs if kind == "onnxruntime" else PteGraphs)(Path(folder), manifest, threads)
