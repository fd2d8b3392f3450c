"""Hybrid drafting's rule: each round, verify the block with the larger expected accepted length.

The drafter's block comes with its confidence head's per-slot probabilities c_k (P(the chain is
still right at slot k)), so sum_k c_k is its own expected number of accepted drafts; prompt-lookup's
block comes with the length n of the n-gram it matched. Both expectations are read from a
calibration measured on training data (`hyflash calibrate`, train/calibrate.py):

- lookup: the mean accepted drafts of lookup blocks with match length n (n = 0..MAX_NGRAM);
- drafter: the realised mean accepted drafts in bins of sum_k c_k (a reliability table; a bin
  with fewer than `min_rounds` rounds keeps the head's own figure);
- both jointly (`joint`): per match n and confidence bin, the mean accepted drafts of each block.
  The two are not independent: rounds where the drafter doubts itself are hard text for lookup too,
  and a drafter that reads lookup's block (`--lookup-input`) already weighs it. The rule compares
  the two means of the round's own cell, and the marginal tables where that cell is thin;
- what running the drafter adds at lookup match n (`drafter_gain`: the rule's mean accepted drafts
  minus lookup's, over rounds with match n, the rule's tables fitted on the other half of the
  rounds). Lookup's match is known before the drafter runs, so where that gain is worth less than
  draft_read costs, a round skips draft_read and verifies lookup's block (`skip_drafter`);
- per slot, for the verify-width rule (`hyflash.models.widths`): the realised probability that the first k
  drafts all pass, by bins of the head's slot-k confidence (`slots`), and by lookup's match length
  (`lookup_slots`); `drafter_chain` and `lookup_chain` read them;
- for the report only (`by_agreement`): rounds by how many leading drafts the two blocks share, and how
  often each block went further where they part: the room any rule that picks one of them has.

numpy only: the runtime applies it every round.
"""

from __future__ import annotations

import numpy as np

from hyflash.models.lookup import MAX_NGRAM

BIN_EDGES = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0)
_EDGES = np.asarray(BIN_EDGES)
SLOT_EDGES = np.linspace(0.0, 1.0, 11)  # a slot's confidence, in tenths
MIN_ROUNDS = 20


def calibration(rounds: dict[str, np.ndarray]) -> dict:
    """The rule's constants from measured rounds: arrays `expected` (sum of confidences), `drafter`
    (its realised accepted drafts), `match` (lookup's n) and `lookup` (its realised accepted drafts).
    The tables come from all the rounds; what the rule makes of them (`mean_accepted.hybrid`, and
    `drafter_gain`, which decides the skips) is measured on rounds the tables were not fitted on
    (`held_out_hybrid`): picking the better of two means per cell flatters itself in-sample."""
    cal = tables(rounds)
    cal["mean_accepted"] = {"drafter": float(rounds["drafter"].mean()), "lookup": float(rounds["lookup"].mean()),
                            "better_of_two": float(np.maximum(rounds["drafter"], rounds["lookup"]).mean())}
    held = held_out_hybrid(rounds)
    cal["mean_accepted"]["hybrid"] = float(held.mean())
    gain = held - rounds["lookup"]
    for row in cal["lookup"]:
        hit = rounds["match"] == row["match"]
        row["drafter_gain"] = float(gain[hit].mean()) if hit.any() else 0.0
    if "agree" in rounds:
        cal["by_agreement"] = by_agreement(rounds)
    if "confidence" in rounds:
        cal["slots"] = slot_tables(np.asarray(rounds["confidence"], np.float64), rounds["drafter"])
    cal["lookup_slots"] = lookup_slot_tables(rounds, len(cal["slots"]) if "slots" in cal else 7)
    return cal


def slot_tables(confidence: np.ndarray, accepted: np.ndarray) -> list[list[dict]]:
    """Per slot k (rounds x block confidences): bins of the head's slot-k confidence, with the share of their
    rounds that accepted more than k drafts (the first k+1 all passed)."""
    out = []
    for k in range(confidence.shape[1]):
        cell = np.clip(np.searchsorted(SLOT_EDGES, confidence[:, k], side="right") - 1, 0, len(SLOT_EDGES) - 2)
        passed = accepted > k
        out.append([{"rounds": int((cell == b).sum()),
                     "predicted": float(confidence[cell == b, k].mean()) if (cell == b).any() else None,
                     "realised": float(passed[cell == b].mean()) if (cell == b).any() else None}
                    for b in range(len(SLOT_EDGES) - 1)])
    return out


