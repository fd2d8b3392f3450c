"""Training rows with repeated spans, for the target's copy curriculum.

Three kinds of row, each `length` tokens (the loss stays plain next-token LM loss on all tokens):

- random: random tokens, packed with episodes "segment, gap, the same segment again" (the classic
  way induction heads form: nothing but copying predicts the second copy);
- natural: a window of the stdlib train stream in which a span of 64-512 tokens is re-inserted
  verbatim `gap` tokens after the end of its first occurrence;
- plain: a window of the stream.

A stage may also edit its copies (`edits`): runs of 1-3 tokens inside a copy replaced by tokens from
elsewhere in the row, out of the loss, the copied tokens after them in it. A greedy copy that
misses one token drifts into the model's own text; edited copies teach it to pick the copy up again.
Or its own misses (`own_misses`, applied by the loss in train/copytrain.py, which has the model): each
copied token the model gets wrong teacher-forced is replaced in the inputs by its guess, the labels
stay the copy's; `forced_misses` more copied tokens, drawn at that rate, are replaced by the model's
best guess other than the copy's token (a plausible miss where it made none).

A `Repeat(src, length, dst)` says row[dst:dst+length] == row[src:src+length], with
gap = dst - (src + length).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Repeat:
    src: int
    length: int
    dst: int


def random_tokens(rng: np.random.Generator, n: int, vocab: int, eos: int) -> np.ndarray:
    """n uniform token ids in [0, vocab), EOS excluded: (n,) int64."""
    ids = rng.integers(0, vocab - 1, size=n)
    return ids + (ids >= eos)


def random_repeat_row(rng: np.random.Generator, length: int, vocab: int, eos: int,
                      seg: tuple[int, int], gap: tuple[int, int], symbols: int | None = None
                      ) -> tuple[np.ndarray, list[Repeat]]:
    """(length,) int64 random tokens packed with repeat episodes; the episodes it declares. `symbols`:
    the row's tokens come from that many ids (drawn per row), so a token recurs within a segment and only
    the tokens before it tell where a copy is (copying by longer matches, as code needs)."""
    if symbols:
        alphabet = random_tokens(rng, symbols, vocab, eos)
        row = alphabet[rng.integers(0, symbols, size=length)]
    else:
        row = random_tokens(rng, length, vocab, eos)
    repeats, pos = [], 0
    while True:
        s = int(rng.integers(seg[0], seg[1] + 1))
        g = int(rng.integers(gap[0], gap[1] + 1))
        if pos + 2 * s + g > length:
            break
        row[pos + s + g:pos + 2 * s + g] = row[pos:pos + s]
        repeats.append(Repeat(pos, s, pos + s + g))
        pos += 2 * s + g
    return row, repeats


def natural_repeat_row(stream: np.ndarray, rng: np.random.Generator, length: int,
                       span: tuple[int, int], gap: tuple[int, int]) -> tuple[np.ndarray, Repeat]:
    """(length,) int64: a stream window with one span re-inserted after a gap; the repeat."""
    g = int(rng.integers(gap[0], gap[1] + 1))
    hi = min(span[1], (length - g) // 2)
    if hi < span[0]:
        raise ValueError(f"a gap of {g} leaves no room for a span of {span[0]} in {length} tokens")
    s = int(rng.integers(span[0], hi + 1))
    a = int(rng.integers(0, length - 2 * s - g + 1))
    start = int(rng.integers(0, len(stream) - (length - s)))
    text = stream[start:start + length - s].astype(np.int64)  # (length - s,)
    dst = a + s + g
    row = np.concatenate([text[:dst], text[a:a + s], text[dst:]])
    return row, Repeat(a, s, dst)


def edit_copy(row: np.ndarray, weights: np.ndarray, repeat: Repeat, rate: float, rng: np.random.Generator,
              keep: int = 8) -> list[tuple[int, int]]:
    """Edit the copy row[dst:dst+length] in place: from its `keep`-th token on, runs of 1-3 tokens begin
    with chance `rate` per token, each replaced by a contiguous slice from elsewhere in the row; their
    weights (the weights of predicting them) go to 0. The copy's last token is never edited, so every
    run is followed by a copied token. Returns the runs as (start, length)."""
    runs, pos, end = [], repeat.dst + keep, repeat.dst + repeat.length - 1
    while rate > 0:
        pos += int(rng.geometric(rate)) - 1
        if pos >= end:
            break
        k = min(int(rng.integers(1, 4)), end - pos)
        s = int(rng.integers(0, len(row) - k + 1))
        row[pos:pos + k] = row[s:s + k].copy()
        weights[pos:pos + k] = 0.0
        runs.append((pos, k))
        pos += k + 1
    return runs


@dataclasses.dataclass(frozen=True)
class Stage:
    until: int  # the stage holds for steps < until
    shares: tuple[float, float, float]  # random, natural, plain
    natural_gap: tuple[int, int]
    random_seg: tuple[int, int]
    random_gap: tuple[int, int]
    span: tuple[int, int] = (64, 512)
    copy_weight: float = 1.0  # loss weight of the predictable tokens of a repeated copy
    random_weight: float = 1.0  # loss weight of a random row's other tokens (unpredictable by construction)
    symbols: tuple[int, int] | None = None  # random rows drawn from this many ids (a range; None: all)
    edits: float = 0.0  # per copied token, the chance that an edit (1-3 substituted tokens) begins there
    own_misses: bool = False  # the copies' inputs carry the model's own misses (train/copytrain.py)
    forced_misses: float = 0.0  # with own_misses: the share of copied tokens given its best wrong guess


# Short gaps first, random-token induction early; then long natural repeats and more plain text.
COPY_CURRICULUM = (
    Stage(300, (0.50, 0.35, 0.15), natural_gap=(16, 256), random_seg=(16, 128), random_gap=(0, 128)),
    Stage(800, (0.30, 0.45, 0.25), natural_gap=(64, 1024), random_seg=(32, 256), random_gap=(0, 768)),
    Stage(1400, (0.20, 0.45, 0.35), natural_gap=(256, 1800), random_seg=(32, 256), random_gap=(0, 1536)),
    Stage(10**9, (0.10, 0.45, 0.45), natural_gap=(256, 1800), random_seg=(32, 256), random_gap=(0, 1536)),
)
# copy2: the run that showed no copying at step 525 (copy rate 2%, second-copy loss = first-copy
# loss even for an immediate repeat) continues with more repeats, short gaps again, the copies'
# loss weighted 3x and the unpredictable random tokens out of the loss; steps < 525 as in copy.
COPY2_CURRICULUM = (
    COPY_CURRICULUM[0],
    dataclasses.replace(COPY_CURRICULUM[1], until=525),
    Stage(1100, (0.45, 0.45, 0.10), natural_gap=(0, 512), random_seg=(16, 128), random_gap=(0, 256),
          copy_weight=3.0, random_weight=0.0),
    Stage(1600, (0.30, 0.50, 0.20), natural_gap=(128, 1800), random_seg=(32, 256), random_gap=(0, 1536),
          copy_weight=3.0, random_weight=0.0),
    Stage(10**9, (0.10, 0.45, 0.45), natural_gap=(256, 1800), random_seg=(32, 256), random_gap=(0, 1536)),
)
# offset, then induction: the road to copying after copy/copy2 (1,000 steps) showed none.
# offset: a 64-token random segment repeated after one token, once per row, loss on the second copy only
# (at --seq-len 256 the lengths scale by 1/8; the scaled gap is at least 1). The copy loss fell from chance
# (8.33) to 0.08 between steps 60 and 125 (16 rows, lr 1e-3), but what formed is a copy from a fixed
# distance: accuracy 100% at that distance, 0-1% at any other (segments of 40 or 128 tokens, other gaps).
OFFSET_CURRICULUM = (
    Stage(10**9, (1.0, 0.0, 0.0), natural_gap=(16, 256), random_seg=(512, 512), random_gap=(0, 0),
          random_weight=0.0),
)
# induction: segments of 32-64 tokens and gaps of 0-32 (at --seq-len 256), packed, so that only finding the
# current token earlier in the row (the induction circuit) predicts the copy. (From the embedded step-1,000
# model directly, 16-64 / 0-32 under a cosine lr stayed at chance for 150 steps.)
INDUCTION_CURRICULUM = (
    Stage(10**9, (1.0, 0.0, 0.0), natural_gap=(16, 256), random_seg=(256, 512), random_gap=(0, 256),
          random_weight=0.0),
)
# ngram: induction on random rows from a small alphabet (8-64 ids a row), where the current token recurs
# within a segment and only longer matches locate a copy; natural repeats and plain text beside them. After
# copy3 steps 1-175 the target copied random tokens (98%) but not code (59% of a repeated passage's tokens
# teacher-forced, 4% greedily): code's tokens recur everywhere, so a one-token match is ambiguous there too.
NGRAM_CURRICULUM = (
    Stage(10**9, (0.5, 0.3, 0.2), natural_gap=(0, 512), random_seg=(256, 512), random_gap=(0, 256),
          copy_weight=2.0, random_weight=0.0, symbols=(8, 64)),
)
# copy4: after `ngram` (which made copying by longer matches work: random rows of an 8-id alphabet 50% ->
# 96% copied) the target still copied repeated code only 62% teacher-forced: its own prediction wins over
# the copy in text it can model. So natural repeats carry most of the loss: 60% of the rows, copies 4x,
# gaps up to 1,800 tokens, plus plain text and a few small-alphabet random rows.
COPY4_CURRICULUM = (
    Stage(10**9, (0.1, 0.6, 0.3), natural_gap=(0, 1800), random_seg=(64, 256), random_gap=(0, 1536),
          copy_weight=4.0, random_weight=0.0, symbols=(8, 64)),
)
# copy5: after `copy4` plateaued (repeated code 85% teacher-forced, 10-12% greedily: one miss in ~7 tokens
# ends a greedy copy), the copies carry still more of the loss: natural repeats in 80% of the rows, copies
# 8x, no random rows, plain text beside them (held-out loss had 1 nat of slack against its bar).
COPY5_CURRICULUM = (
    Stage(10**9, (0.0, 0.8, 0.2), natural_gap=(0, 1800), random_seg=(64, 256), random_gap=(0, 1536),
          copy_weight=8.0, random_weight=0.0),
)
# copy3: after `induction`, the circuit stretched to long gaps and carried over to natural text (copies
# weighted 2x, random rows' unpredictable tokens out of the loss), with plain text throughout to bring the
# plain loss back (induction-only training had taken it from 3.5 to 7.5); then plain loss with long repeats.
COPY3_CURRICULUM = (
    Stage(100, (0.40, 0.40, 0.20), natural_gap=(0, 512), random_seg=(32, 256), random_gap=(0, 512),
          copy_weight=2.0, random_weight=0.0),
    Stage(300, (0.25, 0.45, 0.30), natural_gap=(128, 1800), random_seg=(32, 256), random_gap=(0, 1536),
          copy_weight=2.0, random_weight=0.0),
    Stage(10**9, (0.10, 0.45, 0.45), natural_gap=(256, 1800), random_seg=(32, 256), random_gap=(0, 1536),
          random_weight=0.0),
)
# copy6: copy5 with random-token rows back (15%, their copies in the loss, the rest out): under copy5 the
# induction accuracy on random tokens fell from 0.90 to 0.47 while natural copying rose; an A/B from the
# same weights (copy5b) asks whether keeping the random copies helps the natural ones.
COPY6_CURRICULUM = (
    Stage(10**9, (0.15, 0.7, 0.15), natural_gap=(0, 1800), random_seg=(64, 256), random_gap=(0, 1536),
          copy_weight=8.0, random_weight=0.0),
)
# copy7: copy6 with edited copies (about one edit in 30 copied tokens). After copy6 the target predicted
# 92-96% of a distant copy's tokens teacher-forced, but its greedy copies of held-out code stopped at the
# first miss (after it, 4-13% of the tokens matched): it drifts into its own text and rarely comes back.
COPY7_CURRICULUM = (dataclasses.replace(COPY6_CURRICULUM[0], edits=1 / 30),)
# copy8: copy6 with the model's own misses in the copies' inputs. copy7's random substitutes did not
# carry over (150 steps: after a greedy miss still 8-15% of the copy's tokens matched): a substitute from
# elsewhere reads as noise, while a greedy miss is a token the model finds likely, and its own text then
# pulls it on. Here the miss is the model's own guess, and the next label is the copy's.
COPY8_CURRICULUM = (dataclasses.replace(COPY6_CURRICULUM[0], own_misses=True),)
# copy9: copy8 with more misses. After 200 steps of copy8 the target still predicted only 18-21% of the copied
# tokens that follow one of its misses (research/results/target_v3_copy8_200.json; copy6 the same): its own misses are
# 4-9% of a copy's tokens, 2-3% of the loss. Here a further 12% of the copied tokens carry its best wrong guess.
COPY9_CURRICULUM = (dataclasses.replace(COPY8_CURRICULUM[0], forced_misses=0.12),)
# recover: induction's random-token rows with edited copies (one edit in 8 copied tokens), loss on the copies
# only: picking a copy up again after a token that is not in it, where no language prior pulls elsewhere (as
# `induction` formed copying itself, before code carried it). Tried from the second-generation target (150
# steps, 16 x 256, lr 1e-3): it broke what was there (random-token induction 99% -> 5%, held-out loss on 4
# windows 2.9 -> 5.4) and formed no recovery; not used further.
RECOVER_CURRICULUM = (dataclasses.replace(INDUCTION_CURRICULUM[0], edits=1 / 8),)
CURRICULA = {"copy": COPY_CURRICULUM, "copy2": COPY2_CURRICULUM, "offset": OFFSET_CURRICULUM,
             "induction": INDUCTION_CURRICULUM, "copy3": COPY3_CURRICULUM, "ngram": NGRAM_CURRICULUM,
             "copy4": COPY4_CURRICULUM, "copy5": COPY5_CURRICULUM,
             "copy6": COPY6_CURRICULUM, "copy7": COPY7_CURRICULUM,
             "copy8": COPY8_CURRICULUM, "copy9": COPY9_CURRICULUM,
             "recover": RECOVER_CURRICULUM}


def stage_at(schedule: tuple[Stage, ...], step: int) -> Stage:
    return next(s for s in schedule if step < s.until)


def scaled(stage: Stage, length: int, full: int = 2049) -> Stage:
    """The stage's lengths scaled to rows shorter than the 2,049 tokens it is written for (tests)."""
    if length >= full:
        return stage
    f = lambda r: (max(1, r[0] * length // full), max(1, r[1] * length // full))  # noqa: E731
    return dataclasses.replace(stage, natural_gap=f(stage.natural_gap), random_seg=f(stage.random_seg),
                               random_gap=f(stage.random_gap), span=f(stage.span))


def curriculum_batch(stream: np.ndarray, vocab: int, eos: int, schedule: tuple[Stage, ...], step: int,
                     rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, length) int64 rows, each row's kind drawn with the stage's shares, and (n, length) float32
    loss weights of the tokens (the weight of predicting token j sits at [:, j])."""
    return curriculum_rows(stream, vocab, eos, schedule, step, rng, n, length)[:2]


def curriculum_rows(stream: np.ndarray, vocab: int, eos: int, schedule: tuple[Stage, ...], step: int,
                    rng: np.random.Generator, n: int, length: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """`curriculum_batch`'s rows and weights, (n, length) bool: the tokens a copy predicts (a copy's tokens
    after its first, edits out), and (n, length) bool: the copied tokens drawn for a forced miss (None
    when the stage forces none)."""
    stage = scaled(stage_at(schedule, step), length)
    kinds = rng.choice(3, size=n, p=np.asarray(stage.shares) / sum(stage.shares))
    rows, weights, copies = [], [], []
    for kind in kinds:
        w, c = np.ones(length, np.float32), np.zeros(length, bool)
        if kind == 0:
            symbols = int(rng.integers(stage.symbols[0], stage.symbols[1] + 1)) if stage.symbols else None
            row, repeats = random_repeat_row(rng, length, vocab, eos, stage.random_seg, stage.random_gap, symbols)
            w[:] = stage.random_weight
        elif kind == 1:
            row, repeat = natural_repeat_row(stream, rng, length, stage.span, stage.natural_gap)
            repeats = [repeat]
        else:
            start = int(rng.integers(0, len(stream) - length))
            row, repeats = stream[start:start + length].astype(np.int64), []
        for r in repeats:  # the copy's first token is not predictable from what precedes it
            w[r.dst + 1:r.dst + r.length] = stage.copy_weight
            c[r.dst + 1:r.dst + r.length] = True
            for start, k in edit_copy(row, w, r, stage.edits, rng):
                c[start:start + k] = False
        rows.append(row)
        weights.append(w)
        copies.append(c)
    copies = np.stack(copies)
    forced = copies & (rng.random(copies.shape) < stage.forced_misses) if stage.forced_misses else None
    return np.stack(rows), np.stack(weights), copies, forced
