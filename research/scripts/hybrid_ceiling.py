"""How much a per-round choice between the drafter's block and prompt-lookup's can gain, measured on
training rounds as `hyflash calibrate` measures them (on 512 greedy rows by default, the calibration's 256
among them; this writes nothing into the drafter folder). Reports the drafter alone, lookup alone, the better
of the two each round (an oracle),
the rounds by how many leading drafts the two blocks share (`by_agreement`), and the held-out mean of
four cell rules, each half of the rows judged by cells fitted on the other half: the runtime's cells
(lookup's match x the drafter's confidence bin; a thin cell keeps the drafter here, where the runtime falls
back to its marginal tables), those cells split by the blocks' agreement, lookup's match x agreement,
and agreement x the drafter's confidence at the slot where the two blocks part (c_{a+1} / c_a: the
probability, by its own head, that its first draft unlike lookup's is right) x match. `parting_slot`
shows why none finds the rounds lookup wins: the rounds with the lowest confidence at the parting slot,
and how often each block went further there. (`mean_accepted.hybrid` is the runtime's rule itself, thin cells falling back to its
marginal tables.)
Usage: python research/scripts/hybrid_ceiling.py [--drafter reference] [--target reference] [--data data/regen-v2]
         [--rows 512] > research/results/hybrid_ceiling.json"""

import argparse
import json
import os
import sys

import numpy as np
import torch

from hyflash.models.hybrid import MIN_ROUNDS, bin_index, calibration
from hyflash.models.loading import load_drafter, load_target, resolve
from hyflash.train.batches import response_anchors
from hyflash.train.calibrate import measure_rounds
from hyflash.train.regenerate import load_regenerated

ap = argparse.ArgumentParser()
ap.add_argument("--drafter", default="reference")
ap.add_argument("--target", default="reference")
ap.add_argument("--data", default="data/regen-v2")
ap.add_argument("--rows", type=int, default=512, help="greedy regenerated rows (the calibration used the first 256)")
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()

torch.set_num_threads(args.threads)
target = load_target(resolve(args.target, "target"))
drafter = load_drafter(resolve(args.drafter, "drafter"), target)
data = load_regenerated(args.data)
greedy = np.flatnonzero(data.greedy)[:args.rows]
rounds = measure_rounds(target, drafter, data.tokens[greedy],
                        response_anchors(data.prompt_len[greedy], data.tokens.shape[1], data.length[greedy]))
cal = calibration(rounds)


def held_out(keys: np.ndarray) -> float:
    """Mean accepted drafts when each round verifies lookup's block iff lookup's mean beats the drafter's in
    the round's cell (rows of `keys`), the cells fitted on the other half of the rounds (rows of text are
    not split: rounds come row by row); a cell with fewer than MIN_ROUNDS fitted rounds keeps the drafter."""
    half = len(keys) // 2
    got = np.empty(len(keys))
    for fit, judge in ((slice(half, None), slice(0, half)), (slice(0, half), slice(half, None))):
        cells, inverse = np.unique(keys[fit], axis=0, return_inverse=True)
        n = np.bincount(inverse, minlength=len(cells))
        gain = np.bincount(inverse, rounds["lookup"][fit] - rounds["drafter"][fit], minlength=len(cells))
        pick = {tuple(c) for c, k, g in zip(cells, n, gain) if k >= MIN_ROUNDS and g > 0}
        chose = np.asarray([tuple(k) in pick for k in keys[judge]])
        got[judge] = np.where(chose, rounds["lookup"][judge], rounds["drafter"][judge])
    return float(got.mean())


def parting_confidence(conf: np.ndarray, agree: np.ndarray) -> np.ndarray:
    """c_{a+1} / c_a per round (c_0 = 1), a = the leading drafts the two blocks share (the last slot where
    they share all): the drafter's own probability that its first draft unlike lookup's is right (its head is
    trained on "every draft up to slot k right"). The sigmoids are not forced to fall slot by slot, so a ratio
    can pass 1 (the top bin); where the blocks share all seven (a = 7) it is meaningless, and such rounds are
    left out of `parting_slot` and gain nothing from either block in the cells."""
    ext = np.concatenate([np.ones((len(conf), 1)), conf], 1)
    a = np.minimum(agree.astype(int), conf.shape[1] - 1)
    at = np.arange(len(conf))
    return ext[at, a + 1] / np.maximum(ext[at, a], 1e-9)


parting = parting_confidence(rounds["confidence"], rounds["agree"])
parts = rounds["agree"] < rounds["confidence"].shape[1]
lowest = []
for share in (0.05, 0.1, 0.2, 0.5):
    hit = parts & (parting <= np.quantile(parting[parts], share))
    d, lk = rounds["drafter"][hit], rounds["lookup"][hit]
    lowest.append({"lowest_share_of_parting_rounds": share, "rounds": int(hit.sum()),
                   "lookup_further": float((lk > d).mean()), "drafter_further": float((d > lk).mean()),
                   "gain_per_round_if_lookup_there": float((lk - d).sum() / len(parting))})
parting_bin = np.digitize(parting, [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 0.9])
base = np.stack([rounds["match"], bin_index(rounds["expected"])], 1)
with_agree = np.column_stack([base, rounds["agree"]])
report = {"command": " ".join(["python", *sys.argv]),
          "drafter_folder": os.path.relpath(resolve(args.drafter, "drafter")), "data": args.data,
          "rows": int(greedy.size),
          "rounds": int(len(rounds["match"])), "mean_accepted": cal["mean_accepted"],
          "lookup_further_share": float((rounds["lookup"] > rounds["drafter"]).mean()),
          "drafter_further_share": float((rounds["drafter"] > rounds["lookup"]).mean()),
          "by_agreement": cal["by_agreement"],
          "held_out_rule": {"match x confidence bin (the runtime's cells)": held_out(base),
                            "match x confidence bin x agreement": held_out(with_agree),
                            "match x agreement": held_out(np.stack([rounds["match"], rounds["agree"]], 1)),
                            "agreement x parting-slot confidence bin x match":
                                held_out(np.stack([rounds["agree"], parting_bin, rounds["match"]], 1))},
          "parting_slot": lowest}
print(json.dumps(report, indent=1))