def lookup_slot_tables(rounds: dict[str, np.ndarray], block: int) -> list[dict]:
    """Per lookup match length n: the share of its rounds whose first k+1 lookup drafts all passed, k < block."""
    rows = []
    for n in range(MAX_NGRAM + 1):
        hit = rounds["match"] == n
        rows.append({"match": n, "rounds": int(hit.sum()),
                     "chain": [float((rounds["lookup"][hit] > k).mean()) if hit.any() else 0.0 for k in range(block)]})
    return rows


def drafter_chain(cal: dict | None, confidence: np.ndarray) -> np.ndarray:
    """q_k, the probability that the drafter's first k drafts all pass: its head's slot confidences, each read
    through the calibration's slot table where that bin holds enough rounds; never rising with k."""
    q = np.asarray(confidence, np.float64).copy()
    for k, table in enumerate((cal or {}).get("slots", [])[:len(q)]):
        cell = table[int(np.clip(np.searchsorted(SLOT_EDGES, q[k], side="right") - 1, 0, len(table) - 1))]
        if cell["rounds"] >= cal["min_rounds"]:
            q[k] = cell["realised"]
    return np.minimum.accumulate(q)


def lookup_chain(cal: dict | None, match: int, block: int) -> np.ndarray:
    """q_k for prompt-lookup's block at match length `match`: measured where the calibration has the row
    (a drafter calibrated by `hyflash calibrate`); otherwise no match verifies nothing and a match, all."""
    rows = (cal or {}).get("lookup_slots")
    if rows and rows[match]["rounds"] >= cal["min_rounds"]:
        return np.asarray(rows[match]["chain"][:block], np.float64)
    return np.full(block, 1.0 if match else 0.0)


def by_agreement(rounds: dict[str, np.ndarray]) -> list[dict]:
    """Rounds by how many leading drafts the two blocks share (`agree`, 0..block): where they share all,
    the choice cannot matter; elsewhere each row says how often lookup's block would have gone further
    than the drafter's and how often the reverse, the room a rule that picks one of them has."""
    rows = []
    for a in range(int(rounds["agree"].max(initial=0)) + 1):
        hit = rounds["agree"] == a
        d, lk = rounds["drafter"][hit], rounds["lookup"][hit]
        rows.append({"agree": a, "rounds": int(hit.sum()),
                     "drafter": float(d.mean()) if hit.any() else None, "lookup": float(lk.mean()) if hit.any() else None,
                     "lookup_further": float((lk > d).mean()) if hit.any() else None,
                     "drafter_further": float((d > lk).mean()) if hit.any() else None})
    return rows


def tables(rounds: dict[str, np.ndarray]) -> dict:
    """Lookup's mean by match length, the drafter's reliability bins and the joint (match, bin) cells."""
    lookup_rows = []
    for n in range(MAX_NGRAM + 1):
        hit = rounds["match"] == n
        lookup_rows.append({"match": n, "rounds": int(hit.sum()),
                            "mean_accepted": float(rounds["lookup"][hit].mean()) if hit.any() else 0.0})
    cell = bin_index(rounds["expected"])
    joint = [[_means(rounds, (rounds["match"] == n) & (cell == b)) for b in range(len(BIN_EDGES) - 1)]
             for n in range(MAX_NGRAM + 1)]
    return {"lookup": lookup_rows, "drafter_bins": reliability(rounds["expected"], rounds["drafter"]),
            "joint": joint, "min_rounds": MIN_ROUNDS, "rounds": int(len(rounds["match"]))}


def held_out_hybrid(rounds: dict[str, np.ndarray]) -> np.ndarray:
    """Accepted drafts per round under the rule, each half of the rounds judged by tables fitted on the
    other half (rounds come row by row, so the halves are different rows of text)."""
    half = len(rounds["match"]) // 2
    first, second = ({k: v[:half] for k, v in rounds.items()}, {k: v[half:] for k, v in rounds.items()})
    return np.concatenate([hybrid_rounds(tables(second), first), hybrid_rounds(tables(first), second)])


def _means(rounds: dict[str, np.ndarray], hit: np.ndarray) -> dict:
    return {"rounds": int(hit.sum()), "drafter": float(rounds["drafter"][hit].mean()) if hit.any() else None,
            "lookup": float(rounds["lookup"][hit].mean()) if hit.any() else None}


