"""The second-generation target's stages (research/scripts/target_v3.sh) on one time axis: training loss,
and the probes (distant-repeat copy rate, held-out loss, random-token induction accuracy).
Usage: python research/scripts/target_v3_plot.py LOG_A ... LOG_E [LOG_F [LOG_G [LOG_H]]] OUT.png (each a run's log.jsonl),
or with the stages named, LABEL=LOG ..., for another chain of stages (each stage starting from the one before),
e.g. the embedded target's: "A offset=a_offset_log.jsonl" ... "G copy5b=h_copy5b_log.jsonl" "H' copy6=j_copy6_log.jsonl"
"L copy6b=p_copy6b_log.jsonl"."""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

*logs, out = sys.argv[1:]
names = ["A offset", "B induction", "C copy3", "D ngram", "E copy4", "F copy5", "G copy5b", "H copy5c"]
labelled = ["=" in arg for arg in logs]
if not logs or any(labelled) != all(labelled):
    sys.exit("usage: target_v3_plot.py LOG ... OUT.png, or LABEL=LOG ... OUT.png (all labelled or none)")
if all(labelled):
    names, logs = zip(*(arg.split("=", 1) for arg in logs))
fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
offset, probes = 0, []
for name, path in zip(names, logs):
    log = [json.loads(line) for line in Path(path).read_text().splitlines()]
    ax1.plot([offset + e["step"] for e in log], [e["loss"] for e in log], lw=0.8, label=name)
    probes += [{**e, "x": offset + e["step"]} for e in log if "copy_256" in e]
    for ax in (ax1, ax2, ax3):
        ax.axvline(offset, color="gray", lw=0.5)
    ax2.text(offset + 5, 0.9, name.split()[0], fontsize=8)
    offset += log[-1]["step"]
x = [e["x"] for e in probes]
for key, label in (("copy_256", "copy rate, filler 256"), ("copy_1536", "copy rate, filler 1,536"),
                   ("induction_acc", "random-token induction")):
    ax2.plot(x, [e[key] for e in probes], "o-", ms=3, label=label)
ax3.plot(x, [e["heldout_loss"] for e in probes], "o-", ms=3, label="held-out loss (4 windows)")
ax1.set(title="training loss (A, B: on the copies only)", xlabel="step (stages end to end)", ylabel="nats")
ax2.set(title="copy rate (filler 256 / 1,536) and induction", xlabel="step", ylabel="share", ylim=(-0.02, 1.02))
ax2.axhline(0.8, color="gray", lw=0.8, ls="--", label="issue 14's copy bar (80%)")
ax3.set(title="held-out plain-text loss", xlabel="step", ylabel="nats")
ax3.axhline(3.70, color="gray", lw=0.8, ls="--", label="first-generation target (3.70)")
for ax in (ax1, ax2, ax3):
    ax.legend(fontsize=6)
fig.tight_layout()
fig.savefig(out, dpi=120)
print(f"wrote {out}")
