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


def plot_training_log(log_path: Path, path: Path, title: str) -> dict:
    """Loss curve (per step and a 25-step mean) of a run's log.jsonl; returns a summary."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = [json.loads(line) for line in Path(log_path).read_text().splitlines()]
    steps = np.array([e["step"] for e in log])
    loss = np.array([e["loss"] for e in log])
    mean = np.convolve(loss, np.ones(25) / 25, mode="valid") if len(loss) >= 25 else loss
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, loss, alpha=0.3, label="per step")
    ax.plot(steps[len(steps) - len(mean):], mean, label="25-step mean")
    ax.set(xlabel="step", ylabel="training loss (nats/token)", title=title)
    ax.legend(loc="upper left")
    held = [(e["step"], e["heldout_tau"]) for e in log if "heldout_tau" in e]
    walked = [(e["step"], e["heldout_walked_tau"]) for e in log if "heldout_walked_tau" in e]
    if held:  # drafter runs: held-out tau on the right axis
        right = ax.twinx()
        right.plot(*zip(*held), color="tab:green", marker="o", label="held-out tau (mean over anchors)")
        if walked:
            right.plot(*zip(*walked), color="tab:red", marker="s", label="held-out tau (walked as the loop)")
        right.set_ylabel("held-out tau (tokens per round)")
        right.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return {"steps": int(steps[-1]), "final_loss_25": float(mean[-1]), "wall_s": log[-1]["elapsed_s"],
            **({"final_heldout_tau": held[-1][1]} if held else {}),
            **({"final_heldout_walked_tau": walked[-1][1]} if walked else {})}
