"""Token choice and the acceptance rule (docs/design.md, "The loop"), numpy only.

Greedy: accept draft d_i while it equals the target's argmax c_{i-1}; the bonus is c_k.
Sampled (the target's distribution after temperature, top-k and top-p): drafts are the
drafter's argmax chain, so the proposal q is one-hot: accept d_i with
probability p_{i-1}(d_i); at the first rejection draw the bonus from p_{i-1} with d_i removed
and renormalised; if all 7 are accepted draw it from p_7. This is the standard speculative
sampling rule for a one-hot q, so the output has exactly the target's distribution.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"--top-k must be an integer >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """logits (..., V) -> the target's sampling distribution (..., V): temperature, then top-k, then
        top-p (the order of `transformers`' warpers; top-k keeps ties with the k-th largest logit)."""
        z = logits.astype(np.float64) / self.temperature
        if 0 < self.top_k < z.shape[-1]:
            kth = -np.partition(-z, self.top_k - 1, axis=-1)[..., self.top_k - 1:self.top_k]
            z = np.where(z >= kth, z, -np.inf)
        z -= z.max(-1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(-1, keepdims=True)
        if self.top_p < 1:
            order = np.argsort(-p, axis=-1, kind="stable")
            sorted_p = np.take_along_axis(p, order, -1)
            before = np.cumsum(sorted_p, -1) - sorted_p  # mass strictly before each token
            keep_sorted = before < self.top_p  # the smallest prefix whose mass reaches top_p
            keep = np.zeros_like(keep_sorted)
            np.put_along_axis(keep, order, keep_sorted, -1)
            p = np.where(keep, p, 0.0)
            p /= p.sum(-1, keepdims=True)
        return p


def choose(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """One token from one row of logits (the target-only step, and the first token after prefill)."""
    if sampling.greedy:
        return int(np.argmax(logits))
    return int(rng.choice(logits.shape[-1], p=sampling.probs(logits)))


def accept(drafts: np.ndarray, logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> tuple[int, int]:
    """drafts (7,) for positions pos+1..pos+7; logits (8, V) from verifying [anchor, d_1..d_7].
    -> (k accepted drafts, bonus token)."""
    block = drafts.shape[0]
    if sampling.greedy:
        choice = logits.argmax(-1)  # c_r: the target's token after row r
        k = 0
        while k < block and drafts[k] == choice[k]:
            k += 1
        return k, int(choice[k])
    p = sampling.probs(logits)
    for i in range(block):
        d = int(drafts[i])
        if rng.random() < p[i, d]:  # accept d_{i+1} with probability p_i(d_{i+1})
            continue
        residual = p[i].copy()
        residual[d] = 0.0
        return i, int(rng.choice(residual.shape[0], p=residual / residual.sum()))
    return block, int(rng.choice(p.shape[-1], p=p[block]))
