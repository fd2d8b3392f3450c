"""The eager backend: an export's models run by their own PyTorch run-time functions.

The models are the target folder the manifest records (its files checked against the manifest's
sha256 first, so an export is never judged against a different target) and the drafter the
export carries. `hyflash validate` drives this backend and an exported one through the same
loop and compares every output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hyflash.models.drafter import Drafter
from hyflash.models.loading import load_drafter, load_target
from hyflash.models.target import Target, write_cache
from hyflash.runtime_py.backends import Backend, Call
from hyflash.runtime_py.manifest import ArtifactError, Contract, sha256


def load_models(folder: str | Path, manifest: dict, target_override: str | Path | None = None
                ) -> tuple[Target, Drafter]:
    """(target, drafter) as eager fp32 modules (the drafter folder holds the config it was exported with)."""
    target_dir = Path(target_override or manifest["target"]["path"])
    if not target_dir.is_dir():
        raise FileNotFoundError(f"{target_dir}: the target folder recorded in the manifest is gone; "
                                "pass --target DIR")
    for name, expected in manifest["target"]["files"].items():
        path = target_dir / name
        if not path.is_file() or sha256(path) != expected:
            raise ArtifactError(f"{path}: not the target this export was made from (sha256 differs or file missing)")
    target = load_target(target_dir, tuple(manifest["target"]["taps"]))
    return target, load_drafter(Path(folder) / "drafter", target)


class EagerBackend(Backend):
    """The models' run-time functions in PyTorch: the same loop, the reference arithmetic."""

    name = "eager"

    def __init__(self, contract: Contract, target, drafter, memory_history: int | None = None):
        self.contract, self.target, self.drafter = contract, target, drafter
        if memory_history is not None and (memory_history < 1 or drafter.cfg.memory != "mamba2"):
            raise ValueError(f"memory_history needs a mamba2 drafter and M >= 1; this drafter's memory is "
                             f"{drafter.cfg.memory!r}, M = {memory_history}")
        self.memory_history = memory_history
        self.history: list[torch.Tensor] = []  # memory_history: the committed features, row j at position j

    @classmethod
    def open(cls, folder: str | Path, contract: Contract, threads: int | None = None,
             target: str | Path | None = None, memory_history: int | None = None) -> "EagerBackend":
        if threads:
            torch.set_num_threads(threads)
        return cls(contract, *load_models(folder, contract.manifest, target), memory_history=memory_history)

    @torch.no_grad()
    def limited_state(self, committed: int) -> torch.Tensor:
        """The ablation's memory: the Mamba-2 state after positions 0..committed-1 with only the
        last M contributing, S = sum over t in [committed - M, committed) of exp(cum_{committed-1} - cum_t)
        dt_t x_t B_t^T per layer (the training form's `states_at`), from the kept features. A fixed-size
        state cannot forget, so this is recomputed every round: (L_d, h, P, N)."""
        c = self.drafter.fused(torch.stack(self.history[:committed]))  # (T, d)
        anchor = torch.tensor([committed])
        states = []
        for layer in self.drafter.layers:
            weight, x, b = layer.mem.states_at(c, anchor, self.memory_history)  # (1, T, h), (T, h, P), (T, N)
            states.append(torch.einsum("th,thp,tn->hpn", weight[0], x, b))
        return torch.stack(states)

    def _limited(self, graph: str, fn):
        """memory_history: window_shift also keeps the rows it folds in; draft_read reads `limited_state`
        instead of the folded state (which state_commit still keeps, unread)."""
        if graph == "window_shift":
            def shift(**args):
                pos, n = int(args["positions"][0]), int(args["n_valid"][0])
                del self.history[pos:]  # folding is in position order from 0: a new prompt starts over
                self.history.extend(args["features"][:n].clone())
                return fn(**args)
            return shift
        if graph == "draft_read":
            def read(**args):
                return fn(**{**args, "ssm_state": self.limited_state(int(args["anchor_pos"][0]))})
            return read
        return fn

    def bind(self, graph, inputs, outputs, cache):
        spec = self.contract.graph(graph)
        args = {t["name"]: torch.from_numpy(inputs[t["name"]]) for t in spec["inputs"]}  # fed by name
        targets = [outputs[t["name"]] for t in spec["outputs"]]
        if spec["model"] == "target":
            k_cache, v_cache = (torch.from_numpy(a) for a in cache.stacked())
            rows = torch.tensor([self.contract.width(graph)])  # every row counts as valid

            def fn(tokens, positions):  # every row is written, as the in-place graphs do
                # an fp16 export's cache, read in the models' fp32 (.float() is no copy for fp32)
                logits, features, k_new, v_new = self.target.step(tokens, positions, rows, k_cache.float(),
                                                                   v_cache.float())
                start = int(positions[0])
                write_cache(k_cache, k_new, start, len(tokens))
                write_cache(v_cache, v_new, start, len(tokens))
                return logits, features
        else:
            fn = getattr(self.drafter, graph)
            if self.memory_history is not None:
                fn = self._limited(graph, fn)

        def run():  # fp16 inputs of an fp16 export run in the models' fp32; outputs are copied into fp16
            with torch.no_grad():
                outs = fn(**{n: a.float() if a.is_floating_point() else a for n, a in args.items()})
            for dst, src in zip(targets, [o for o in outs if o is not None]):
                np.copyto(dst, src.numpy())

        return Call(inputs, outputs, run)
