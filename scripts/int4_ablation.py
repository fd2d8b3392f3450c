"""Where the int4 drafter's disagreement with fp32 comes from (ONNX MatMulNBits recipes).

Exports the reference HyFlash drafter's three graphs once (fp32, in memory), quantizes them
several ways with onnxruntime's MatMulNBitsQuantizer, and measures draft-token agreement with
fp32 exactly as `hyflash validate` does (same texts, same rounds, graphs in a closed loop), and
the median time of one `draft_read` call (2 threads; all recipes in one run, so the ratios to
fp32 are side by side).

    .venv/bin/python scripts/int4_ablation.py [--max-context 2560] [--out results/int4_ablation.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from hyflash.export.graphs import graph_specs
from hyflash.export.lower import export_onnx_proto
from hyflash.export.quantize import GROUP, vocab_projections
from hyflash.export.validate import agreement_length, agreement_texts, drafter_agreement, text_windows
from hyflash.models.loading import load_target
from hyflash.models.loading import resolve
from hyflash.runtime_py.bench import source_texts
from hyflash.models.loading import drafter_config_dict, load_drafter
from hyflash.runtime_py.backends import ort_session_options

DRAFTER_GRAPHS = ("draft_read", "state_commit", "window_shift")


class Sessions:
    """The `Graphs` interface over in-memory models."""

    name = "onnxruntime"

    def __init__(self, protos: dict, specs: dict):
        import onnxruntime as ort

        opts = ort_session_options(ort, "drafter", 2)  # as the runtime does
        self.sessions = {g: ort.InferenceSession(p.SerializeToString(), opts) for g, p in protos.items()}
        self.inputs = {g: [t.name for t in specs[g].inputs] for g in protos}

    def run(self, graph, inputs):
        return self.sessions[graph].run(None, dict(zip(self.inputs[graph], inputs)))


def nbits(proto, bits: int, symmetric: bool, exclude=(), include=None, level=None):
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(copy.deepcopy(proto), bits=bits, block_size=GROUP, is_symmetric=symmetric,
                             nodes_to_exclude=list(exclude), nodes_to_include=include, accuracy_level=level)
    q.process()
    return q.model.model


def recipe(vocab_bits: int | None, symmetric: bool, vocab_weight, level=None):
    """vocab_bits: 4 (quantized like the rest), 8, or None (left fp32). level: MatMulNBits
    accuracy_level (4: int8 arithmetic)."""
    def apply(proto):
        vocab = vocab_projections(proto, vocab_weight)
        if vocab_bits == 4:
            return nbits(proto, 4, symmetric, level=level)
        proto = nbits(proto, 4, symmetric, exclude=vocab, level=level)
        return nbits(proto, 8, symmetric, include=vocab, level=level) if vocab and vocab_bits == 8 else proto
    return apply


def draft_read_ms(graphs, drafter, max_context: int, calls: int = 300) -> float:
    """Median wall time of one draft_read on a full window and a nonzero state."""
    ctx = {k: v.numpy() for k, v in drafter.init_context(max_context).items()}
    rng = np.random.default_rng(0)
    ctx["win_k"] = rng.standard_normal(ctx["win_k"].shape).astype(np.float32)
    ctx["win_v"] = rng.standard_normal(ctx["win_v"].shape).astype(np.float32)
    ctx["win_pos"] = np.arange(ctx["win_pos"].size, dtype=np.int64)
    inputs = [np.array([5]), np.array([ctx["win_pos"].size]), ctx["win_k"], ctx["win_v"], ctx["win_pos"]]
    if "ssm_state" in ctx:
        inputs.append(rng.standard_normal(ctx["ssm_state"].shape).astype(np.float32) * 0.1)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        graphs.run("draft_read", inputs)
        times.append(time.perf_counter() - t)
    return statistics.median(times[calls // 10:]) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-context", type=int, default=2560)
    p.add_argument("--out", type=Path, default=Path("results/int4_ablation.json"))
    args = p.parse_args()
    logging.disable(logging.INFO)  # the quantizer logs every node
    folder = resolve("reference", "drafter")
    taps = tuple(drafter_config_dict(folder)["hyflash_drafter"]["taps"])
    target = load_target(resolve("reference", "target"), taps)
    drafter = load_drafter(folder, target)
    specs = graph_specs(target, drafter, args.max_context, 64)
    fp32 = {g: export_onnx_proto(specs[g], target, drafter, args.max_context) for g in DRAFTER_GRAPHS}
    vocab_weight = target.lm_head.weight.detach().float().T.contiguous().numpy()
    length = agreement_length(args.max_context)
    texts = {"target-written": agreement_texts(target, args.max_context, 1234),  # validate's seed
             "held-out": text_windows(resolve("reference", "target"), "\n".join(source_texts(None)), length)}
    features = {k: [target(torch.tensor([t]))[1][0].detach() for t in v] for k, v in texts.items()}
    print("| recipe | agreement, target-written text | agreement, held-out text | draft_read ms |\n|---|---|---|---|")
    recipes = {
        "fp32": None,
        "int4 symmetric, vocabulary projection int4": recipe(4, True, vocab_weight),
        "int4 asymmetric, vocabulary projection int4": recipe(4, False, vocab_weight),
        "int4 asymmetric, vocabulary projection int8": recipe(8, False, vocab_weight),
        "int4 asymmetric, vocabulary projection int8, accuracy_level 4": recipe(8, False, vocab_weight, level=4),
        "int4 asymmetric, vocabulary projection fp32 (shipped)": recipe(None, False, vocab_weight),
        "int4 only in state_commit + window_shift": "commit-only",
    }
    report = {}
    for name, fn in recipes.items():
        if fn is None:
            protos = fp32
        elif fn == "commit-only":
            protos = {g: (nbits(p, 4, False) if g != "draft_read" else p) for g, p in fp32.items()}
        else:
            protos = {g: fn(p) for g, p in fp32.items()}
        graphs = Sessions(protos, specs)
        report[name] = {}
        for kind, seqs in texts.items():
            rng = np.random.default_rng(1234)
            agree = total = 0
            for tokens, feats in zip(seqs, features[kind]):
                a, t = drafter_agreement(graphs, drafter, feats, tokens, args.max_context, rng)
                agree, total = agree + a, total + t
            report[name][kind] = agree / total
        report[name]["draft_read_ms"] = draft_read_ms(graphs, drafter, args.max_context)
        print(f"| {name} | {report[name]['target-written']:.1%} | {report[name]['held-out']:.1%} | "
              f"{report[name]['draft_read_ms']:.2f} |", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
