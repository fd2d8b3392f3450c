"""The copy curriculum: probe greedy = the target's greedy, repeat rows as declared,
--init-from continues from a folder's exact weights, and a curriculum run resumes."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hyflash.models.batched import decode_batch
from hyflash.models.config import TargetConfig
from hyflash.models.loading import load_target, save_target
from hyflash.models.target import Target, generate, greedy
from hyflash.train.copyprobe import CUE, PASSAGE, copy_rate, induction_accuracy, probe_prompts
from hyflash.train.repeats import (
    COPY2_CURRICULUM,
    COPY_CURRICULUM,
    curriculum_batch,
    natural_repeat_row,
    random_repeat_row,
    stage_at,
)
from hyflash.train.target import init_weights, reference_config

VOCAB = 64


def tiny_target(seed: int = 0, vocab: int = VOCAB) -> tuple[Target, dict]:
    raw = reference_config(vocab, 0, layers=2, hidden=64)
    model = Target(TargetConfig.from_hf(raw))
    init_weights(model, seed)
    with torch.no_grad():  # larger weights than the init, so greedy paths are not all one token
        for p in model.parameters():
            p.mul_(20.0 if p.dim() == 2 else 1.0)
    return model.eval(), raw


def test_batched_decoding_equals_the_targets_own():
    """Greedy rows equal `greedy`, row by row; a sampled row equals `generate` with the same generator."""
    model, _ = tiny_target()
    prompts = torch.from_numpy(np.random.default_rng(0).integers(0, VOCAB, size=(3, 40)))
    got = decode_batch(model, prompts, 12)
    for row, out in zip(prompts.tolist(), got.tolist()):
        assert out == greedy(model, row, 12, max_context=64)
    assert len({tuple(r) for r in got.tolist()}) > 1
    # prompts of different lengths, left-padded: each row still decodes as it would alone
    lengths = [40, 25, 33]
    padded = torch.stack([torch.cat([torch.full((40 - n,), 5), row[:n]]) for row, n in zip(prompts, lengths)])
    got_padded = decode_batch(model, padded, 12, pad=torch.tensor([40 - n for n in lengths]))
    for row, n, out in zip(prompts.tolist(), lengths, got_padded.tolist()):
        assert out == greedy(model, row[:n], 12, max_context=64)
    sampled = decode_batch(model, prompts[:1], 12, torch.ones(1), torch.Generator().manual_seed(7))
    assert sampled[0].tolist() == generate(model, prompts[0].tolist(), 12, 64, generator=torch.Generator().manual_seed(7))
    assert sampled[0].tolist() != got[0].tolist()


def test_probe_prompts_layout_and_determinism():
    stream = np.random.default_rng(1).integers(1, VOCAB, size=20_000).astype(np.uint16)
    prompts, targets = probe_prompts(stream, 100, 4, seed=3)
    assert prompts.shape == (4, PASSAGE + 100 + CUE) and targets.shape == (4, 64)
    assert (prompts[:, :CUE] == prompts[:, -CUE:]).all()
    assert (prompts[:, CUE:CUE + 64] == targets).all()
    again, _ = probe_prompts(stream, 300, 4, seed=3)
    assert (again[:, :PASSAGE] == prompts[:, :PASSAGE]).all()  # same passages at every filler length
    model, _ = tiny_target()
    assert 0.0 <= copy_rate(model, stream, 100, n=3, batch=2) <= 1.0
    assert 0.0 <= induction_accuracy(model, VOCAB, n=2, seg=16) <= 1.0


def test_random_repeat_rows_hold_their_declared_repeats():
    rng = np.random.default_rng(0)
    for _ in range(20):
        row, reps = random_repeat_row(rng, 2049, 4096, 0, (16, 256), (0, 1536))
        assert row.shape == (2049,) and (row != 0).all() and reps
        for r in reps:
            assert 16 <= r.length <= 256 and 0 <= r.dst - (r.src + r.length) <= 1536
            assert (row[r.dst:r.dst + r.length] == row[r.src:r.src + r.length]).all()


def test_natural_repeat_rows_hold_their_declared_repeat():
    stream = np.arange(100_000, dtype=np.int64) % 50_000  # every token tells where it came from
    rng = np.random.default_rng(0)
    for gap in ((16, 256), (256, 1800)):
        for _ in range(20):
            row, r = natural_repeat_row(stream, rng, 2049, (64, 512), gap)
            assert row.shape == (2049,) and 64 <= r.length <= 512
            assert gap[0] <= r.dst - (r.src + r.length) <= gap[1]
            assert (row[r.dst:r.dst + r.length] == row[r.src:r.src + r.length]).all()
            # outside the inserted copy the row is one contiguous window of the stream
            rest = np.concatenate([row[:r.dst], row[r.dst + r.length:]])
            assert (np.diff(rest) == 1).all()


def test_curriculum_batches_by_stage():
    stream = np.random.default_rng(0).integers(1, 4096, size=50_000).astype(np.uint16)
    assert stage_at(COPY_CURRICULUM, 0) is COPY_CURRICULUM[0]
    assert stage_at(COPY_CURRICULUM, 10**6) is COPY_CURRICULUM[-1]
    for step in (0, 500, 1000, 5000):
        b, w = curriculum_batch(stream, 4096, 0, COPY_CURRICULUM, step, np.random.default_rng(step), 4, 2049)
        assert b.shape == w.shape == (4, 2049) and b.dtype == np.int64 and (w == 1).all()
    small, _ = curriculum_batch(stream, 4096, 0, COPY_CURRICULUM, 0, np.random.default_rng(0), 3, 65)
    assert small.shape == (3, 65)


def test_copy2_weighs_the_copies_and_drops_unpredictable_tokens():
    """copy2 draws what copy drew before step 525; after, a repeated copy's predictable tokens weigh 3 and a
    random row's other tokens 0."""
    stream = np.random.default_rng(0).integers(1, 4096, size=50_000).astype(np.uint16)
    for step in (0, 400):
        a = curriculum_batch(stream, 4096, 0, COPY_CURRICULUM, step, np.random.default_rng(step), 4, 2049)
        b = curriculum_batch(stream, 4096, 0, COPY2_CURRICULUM, step, np.random.default_rng(step), 4, 2049)
        assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
    rows, w = curriculum_batch(stream, 4096, 0, COPY2_CURRICULUM, 600, np.random.default_rng(1), 32, 2049)
    assert set(np.unique(w)) == {0.0, 1.0, 3.0}
    for row, wr in zip(rows, w):
        if (wr == 0).any():  # a random row: weight only on copies, which repeat earlier tokens
            for j in np.flatnonzero(wr == 3.0)[:50]:
                assert row[j] in row[:j - 1]


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    out = tmp_path_factory.mktemp("corpus")
    words = [f"w{i}" for i in range(1, VOCAB)]
    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, **{w: i + 1 for i, w in enumerate(words)}},
                                     unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.save(str(out / "tokenizer.json"))
    rng = np.random.default_rng(0)
    for side, n in (("train", 20_000), ("heldout", 6_000)):
        (out / f"{side}.txt").write_text(" ".join(words[i] for i in rng.integers(0, len(words), n)) + "<|endoftext|>")
    model, raw = tiny_target(1)
    save_target(model, out / "init", raw)
    (out / "init" / "tokenizer.json").write_bytes((out / "tokenizer.json").read_bytes())
    return out


