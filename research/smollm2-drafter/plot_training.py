"""Training curves of SmolLM2 drafter runs (train_drafters.sh): loss (a 25-step moving mean) and held-out tau
by step, one line per run, and a summary per run (steps, wall time, sequence tokens read, last held-out tau).

  .venv/bin/python research/smollm2-drafter/plot_training.py LABEL=LOG.jsonl ... --out PNG [--summary JSON]

--loss ce plots the hard-label cross-entropy instead of the loss (runs with other objectives, e.g. soft labels,
log their loss on another scale; every drafter run logs ce).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def summary(log: list[dict]) -> dict:
    elapsed = np.array([r["elapsed_s"] for r in log])
    steps_s = np.diff(elapsed, prepend=0.0)
    held = [r for r in log if "heldout_tau" in r]
    return {"steps": log[-1]["step"], "wall_hours": round(float(elapsed[-1]) / 3600, 2),
            "sequence_tokens": int(sum(r["tokens_per_s"] * s for r, s in zip(log, steps_s))),
            "last_loss_25": round(float(np.mean([r["loss"] for r in log[-25:]])), 3),
            "heldout_tau": [(r["step"], round(r["heldout_tau"], 3)) for r in held],
            **({"heldout_walked_tau": [(r["step"], round(r["heldout_walked_tau"], 3)) for r in walked]}
               if (walked := [r for r in held if "heldout_walked_tau" in r]) else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=LOG.jsonl")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--summary", type=Path, default=None)
    ap.add_argument("--loss", default="loss", help="the log's key for the left panel: loss (default) or ce")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, tau_ax) = plt.subplots(1, 2, figsize=(11, 4))
    report = {}
    for item in args.runs:
        label, path = item.split("=", 1)
        log = read_log(Path(path))
        report[label] = summary(log)
        steps, loss = np.array([r["step"] for r in log]), np.array([r[args.loss] for r in log])
        smooth = np.convolve(loss, np.ones(25) / 25, mode="valid")
        loss_ax.plot(steps[24:], smooth, label=label)
        held = [r for r in log if "heldout_tau" in r]
        line, = tau_ax.plot([r["step"] for r in held], [r["heldout_tau"] for r in held], marker="o", label=label)
        walked = [r for r in log if "heldout_walked_tau" in r]
        if walked:  # the same rows walked as the loop rounds: dashed, the run's colour
            tau_ax.plot([r["step"] for r in walked], [r["heldout_walked_tau"] for r in walked], marker="s", ls="--",
                        color=line.get_color(), label=f"{label}, walked")
    name = "training loss" if args.loss == "loss" else f"training {args.loss}"
    loss_ax.set(xlabel="step", ylabel=f"{name} (25-step mean)", yscale="log", title=name)
    tau_ax.set(xlabel="step", ylabel="held-out tau (teacher-forced)",
               title="held-out tau (dashed: walked as the loop)")
    for ax in (loss_ax, tau_ax):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    if args.summary:
        args.summary.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
