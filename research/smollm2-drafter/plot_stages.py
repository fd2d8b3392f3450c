"""The SmolLM2 drafter's τ on the frozen held-out chat set (all 64 conversations, 74 turns, fp32 ONNX, full
block, 128 new tokens, greedy), stage by stage: pooled and per category, read from the committed bench JSON of
each stage (greedy τ does not depend on the machine's speed, so stages benched in different runs compare).

  .venv/bin/python research/smollm2-drafter/plot_stages.py [--out research/smollm2-drafter/results/stages_heldout_tau.png]

Writes the PNG and, beside it, the figures plotted as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path("docs/results")
# stage -> (bench JSON holding it, its export's label there, shipped); each stage was benched beside the one before
STAGES = {
    "5": ("chat_bench_smollm2_hyflash_stage5.json", "smol-hf-fp32", True),
    "6": ("chat_bench_smollm2_hyflash.json", "smol-hf-fp32", True),
    "8": ("chat_bench_smollm2_candidate_requests.json", "smol-hf-fp32-requests", True),
    "9": ("chat_bench_smollm2_candidate_horizon.json", "smol-hf-fp32-horizon", False),
    "10": ("chat_bench_smollm2_candidate_asks.json", "smol-hf-fp32-asks", True),
    "11": ("chat_bench_smollm2_candidate_asks-all.json", "smol-hf-fp32-asks-all", True),
    "12": ("chat_bench_smollm2_candidate_longer.json", "smol-hf-fp32-longer", False),
    "13": ("chat_bench_smollm2_candidate_asks2.json", "smol-hf-fp32-asks2", False),
    "14": ("chat_bench_smollm2_candidate_gamma2.json", "smol-hf-fp32-gamma2", True),
    "15": ("chat_bench_smollm2_candidate_soft.json", "smol-hf-fp32-soft", False),
    "15b": ("chat_bench_smollm2_candidate_soft05b.json", "smol-hf-fp32-soft05b", False),
    "16": ("chat_bench_smollm2_candidate_soft05c.json", "smol-hf-fp32-soft05c", True),
    "18": ("chat_bench_smollm2_candidate_soft05e.json", "smol-hf-fp32-soft05e", True),
}


def stage_rows(stages: dict = STAGES) -> list[dict]:
    """One row per stage whose bench JSON is present: τ pooled ("all") and by category, full block."""
    rows = []
    for stage, (name, label, shipped) in stages.items():
        path = RESULTS / name
        if not path.exists():
            continue
        bench = json.loads(path.read_text())
        taus = {r["category"]: round(r["tau"], 3) for r in bench["results"] if r["run"] == f"{label}/model"}
        if bench["conversations"] != 64 or not taus:
            raise ValueError(f"{path}: no full-block HyFlash run of {label} on all 64 conversations")
        lookup = next(r["tau"] for r in bench["results"] if r["run"] == f"{label}/prompt-lookup" and r["category"] == "all")
        rows.append({"stage": stage, "bench": str(path), "export": label, "shipped": shipped, "tau": taus,
                     "prompt_lookup_tau": round(lookup, 3)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("research/smollm2-drafter/results/stages_heldout_tau.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = stage_rows()
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    categories = [c for c in rows[-1]["tau"] if c != "all"]
    for c in categories:
        ax.plot(x, [r["tau"].get(c) for r in rows], marker=".", lw=1, alpha=0.6, label=c)
    ax.plot(x, [r["tau"]["all"] for r in rows], marker="o", lw=2.5, color="black", label="pooled")
    ax.plot(x, [r["prompt_lookup_tau"] for r in rows], ls=":", color="black", label="prompt-lookup, pooled")
    ax.axhline(3.0, ls="--", color="grey", lw=1)
    ax.text(0, 3.0, " τ the claim needs", va="bottom", color="grey", fontsize=8)
    ax.set_xticks(list(x), [r["stage"] + ("" if r["shipped"] else "*") for r in rows])
    ax.set_xlabel("stage (* not shipped)")
    ax.set_ylabel("τ (tokens a round), held-out chat")
    ax.set_title("SmolLM2-135M-Instruct's HyFlash drafter, stage by stage (74 held-out turns, full block)")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{args.out}: {len(rows)} stages; pooled τ " + " -> ".join(f"{r['tau']['all']:.2f}" for r in rows))


if __name__ == "__main__":
    main()
