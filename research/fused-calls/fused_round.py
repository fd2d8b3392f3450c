"""Fewer drafter calls a round: what folding `state_commit`, `window_shift` and the next `draft_read` into one
graph would save on onnxruntime, on an otherwise idle machine.

After a verify the runtime makes three drafter calls: `state_commit` (the memory takes the accepted rows),
`window_shift` (the window takes them) and `draft_read` (the next block). Three layouts of the same work are
traced here from the same drafter, the same way (torch.onnx dynamo, fp32, opset of the export):

  3 calls  state_commit, window_shift, draft_read   (the contract)
  2 calls  commit_shift (both updates), draft_read
  1 call   round (both updates, then the read of the updated state)

and run for ROUNDS rounds of random accepted rows (1-8 valid) through onnxruntime with THREADS threads and
the runtime's session options (a pool left spinning after its call steals the next session's cores), numpy
buffers passed between calls as a runtime passes them. The outputs of every layout are compared with
the three-call layout's (draft tokens equal or not, the largest logit and confidence gaps), then each layout is
timed in interleaved repeats (median ms a round).

  .venv/bin/python research/fused-calls/fused_round.py --drafter smollm2-135m-instruct \
      --target smollm2-135m-instruct --out research/fused-calls/results/fused_round_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hyflash.export.graphs import DrafterGraph, graph_specs
from hyflash.export.pipeline import load_models
from hyflash.models.loading import resolve
from hyflash.runtime_py.backends import ort_session_options


class Updates(nn.Module):
    """state_commit then window_shift, one graph."""

    def __init__(self, drafter):
        super().__init__()
        self.d = drafter

    def forward(self, features, positions, n_valid, ssm_state, conv_state, win_k, win_v, win_pos):
        ssm, conv = self.d.state_commit(features, n_valid, ssm_state, conv_state)
        return (ssm, conv, *self.d.window_shift(features, positions, n_valid, win_k, win_v, win_pos))


class Round(nn.Module):
    """Both updates, then draft_read of the state they leave: one graph a round."""

    def __init__(self, drafter):
        super().__init__()
        self.d = drafter

    def forward(self, features, positions, n_valid, ssm_state, conv_state, win_k, win_v, win_pos,
                anchor_token, anchor_pos):
        ssm, conv = self.d.state_commit(features, n_valid, ssm_state, conv_state)
        wk, wv, wp = self.d.window_shift(features, positions, n_valid, win_k, win_v, win_pos)
        tokens, logits, conf = self.d.draft_read(anchor_token, anchor_pos, wk, wv, wp, ssm)
        return ssm, conv, wk, wv, wp, tokens, logits, conf


def to_onnx(module, example: dict, outputs: list[str], path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, tuple(torch.from_numpy(v) for v in example.values()), dynamo=True,
                                    verbose=False, input_names=list(example), output_names=outputs)
    program.save(str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="smollm2-135m-instruct")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import onnxruntime as ort

    torch.manual_seed(0)
    target, drafter = load_models(resolve(args.target, "target"), args.drafter, None, 0)
    drafter.eval()
    specs = graph_specs(target, drafter, args.max_context, 64)
    names = {g: [t.name for t in specs[g].inputs] for g in ("state_commit", "window_shift", "draft_read")}
    outs = {g: [t.name for t in specs[g].outputs] for g in names}
    rng = np.random.default_rng(0)
    shapes = {t.name: (t.shape, t.dtype) for g in names for t in specs[g].inputs}

    def zeros(name):
        shape, dtype = shapes[name]
        return np.zeros(shape, np.float32 if dtype.startswith("float") else np.int64)

    example = {n: zeros(n) for n in shapes}
    example["win_pos"][:] = -1
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for g in names:
            to_onnx(DrafterGraph(drafter, specs[g]), {n: example[n] for n in names[g]}, outs[g], tmp / f"{g}.onnx")
        upd_in = ["features", "positions", "n_valid", "ssm_state", "conv_state", "win_k", "win_v", "win_pos"]
        upd_out = ["ssm_state_out", "conv_state_out", "win_k_out", "win_v_out", "win_pos_out"]
        to_onnx(Updates(drafter), {n: example[n] for n in upd_in}, upd_out, tmp / "commit_shift.onnx")
        to_onnx(Round(drafter), {n: example[n] for n in upd_in + ["anchor_token", "anchor_pos"]},
                upd_out + outs["draft_read"], tmp / "round.onnx")
        opts = ort_session_options(ort, args.threads)  # the runtime's own: pools stop spinning after a call
        sess = {p.stem: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
                for p in sorted(tmp.glob("*.onnx"))}

    feat = shapes["features"][0]
    rounds = [(rng.standard_normal(feat).astype(np.float32), int(rng.integers(1, feat[0] + 1)),
               int(rng.integers(0, target.cfg.vocab_size))) for _ in range(args.rounds)]

    def run(layout: str) -> tuple[list, float]:
        st = {n: zeros(n) for n in ("ssm_state", "conv_state", "win_k", "win_v", "win_pos")}
        st["win_pos"][:] = -1
        pos, drafts = 0, []
        t0 = time.perf_counter()
        for features, n, anchor in rounds:
            io = {"features": features, "n_valid": np.array([n]), "positions": np.arange(pos, pos + feat[0]),
                  "anchor_token": np.array([anchor]), "anchor_pos": np.array([pos + n]), **st}
            pos += n
            if layout == "3 calls":
                st["ssm_state"], st["conv_state"] = sess["state_commit"].run(None, {k: io[k] for k in names["state_commit"]})
                st["win_k"], st["win_v"], st["win_pos"] = sess["window_shift"].run(
                    None, {k: io[k] for k in names["window_shift"]})
                read = sess["draft_read"].run(None, {k: ({**io, **st})[k] for k in names["draft_read"]})
            elif layout == "2 calls":
                (st["ssm_state"], st["conv_state"], st["win_k"], st["win_v"],
                 st["win_pos"]) = sess["commit_shift"].run(None, {k: io[k] for k in upd_in})
                read = sess["draft_read"].run(None, {k: ({**io, **st})[k] for k in names["draft_read"]})
            else:
                o = sess["round"].run(None, {k: io[k] for k in upd_in + ["anchor_token", "anchor_pos"]})
                (st["ssm_state"], st["conv_state"], st["win_k"], st["win_v"], st["win_pos"]), read = o[:5], o[5:]
            drafts.append([np.array(x) for x in read])
        return drafts, (time.perf_counter() - t0) * 1000 / len(rounds)

    layouts = ["3 calls", "2 calls", "1 call"]
    ref, _ = run("3 calls")
    parity = {}
    for layout in layouts[1:]:
        got, _ = run(layout)
        parity[layout] = {
            "draft_tokens_equal": all(np.array_equal(a[0], b[0]) for a, b in zip(ref, got)),
            "max_logit_gap": float(max(np.abs(a[1] - b[1]).max() for a, b in zip(ref, got))),
            "max_confidence_gap": float(max(np.abs(a[2] - b[2]).max() for a, b in zip(ref, got)))}
    times = {layout: [] for layout in layouts}
    for _ in range(args.repeats):  # interleaved, so drift in the machine's speed reaches every layout alike
        for layout in layouts:
            times[layout].append(run(layout)[1])
    ms = {layout: statistics.median(v) for layout, v in times.items()}
    report = {"drafter": str(args.drafter), "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats,
              "ms_per_round_median": ms, "ms_per_round_all": times,
              "saved_ms_vs_3_calls": {k: ms["3 calls"] - v for k, v in ms.items()}, "parity_vs_3_calls": parity,
              "onnxruntime": ort.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"ms_per_round": ms, "parity": parity}, indent=1))


if __name__ == "__main__":
    main()
