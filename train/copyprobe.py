"""The distant-repeat copy-rate probe: does the target copy a passage it saw long ago?

One probe: a held-out passage of 256 tokens, then F tokens of other held-out code (the filler),
then the passage's first 24 tokens again; the target continues greedily for 64 tokens, compared
token by token with the passage's tokens 24..87. The copy rate is the share that match, over
all probes. Where a copy breaks shows in `breakdown`: the unbroken prefix (tokens before the
first miss) and the share of the tokens after the first miss that match at the same offset, as
the copy rate counts them (a target that picks the copy up again after a one-token miss scores near
its per-token accuracy there; one that resumes it shifted by an inserted or dropped token does
not). Probes are drawn from a seeded generator; the passages are the same at every filler length
(only the filler changes), so filler lengths compare paired.

Greedy decoding here is batched (`hyflash.models.batched.decode_batch`).
"""

from __future__ import annotations

import numpy as np
import torch

from hyflash.models.batched import decode_batch
from hyflash.models.target import Target

PASSAGE, CUE, CONTINUATION = 256, 24, 64


def probe_prompts(stream: np.ndarray, filler: int, n: int, seed: int = 0, eos: int | None = 0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """n prompts (n, 256 + filler + 24) and their expected continuations (n, 64), int64.

    Passages hold no EOS (one file each); a filler is taken at least 2,048 tokens away from its
    passage. Passages depend on `seed` only; fillers on (seed, filler).
    """
    passage_rng = np.random.default_rng([seed, 0])
    filler_rng = np.random.default_rng([seed, 1, filler])
    prompts, targets = [], []
    for _ in range(n):
        for _ in range(10_000):
            p = int(passage_rng.integers(0, len(stream) - PASSAGE))
            passage = stream[p:p + PASSAGE]
            if eos is None or not (passage == eos).any():
                break
        for _ in range(10_000):
            f = int(filler_rng.integers(0, len(stream) - filler + 1))
            if f + filler <= p - 2048 or f >= p + PASSAGE + 2048:
                break
        prompts.append(np.concatenate([passage, stream[f:f + filler], passage[:CUE]]))
        targets.append(passage[CUE:CUE + CONTINUATION])
    assert CUE + CONTINUATION <= PASSAGE
    return np.stack(prompts).astype(np.int64), np.stack(targets).astype(np.int64)


def copy_hits(model: Target, stream: np.ndarray, filler: int, n: int = 16, seed: int = 0,
              batch: int = 8, eos: int | None = 0) -> np.ndarray:
    """(n, 64) bool: which of the 64 greedy tokens equal the passage's continuation, probe by probe."""
    prompts, targets = probe_prompts(stream, filler, n, seed, eos)
    got = torch.cat([decode_batch(model, torch.from_numpy(prompts[i:i + batch]), CONTINUATION)
                     for i in range(0, n, batch)])
    return got.numpy() == targets


def copy_rate(model: Target, stream: np.ndarray, filler: int, n: int = 16, seed: int = 0,
              batch: int = 8, eos: int | None = 0) -> float:
    """Share of the 64 greedy tokens equal to the passage's continuation, over n probes."""
    return float(copy_hits(model, stream, filler, n, seed, batch, eos).mean())


def breakdown(hits: np.ndarray) -> dict[str, float | None]:
    """The copy rate of (n, 64) hits, the mean unbroken prefix (tokens before a probe's first miss; 64 if
    none), and the share of matches among the tokens after each probe's first miss (None if no probe
    missed before its last token)."""
    unbroken = np.where(hits.all(1), hits.shape[1], np.argmin(hits, axis=1))
    after = [row[k + 1:] for row, k in zip(hits, unbroken) if k + 1 < hits.shape[1]]
    return {"rate": float(hits.mean()), "unbroken": float(unbroken.mean()),
            "after_miss": float(np.concatenate(after).mean()) if after else None}


def copy_rates(model: Target, stream: np.ndarray, fillers=(256, 768, 1536), n: int = 16, seed: int = 0,
               eos: int | None = 0) -> dict[str, float]:
    """{"copy_<F>": rate} for each filler length F."""
    return {f"copy_{f}": copy_rate(model, stream, f, n, seed, eos=eos) for f in fillers}


def copy_breakdowns(model: Target, stream: np.ndarray, fillers=(256, 768, 1536), n: int = 16, seed: int = 0,
                    eos: int | None = 0) -> dict[str, dict]:
    """{"copy_<F>": breakdown} for each filler length F (its "rate" is `copy_rates`' figure)."""
    return {f"copy_{f}": breakdown(copy_hits(model, stream, f, n, seed, eos=eos)) for f in fillers}


@torch.no_grad()
def own_miss_inputs(model, tokens: torch.Tensor, copies: torch.Tensor, forced: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """tokens (n, T+1) with every copied token the model misses teacher-forced replaced by its own guess:
    the inputs a greedy copy sees right after a first miss (the misses come from one clean pass, so
    the further misses a greedy run makes after its first are not there). The labels stay `tokens`.
    `forced` (bool, like `copies`): copied tokens replaced by its best guess other than the token
    itself, missed or not."""
    logits, _ = getattr(model, "module", model)(tokens[:, :-1])
    guess = logits.argmax(-1)  # guess[:, j] is the model's choice for tokens[:, j + 1]
    miss = copies[:, 1:] & (guess != tokens[:, 1:])
    if forced is not None:
        wrong = logits.scatter(-1, tokens[:, 1:, None], float("-inf")).argmax(-1)
        guess = torch.where(miss, guess, wrong)
        miss = miss | (copies & forced)[:, 1:]
    return torch.cat([tokens[:, :1], torch.where(miss, guess, tokens[:, 1:])], dim=1)


def repeated_rows(stream: np.ndarray, filler: int, n: int, seed: int, eos: int | None) -> torch.Tensor:
    """The probe's passages for teacher forcing: (n, 256 + filler + 256), passage, filler, the whole
    passage again; its second copy starts at 256 + filler."""
    prompts, _ = probe_prompts(stream, filler, n, seed, eos)
    return torch.from_numpy(np.concatenate([prompts[:, :PASSAGE + filler], prompts[:, :PASSAGE]], axis=1))


@torch.no_grad()
def copy_accuracy(model: Target, stream: np.ndarray, filler: int, n: int = 16, seed: int = 0, batch: int = 8,
                  eos: int | None = 0) -> float:
    """The probe's passages teacher-forced: passage, filler, the whole passage again; the share of the
    second copy's tokens (after its first) that the target predicts. Greedy copying needs this near 1:
    one miss and the greedy continuation leaves the passage."""
    rows = repeated_rows(stream, filler, n, seed, eos)
    start, hits = PASSAGE + filler, 0
    for i in range(0, n, batch):
        logits, _ = model(rows[i:i + batch, :-1])
        hits += int((logits[:, start:].argmax(-1) == rows[i:i + batch, start + 1:]).sum())
    return hits / (n * (PASSAGE - 1))


@torch.no_grad()
def recovery_accuracy(model: Target, stream: np.ndarray, filler: int, n: int = 16, seed: int = 0, batch: int = 8,
                      eos: int | None = 0) -> float | None:
    """`copy_accuracy`'s rows with the target's own misses of the second copy in the inputs
    (`own_miss_inputs`): of the copy's tokens that it predicts teacher-forced and that follow a miss, the
    share it still predicts with the miss in its input (can a greedy copy pick itself up after one miss?
    1.0: every time). None if no such token."""
    rows = repeated_rows(stream, filler, n, seed, eos)
    copies = torch.zeros(rows.shape, dtype=torch.bool)
    copies[:, PASSAGE + filler + 1:] = True
    hits = total = 0
    for i in range(0, n, batch):
        tokens = rows[i:i + batch]
        inputs = own_miss_inputs(model, tokens, copies[i:i + batch])
        after = (inputs != tokens)[:, 1:-1] & (inputs == tokens)[:, 2:]  # a miss, then the copy's token
        logits, _ = model(inputs[:, :-1])
        hits += int(((logits[:, 1:].argmax(-1) == tokens[:, 2:]) & after).sum())
        total += int(after.sum())
    return hits / total if total else None


@torch.no_grad()
def induction_accuracy(model: Target, vocab: int, n: int = 8, seg: int = 128, seed: int = 0, eos: int = 0) -> float:
    """Teacher-forced next-token accuracy on the second copy of a random-token segment repeated
    back to back (the classic induction test; the first copy is unpredictable by construction)."""
    rng = np.random.default_rng([seed, 2])
    segs = rng.integers(0, vocab - 1, size=(n, seg))
    segs = segs + (segs >= eos)  # skip EOS
    tokens = torch.from_numpy(np.concatenate([segs, segs], axis=1).astype(np.int64))  # (n, 2*seg)
    logits, _ = model(tokens[:, :-1])
    pred = logits[:, seg:].argmax(-1)  # predictions of tokens seg+1 .. 2*seg-1
    return float((pred == tokens[:, seg + 1:]).float().mean())
