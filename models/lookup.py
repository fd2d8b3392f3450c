"""Prompt-lookup drafting: no model, just n-gram matches in the prompt and output so far."""

from __future__ import annotations

import numpy as np

MAX_NGRAM = 3


def lookup(history, block: int, max_ngram: int = MAX_NGRAM) -> tuple[np.ndarray, int]:
    """(the `block` tokens that followed the latest earlier occurrence of the longest suffix n-gram,
    n = max_ngram..1; n). history ends with the anchor. Without a match: the anchor repeated, n = 0.
    A block that runs into the anchor is padded with its last token.

    One pass over the history (the earlier positions holding the anchor token), then each of those
    matches grown backwards one token at a time: the loop calls this every round on a history that
    grows to the whole context."""
    seq = np.asarray(history, dtype=np.int64)
    last = len(seq) - 1
    ends = np.flatnonzero(seq[:-1] == seq[last])  # where earlier 1-gram matches end
    if not ends.size:
        return np.full(block, seq[last], np.int64), 0
    n = np.ones(len(ends), np.int64)  # each match's length
    alive = np.ones(len(ends), bool)  # still growing
    for k in range(1, min(max_ngram, last)):
        alive &= ends >= k
        alive[alive] = seq[ends[alive] - k] == seq[last - k]
        n += alive
    start = ends[n == n.max()][-1] + 1  # the latest of the longest
    follow = seq[start:start + block]  # start <= last: never empty
    return np.concatenate([follow, np.full(block - follow.size, follow[-1], np.int64)]), int(n.max())


def lookup_many(tokens, anchors, block: int, max_ngram: int = MAX_NGRAM) -> tuple[np.ndarray, np.ndarray]:
    """`lookup` at each anchor a of one sequence, on its history tokens[:a + 1] (what the loop has
    committed, and the anchor): blocks (A, block) and match lengths (A,), as int64 arrays."""
    tokens = np.asarray(tokens, dtype=np.int64)
    found = [lookup(tokens[:a + 1], block, max_ngram) for a in np.asarray(anchors).tolist()]
    return (np.stack([b for b, _ in found]).reshape(-1, block).astype(np.int64),
            np.array([n for _, n in found], dtype=np.int64))


def prompt_lookup(history, block: int, max_ngram: int = MAX_NGRAM) -> np.ndarray:
    """The lookup block alone (see `lookup`)."""
    return lookup(history, block, max_ngram)[0]
