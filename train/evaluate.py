"""`hyflash eval-target`: held-out loss by token position and next-token accuracy of a target.

Loss that keeps falling with position means the model uses distant context: the premise of the
long-context drafter experiment. Windows are consecutive slices of the held-out stream.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hyflash.models.target import Target


@torch.no_grad()
def loss_by_position(target: Target, stream: np.ndarray, seq_len: int, max_windows: int = 64) -> dict:
    n = min(max_windows, (len(stream) - 1) // seq_len)
    if n < 1:
        raise ValueError(f"the held-out stream ({len(stream)} tokens) is shorter than one window of {seq_len}")
    losses = np.zeros(seq_len)
    correct = 0
    for i in range(n):
        window = torch.from_numpy(stream[i * seq_len:(i + 1) * seq_len + 1].astype(np.int64))
        logits, _ = target(window[None, :-1])
        losses += F.cross_entropy(logits[0], window[1:], reduction="none").numpy()
        correct += int((logits[0].argmax(-1) == window[1:]).sum())
    losses /= n
    edges = [0] + [2**k for k in range(int(np.log2(seq_len)) + 1) if 2**k <= seq_len]
    buckets = [{"from": lo, "to": hi, "loss": float(losses[lo:hi].mean())} for lo, hi in zip(edges, edges[1:])
               if hi > lo]
    return {"windows": n, "seq_len": seq_len, "loss": float(losses.mean()), "accuracy": correct / (n * seq_len),
            "loss_by_position": buckets, "per_position": losses.tolist()}


def plot_loss_by_position(report: dict, path: Path, marks: dict[str, int] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = np.asarray(report["per_position"])
    smooth = np.convolve(per, np.ones(16) / 16, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(len(smooth)) + 8, smooth)
    for label, x in (marks or {}).items():
        ax.axvline(x, color="gray", ls="--", lw=0.8)
        ax.text(x, smooth.max(), f" {label}", va="top", fontsize=8)
    ax.set(xscale="log", xlabel="token position", ylabel="held-out loss (nats, 16-token mean)",
           title=f"target: loss by position ({report['windows']} windows of {report['seq_len']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
