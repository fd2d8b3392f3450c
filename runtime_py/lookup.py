"""Prompt-lookup drafting: no model, just n-gram matches in the prompt and output so far."""

from __future__ import annotations

import numpy as np


def prompt_lookup(history: list[int], block: int, max_ngram: int = 3) -> np.ndarray:
    """The `block` tokens that followed the latest earlier occurrence of the longest suffix n-gram
    (n = max_ngram..1). history ends with the anchor. Without a match, repeats the anchor."""
    seq = np.asarray(history, dtype=np.int64)
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        tail = seq[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # every earlier n-gram
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            start = hits[-1] + n
            follow = seq[start:start + block]
            if follow.size:
                return np.concatenate([follow, np.full(block - follow.size, follow[-1], np.int64)])
    return np.full(block, seq[-1], np.int64)
