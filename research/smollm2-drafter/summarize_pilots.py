"""One table of the draft-vocabulary pilots (vocab_pilots.sh): per draft vocabulary, its coverage of the
held-out answers of the chat data, the pilot's held-out tau in training, tau and tokens/s on held-out chat
(bench --chat) and draft_read's ms (profile). Writes results/vocab_pilots.json and prints a markdown table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hyflash.train.cached import ConversationRows


def coverage(rows: ConversationRows, vocab: int, size: int) -> float:
    """The share of held-out answer tokens inside the `size` most frequent training answer tokens (the draft
    vocabulary train-drafter picks: `_fresh_drafter`)."""
    order = np.argsort(-rows.token_counts(vocab), kind="stable")[:size]
    inside = np.zeros(vocab, bool)
    inside[order] = True
    held = np.concatenate([rows.tokens[i][rows.answer[i]] for i in rows.held_ids])
    return float(inside[held].mean())


def pooled(bench: dict, run_suffix: str) -> dict:
    row = next(r for r in bench["results"] if r["run"].endswith(run_suffix) and r.get("category") == "all")
    return {"tau": row["tau"], "tokens_per_s": row["decode_tokens_per_s"], "speedup": row["speedup"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--runs", type=Path, default=Path("runs"))
    p.add_argument("--results", type=Path, required=True)
    args = p.parse_args()
    rows = ConversationRows(args.data, features=False)
    table = []
    profiles = sorted(args.results.glob("pilot_v*_profile.json"), key=lambda q: int(q.stem[7:].split("_")[0]))
    for prof_path in profiles:
        size = int(prof_path.stem[7:].split("_")[0])
        bench_path = args.results / f"pilot_v{size}.json"
        bench = json.loads(bench_path.read_text()) if bench_path.is_file() else None
        prof = json.loads(prof_path.read_text())
        log = [json.loads(line) for line in (args.runs / f"smollm2-pilot-v{size}" / "log.jsonl").open()]
        evals = [e for e in log if "heldout_tau" in e]
        table.append({
            "draft_vocab": size,
            "heldout_coverage": coverage(rows, 49152, size),
            "steps": log[-1]["step"], "train_eval_tau": evals[-1]["heldout_tau"] if evals else None,
            "chat": {"hyflash": pooled(bench, "/hyflash"), "target_only": pooled(bench, "/none"),
                     "conversations": bench["conversations"]} if bench else None,
            "draft_read_ms": {r["context"]: r["graph_ms"]["draft_read"] for r in prof["rows"]},
            "target_verify_ms": {r["context"]: r["graph_ms"]["target_verify"] for r in prof["rows"]},
            "target_decode_ms": {r["context"]: r["graph_ms"]["target_decode"] for r in prof["rows"]},
        })
    out = args.results / "vocab_pilots.json"
    cover = {size: coverage(rows, 49152, size) for size in (4096, 8192, 16384, 32768)}
    out.write_text(json.dumps({"data": str(args.data), "heldout_coverage": cover, "pilots": table}, indent=1) + "\n")
    print("held-out coverage by draft vocabulary: " + ", ".join(f"{k}: {v:.3f}" for k, v in cover.items()))
    print("| draft vocab | held-out coverage | held-out tau (training) | draft_read ms (256 / 1024) | verify ms | "
          "chat tau | chat speedup |\n|---|---|---|---|---|---|---|")
    for t in table:
        ms = " / ".join(f"{v:.1f}" for v in t["draft_read_ms"].values())
        verify = " / ".join(f"{v:.1f}" for v in t["target_verify_ms"].values())
        h = t["chat"]["hyflash"] if t["chat"] else {"tau": float("nan"), "speedup": float("nan")}
        print(f"| {t['draft_vocab']} | {t['heldout_coverage']:.3f} | {t['train_eval_tau'] or float('nan'):.2f} | "
              f"{ms} | {verify} | {h['tau']:.2f} | {h['speedup']:.2f}x |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
