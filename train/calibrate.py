"""`hyflash calibrate`: measure hybrid drafting's constants (`hyflash.models.hybrid`) on training data.

Every anchor of a greedy regenerated row (`hyflash regenerate`; in chat data, every anchor inside a greedy
conversation's answers) is a round: the tokens after it
are the target's own greedy chain, so a block's accepted length is its agreement with them. Per
round: the drafter's expected accepted drafts (sum of its slot confidences) and realised ones, and
lookup's match length and realised accepted drafts. The constants go into the drafter folder as
`hybrid.json`; `hyflash export` carries them into the manifest (`drafter.hybrid`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from hyflash.models.drafter import Drafter
from hyflash.models.files import write_json_atomic
from hyflash.models.lookup import lookup
from hyflash.models.target import Target
from hyflash.train.cached import ConversationRows
from hyflash.train.drafter import Distill, chunked_head_loss


def chat_rows(folder: Path, rows: int, target_sha256: str) -> tuple[np.ndarray, np.ndarray]:
    """Up to `rows` greedy conversations of a chat regeneration (`hyflash regenerate --chat-prompts`), from its
    training split: (tokens, anchorable), the anchors those inside the target's own answers."""
    data = ConversationRows(folder, features=False, target_sha256=target_sha256)
    ids = [i for i in data.train_ids if data.greedy[i]][:rows]
    if not ids:
        raise ValueError(f"{folder} has no greedy conversations; regenerate it with --greedy-share above 0")
    return np.stack([data.tokens[i] for i in ids]), np.stack([data.anchors[i] for i in ids])


def accepted(block: np.ndarray, chain: np.ndarray) -> int:
    """Leading drafts of `block` equal to the target's greedy chain: what a verify round accepts."""
    neq = np.flatnonzero(block != chain)
    return int(neq[0]) if neq.size else len(block)


@torch.no_grad()
def measure_rounds(target: Target, drafter: Drafter, tokens: np.ndarray, anchorable: np.ndarray,
                   anchors: int = 48, batch: int = 4, progress: bool = False) -> dict[str, np.ndarray]:
    """Every anchor of every row as a round: the drafter's expected and realised accepted drafts (and its
    per-slot confidences, `confidence`: rounds x block), lookup's match length and realised accepted drafts,
    and how many leading drafts the two blocks share
    (`agree`). Rows must be greedy (labels = next tokens). The drafter's block is read off the target's
    chain (teacher-forced), which is its own up to its first miss; so `agree` is exact wherever the two
    blocks accept different lengths, and past a miss both share it is the teacher-forced block's."""
    if not drafter.cfg.confidence:
        raise ValueError("this drafter has no confidence head (trained with --no-confidence); hybrid drafting "
                         "needs its per-slot probabilities")
    model = Distill(drafter.eval(), target.eval(), anchors)
    out = {"expected": [], "confidence": [], "drafter": [], "match": [], "lookup": [], "agree": []}
    for i in tqdm(range(0, len(tokens), batch), desc="calibrate", unit="batch", disable=not progress):
        rows = torch.from_numpy(tokens[i:i + batch].astype(np.int64))
        allowed = torch.from_numpy(anchorable[i:i + batch])
        for row, (a, labels, states, prev, conf, copy) in zip(rows.numpy(), model.predict(rows, allowed)):
            guess = chunked_head_loss(drafter, states.flatten(0, 1), prev.flatten(), labels.flatten(),
                                      tuple(x.flatten() for x in copy) if copy is not None else None)[1]
            guess = guess.view_as(labels)  # (A, 7)
            out["expected"] += conf.sum(-1).tolist()
            out["confidence"] += conf.tolist()
            out["drafter"] += (guess == labels).int().cumprod(-1).sum(-1).tolist()
            for anchor, chain, drafts in zip(a.tolist(), labels.numpy(), guess.numpy()):
                block, n = lookup(row[:anchor + 1], drafter.cfg.block)
                out["match"].append(n)
                out["lookup"].append(accepted(block, chain))
                out["agree"].append(accepted(block, drafts))
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def write(cal: dict, drafter_dir: Path) -> Path:
    path = Path(drafter_dir) / "hybrid.json"
    write_json_atomic(path, cal)
    return path


def plot_reliability(cal: dict, path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = [b for b in cal["drafter_bins"] if b["rounds"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot([0, 7], [0, 7], color="gray", lw=0.8, label="calibrated")
    ax1.plot([b["predicted"] for b in bins], [b["realised"] for b in bins], marker="o", label="drafter")
    for b in bins:
        ax1.annotate(str(b["rounds"]), (b["predicted"], b["realised"]), fontsize=7, xytext=(3, -8),
                     textcoords="offset points")
    ax1.set(title="confidence head: expected vs realised accepted drafts", xlabel="sum of slot confidences",
            ylabel="realised accepted drafts (mean)")
    ax1.legend()
    rows = [r for r in cal["lookup"] if r["rounds"]]
    ax2.bar([str(r["match"]) for r in rows], [r["mean_accepted"] for r in rows])
    ax2.set(title="prompt-lookup: accepted drafts by match length", xlabel="n-gram matched", ylabel="mean accepted")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