def test_init_from_loads_the_weights_exactly(tiny_corpus):
    from hyflash.train.target import _init_from

    model, raw = _init_from(tiny_corpus / "init", tiny_corpus / "tokenizer.json")
    ref = load_target(tiny_corpus / "init")
    assert raw == json.loads((tiny_corpus / "init" / "config.json").read_text())
    for (name, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), name
    other = tiny_corpus / "other_tok.json"
    other.write_text("{}")
    with pytest.raises(ValueError, match="differs"):
        _init_from(tiny_corpus / "init", other)


def _train_target(tiny_corpus, run, curriculum, *flags):
    """train-target from the tiny corpus's init on `curriculum`, 2 rows of 64 tokens."""
    from hyflash.cli import main

    return main(["research", "train-target", "--corpus", str(tiny_corpus), "--tokenizer",
                 str(tiny_corpus / "tokenizer.json"),
                 "--out", str(run), "--init-from", str(tiny_corpus / "init"), "--curriculum", curriculum,
                 "--seq-len", "64", "--batch", "2", "--warmup", "1", *flags])


def _log(run) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_curriculum_run_with_init_from_and_probe_resumes(tiny_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    flags = ["--probe-every", "2", "--checkpoint-every", "2", "--lr", "1e-4"]
    assert _train_target(tiny_corpus, run, "copy", *flags, "--steps", "2") == 0
    assert _train_target(tiny_corpus, run, "copy", *flags, "--steps", "4") == 0  # resumes at step 2; probes after 2 updates
    log = _log(run)
    assert [e["step"] for e in log] == [1, 2, 3, 4]
    probed = [e for e in log if "copy_256" in e]
    assert [e["probe_after"] for e in probed] == [2.0] and "heldout_loss" in probed[0]
    assert {"after_miss_256", "recovery_256", "after_miss_1536", "recovery_1536"} <= set(probed[0])
    assert '"probe"' in capsys.readouterr().out
    cfg = json.loads((run / "train_config.json").read_text())
    assert cfg["curriculum"] == "copy" and cfg["init_from"].endswith("init")
    # one step from the init at lr 1e-4 stays close to it (it did start from those weights)
    start, end = load_target(tiny_corpus / "init"), load_target(run / "model")
    diff = max((a - b).abs().max().item() for a, b in zip(start.state_dict().values(), end.state_dict().values()))
    assert 0 < diff < 0.05


def test_stop_after_ends_a_run_early_on_the_full_schedule(tiny_corpus, tmp_path):
    """--stop-after N: the run ends after step N with the lr of --steps' schedule, writes its model, and
    resumes to the end later (a stage cut short, as research/scripts/target_v3.sh records)."""
    from hyflash.train.loop import TrainConfig

    run = tmp_path / "run"
    flags = ["--checkpoint-every", "5", "--steps", "6", "--lr", "1e-3"]
    assert _train_target(tiny_corpus, run, "offset", *flags, "--stop-after", "3") == 0
    log = _log(run)
    schedule = TrainConfig(out=run, steps=6, batch=2, lr=1e-3, warmup=1)
    assert [e["step"] for e in log] == [1, 2, 3] and log[-1]["lr"] == schedule.lr_at(2)
    assert (run / "model" / "config.json").is_file()
    assert _train_target(tiny_corpus, run, "offset", *flags) == 0
    assert [e["step"] for e in _log(run)] == [1, 2, 3, 4, 5, 6]


def test_small_alphabet_random_rows_repeat_exactly_and_recur_within_a_segment():
    """ngram's random rows: tokens from a few ids (so a token recurs inside a segment), repeats still exact,
    EOS never drawn; the stage draws the alphabet size per row in its range."""
    from hyflash.train.repeats import NGRAM_CURRICULUM

    rng = np.random.default_rng(1)
    for symbols in (8, 40):
        row, reps = random_repeat_row(rng, 2049, 4096, 0, (64, 256), (0, 512), symbols)
        assert len(set(row.tolist())) <= symbols and 0 not in row
        for r in reps:
            assert (row[r.dst:r.dst + r.length] == row[r.src:r.src + r.length]).all()
            assert len(set(row[r.src:r.src + r.length].tolist())) < r.length  # tokens recur in the segment
    rows, _ = curriculum_batch(np.arange(1, 50_000), 4096, 0, NGRAM_CURRICULUM, 0, np.random.default_rng(2), 16, 257)
    sizes = {len(set(r.tolist())) for r in rows}
    assert min(sizes) <= 64 and max(sizes) > 64  # small-alphabet random rows beside natural and plain ones


def test_teacher_forced_copy_accuracy_scores_the_second_copy_one_sequence_at_a_time():
    """copy_accuracy = the share of the repeated passage's tokens (after its first) that the target's argmax
    predicts, given the passage, the filler and the copy so far: batching changes nothing, and it is the
    per-sequence count done by hand."""
    from hyflash.train.copyprobe import copy_accuracy

    stream = np.random.default_rng(1).integers(1, VOCAB, size=20_000).astype(np.int64)
    model, _ = tiny_target()
    got = copy_accuracy(model, stream, 40, n=3, batch=2)
    assert got == copy_accuracy(model, stream, 40, n=3, batch=1)
    prompts, _ = probe_prompts(stream, 40, 3)
    hits = 0
    for p in prompts:
        row = torch.from_numpy(np.concatenate([p[:PASSAGE + 40], p[:PASSAGE]]))[None]
        with torch.no_grad():
            logits, _ = model(row)
        hits += sum(int(logits[0, PASSAGE + 40 + j].argmax()) == int(row[0, PASSAGE + 40 + j + 1])
                    for j in range(PASSAGE - 1))
    assert got == hits / (3 * (PASSAGE - 1))


def test_edited_copies_keep_the_copy_around_their_edits():
    """copy7 = copy6 with edits: runs of 1-3 substituted tokens inside a copy (none in its first 8 tokens nor at
    its last), out of the loss; every other token of the copy still repeats its source, and the copied token
    after an edit keeps the copy's weight (the model learns to pick the copy up again)."""
    from hyflash.train.repeats import COPY6_CURRICULUM, COPY7_CURRICULUM, Repeat, edit_copy

    stream = np.arange(1, 100_001, dtype=np.int64)  # every token tells where it came from
    rng = np.random.default_rng(0)
    edited = total = 0
    for _ in range(200):
        row, r = natural_repeat_row(stream, rng, 2049, (64, 512), (0, 1800))
        w = np.ones(2049, np.float32)
        w[r.dst + 1:r.dst + r.length] = 8.0
        clean = row.copy()
        runs = edit_copy(row, w, r, 1 / 30, rng)
        out = np.zeros(2049, bool)
        for start, k in runs:
            assert 1 <= k <= 3 and r.dst + 8 <= start and start + k < r.dst + r.length
            out[start:start + k] = True
            assert w[start + k] == 8.0  # the copied token after the edit is learnt
        assert (w[out] == 0).all() and (w[~out] > 0).all()
        assert (row[~out] == clean[~out]).all()
        edited, total = edited + len(runs), total + r.length - 9
    assert 1 / 45 < edited / total < 1 / 25
    assert edit_copy(row, w, Repeat(0, 64, 100), 0.0, rng) == []
    # natural rows (weights 1 and 8) carry edits (weight 0) under copy7, none under copy6
    for schedule, has_edits in ((COPY6_CURRICULUM, False), (COPY7_CURRICULUM, True)):
        _, w = curriculum_batch(stream, 4096, 0, schedule, 0, np.random.default_rng(3), 16, 2049)
        natural = [wr for wr in w if (wr == 1).any() and (wr == 8).any()]
        assert natural and any((wr == 0).any() for wr in natural) == has_edits


def test_copy_breakdown_says_where_copies_break_and_whether_they_recover():
    from hyflash.train.copyprobe import breakdown, copy_breakdowns, copy_rates

    hits = np.ones((3, 8), bool)
    hits[0, 2:] = False  # broken after 2, never back
    hits[1, 5] = False  # one miss, then the copy again
    got = breakdown(hits)
    assert got["rate"] == hits.mean() and got["unbroken"] == (2 + 5 + 8) / 3
    assert got["after_miss"] == 2 / (5 + 2)  # probe 0's 5 tokens after its miss, probe 1's 2
    assert breakdown(np.ones((2, 8), bool))["after_miss"] is None
    stream = np.random.default_rng(1).integers(1, VOCAB, size=20_000).astype(np.uint16)
    model, _ = tiny_target()
    rates = copy_rates(model, stream, (40, 100), n=3)
    assert {k: b["rate"] for k, b in copy_breakdowns(model, stream, (40, 100), n=3).items()} == rates


def test_own_misses_enter_the_copies_inputs_and_the_labels_stay_the_copy():
    """copy8: each copied token the model misses teacher-forced is replaced in the inputs by its own guess;
    nothing else changes, and the loss is the weighted cross-entropy of the model on those inputs against the
    original tokens. Rows and weights are copy6's; the copy mask marks each copy's tokens after its first."""
    import torch.nn.functional as F

    from hyflash.train.copytrain import CopyCurriculum, WeightedRows, own_miss_inputs, weighted_lm_loss
    from hyflash.train.repeats import COPY6_CURRICULUM, COPY8_CURRICULUM, curriculum_rows

    stream = np.random.default_rng(0).integers(1, VOCAB, size=50_000).astype(np.uint16)
    rows, w, copies, forced = curriculum_rows(stream, VOCAB, 0, COPY8_CURRICULUM, 0, np.random.default_rng(4), 6, 257)
    six = curriculum_batch(stream, VOCAB, 0, COPY6_CURRICULUM, 0, np.random.default_rng(4), 6, 257)
    assert (rows == six[0]).all() and (w == six[1]).all() and copies.any() and forced is None
    assert (w[copies] == 8.0).all() and not copies[:, 0].any()
    for row, c in zip(rows, copies):  # a copied token repeats an earlier one
        for j in np.flatnonzero(c)[:20]:
            assert row[j] in row[:j]
    model, _ = tiny_target()
    tokens, mask = torch.from_numpy(rows), torch.from_numpy(copies)
    inputs = own_miss_inputs(model, tokens, mask)
    guess = model(tokens[:, :-1])[0].argmax(-1)
    changed = inputs != tokens
    assert changed.any() and (changed <= mask).all()  # only copied tokens, and some of them
    assert (inputs[:, 1:][changed[:, 1:]] == guess[changed[:, 1:]]).all()
    assert (guess[mask[:, 1:] & ~changed[:, 1:]] == tokens[:, 1:][mask[:, 1:] & ~changed[:, 1:]]).all()
    batch = WeightedRows(rows, w, copies)
    ce = F.cross_entropy(model(inputs[:, :-1])[0].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    wt = torch.from_numpy(w[:, 1:]).flatten()
    assert torch.allclose(weighted_lm_loss(model, batch, own_misses=True), (ce * wt).sum() / wt.sum())
    assert not torch.allclose(weighted_lm_loss(model, batch, own_misses=True), weighted_lm_loss(model, batch))
    assert batch[1:3].copies.shape == (2, 257)
    # the curriculum object draws these rows and this loss for a copy8 run, and copy6's for a copy6 run
    for name, own in (("copy8", True), ("copy6", False)):
        cur = CopyCurriculum(stream, None, VOCAB, 0, 256, Path("/nonexistent"), name)
        drawn = cur.batch_fn(np.random.default_rng(4), 6)
        assert (drawn.tokens == rows).all() and (drawn.copies == copies).all()
        assert torch.equal(cur.loss_fn(model, drawn)[0], weighted_lm_loss(model, batch, own_misses=own))


def test_recovery_accuracy_is_the_copy_after_one_own_miss():
    """recovery_accuracy, recomputed one row at a time: the second copy's tokens the target misses teacher-forced
    become its guesses in the input; at each position right after a miss whose next token it got right, does
    it still predict that token? Batching changes nothing."""
    from hyflash.train.copyprobe import recovery_accuracy

    stream = np.random.default_rng(1).integers(1, VOCAB, size=20_000).astype(np.uint16)
    model, _ = tiny_target()
    prompts, _ = probe_prompts(stream, 40, 3)
    hits = total = 0
    for p in prompts:
        row = np.concatenate([p[:PASSAGE + 40], p[:PASSAGE]])
        start = PASSAGE + 40
        guess = model(torch.from_numpy(row[None, :-1]))[0][0].argmax(-1).numpy()
        inputs = row.copy()
        for j in range(start + 1, len(row)):
            if guess[j - 1] != row[j]:
                inputs[j] = guess[j - 1]
        again = model(torch.from_numpy(inputs[None, :-1]))[0][0].argmax(-1).numpy()
        for j in range(start + 1, len(row) - 1):
            if inputs[j] != row[j] and inputs[j + 1] == row[j + 1]:
                total += 1
                hits += int(again[j] == row[j + 1])
    assert total > 0
    assert recovery_accuracy(model, stream, 40, n=3, batch=2) == recovery_accuracy(model, stream, 40, n=3, batch=1) == hits / total


def test_forced_misses_put_the_models_best_wrong_guess_in_the_copy():
    """copy9: copy8, and a drawn 12% of the copied tokens replaced by the model's best guess other than the
    token itself (its own misses still replaced by its guess); nothing outside the copies changes."""
    from hyflash.train.copytrain import WeightedRows, own_miss_inputs, weighted_lm_loss
    from hyflash.train.repeats import COPY9_CURRICULUM, curriculum_rows

    stream = np.random.default_rng(0).integers(1, VOCAB, size=50_000).astype(np.uint16)
    rows, w, copies, forced = curriculum_rows(stream, VOCAB, 0, COPY9_CURRICULUM, 0, np.random.default_rng(5), 8, 257)
    assert (forced <= copies).all() and 0.08 < forced.sum() / copies.sum() < 0.16
    model, _ = tiny_target()
    tokens = torch.from_numpy(rows)
    logits = model(tokens[:, :-1])[0]
    inputs = own_miss_inputs(model, tokens, torch.from_numpy(copies), torch.from_numpy(forced))
    f = torch.from_numpy(forced)[:, 1:]
    second = logits.topk(2, -1).indices
    best_wrong = torch.where(second[..., 0] == tokens[:, 1:], second[..., 1], second[..., 0])
    assert (inputs[:, 1:][f] == best_wrong[f]).all() and (inputs[:, 1:][f] != tokens[:, 1:][f]).all()
    own = torch.from_numpy(copies)[:, 1:] & ~f & (logits.argmax(-1) != tokens[:, 1:])
    assert (inputs[:, 1:][own] == logits.argmax(-1)[own]).all()
    rest = ~(f | own)
    assert (inputs[:, 1:][rest] == tokens[:, 1:][rest]).all() and inputs[:, 0].equal(tokens[:, 0])
    batch = WeightedRows(rows, w, copies, forced)
    assert batch[2:4].forced.shape == (2, 257)
    assert not torch.allclose(weighted_lm_loss(model, batch, True), weighted_lm_loss(model, WeightedRows(rows, w, copies), True))