def bin_index(expected):
    """The reliability bin (or array of bins) that expected accepted drafts fall in, as `reliability`
    bins them (the last bin takes its top edge and anything above)."""
    return np.clip(np.searchsorted(_EDGES, expected, side="right") - 1, 0, len(BIN_EDGES) - 2)


def reliability(expected, realised) -> list[dict]:
    """Rounds binned by the head's expected accepted drafts: mean expected and realised per bin."""
    expected, realised = np.asarray(expected, np.float64), np.asarray(realised, np.float64)
    bins = []
    for lo, hi in zip(BIN_EDGES, BIN_EDGES[1:]):
        inside = (expected >= lo) & ((expected < hi) | (hi == BIN_EDGES[-1]))
        bins.append({"from": lo, "to": hi, "rounds": int(inside.sum()),
                     "predicted": float(expected[inside].mean()) if inside.any() else None,
                     "realised": float(realised[inside].mean()) if inside.any() else None})
    return bins


def choose_lookup(cal: dict, expected: float, match: int) -> bool:
    """The hybrid rule: verify lookup's block when its expected accepted drafts exceed the drafter's, both
    as measured in the round's own (match, confidence bin) cell; in a thin cell (or a calibration made
    before the joint table), lookup's mean at that match against the drafter's at that confidence."""
    cell = cal["joint"][match][int(bin_index(expected))] if "joint" in cal else None
    if cell is not None and cell["rounds"] >= cal["min_rounds"]:
        return cell["lookup"] > cell["drafter"]
    return lookup_expected(cal, match) > drafter_expected(cal, expected)


def skipped_matches(cal: dict, draft_cost: float) -> tuple[frozenset[int], float]:
    """The lookup match lengths at which skipping draft_read makes the most tokens per unit of time over
    the calibration's rounds, and that rate R (tokens per round-without-drafter of time). `draft_cost` is
    draft_read's time as a share of the rest of a round (verify and commit): a round at match n makes
    1 + lookup_n tokens in time 1 without the drafter, 1 + lookup_n + gain_n in time 1 + draft_cost with it.
    Running it at n pays iff gain_n > draft_cost * R, R being the rate of the whole policy (not of that round
    alone), so R and the set are found together (Dinkelbach's iteration: a few steps over these few rows).
    Rows with fewer than `min_rounds` rounds, and a free drafter, always run it."""
    rows = cal["lookup"]
    weight = np.asarray([r["rounds"] for r in rows], np.float64)
    lookup_n = np.asarray([r["mean_accepted"] for r in rows])
    gain = np.asarray([r.get("drafter_gain", 0.0) for r in rows])
    thin = weight < cal["min_rounds"]
    run = np.ones(len(rows), bool)
    for _ in range(len(rows) + 2):
        rate = (weight * (1 + lookup_n + gain * run)).sum() / max((weight * (1 + draft_cost * run)).sum(), 1e-12)
        new = thin | (gain > draft_cost * rate) | (draft_cost <= 0)
        if (new == run).all():
            break
        run = new
    return frozenset(int(r["match"]) for r, go in zip(rows, run) if not go), float(rate)


def skip_drafter(cal: dict, match: int, draft_cost: float, rate: float) -> bool:
    """Whether a hybrid round at lookup match `match` verifies lookup's block without running draft_read:
    the drafter's gain there is worth no more than its cost at `rate`, the generation's tokens per unit of
    time (the runtime keeps it as it goes, starting from the calibration's: `skipped_matches`). A free
    drafter, a thin row and a calibration without `drafter_gain` (made before it existed) always run it."""
    row = cal["lookup"][match]
    if draft_cost <= 0 or "drafter_gain" not in row or row["rounds"] < cal["min_rounds"]:
        return False
    return row["drafter_gain"] <= draft_cost * rate


def lookup_expected(cal: dict, match: int) -> float:
    return cal["lookup"][match]["mean_accepted"]


def drafter_expected(cal: dict, expected: float) -> float:
    """The realised mean of the bin `expected` falls in (the head's own figure in a thin bin)."""
    b = cal["drafter_bins"][int(bin_index(expected))]
    return b["realised"] if b["rounds"] >= cal["min_rounds"] else expected


def hybrid_rounds(cal: dict, rounds: dict[str, np.ndarray]) -> np.ndarray:
    """Accepted drafts per round under the hybrid rule (for the report; the runtime applies the same rule)."""
    pick = np.asarray([choose_lookup(cal, e, int(m)) for e, m in zip(rounds["expected"], rounds["match"])])
    return np.where(pick, rounds["lookup"], rounds["drafter"])
