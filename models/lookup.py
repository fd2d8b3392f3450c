"""Prompt-lookup drafting: no model, just n-gram matches in the prompt and output so far."""

from __future__ import annotations

import numpy as np

MAX_NGRAM = 3


def lookup(history, block: int, max_ngram: int = MAX_NGRAM) -> tuple[np.ndarray, int]:
    """(the `block` tokens that followed the latest earlier occurrence of the longest suffix n-gram,
    n = max_ngram..1; n). history ends with the anchor. Without a match: the anchor repeated, n = 0."""
    seq = np.asarray(history, dtype=np.int64)
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        tail = seq[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # every earlier n-gram
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            start = hits[-1] + n
            follow = seq[start:start + block]
            if follow.size:
                return np.concatenate([follow, np.full(block - follow.size, follow[-1], np.int64)]), n
    return np.full(block, seq[-1], np.int64), 0


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
