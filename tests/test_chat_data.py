"""Chat training data made here: batched answers that stop at end of turn, with the taps' features and the
target's argmax from the same pass; conversations answered turn by turn as `hyflash chat` renders them;
self-written questions and writing tasks; prompts that never near-duplicate the held-out chat set."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_copy_curriculum import VOCAB, tiny_target
from test_real_vocab import write_checkpoint

from hyflash.models.batched import answer_batch
from hyflash.models.generation import load_tokenizer
from hyflash.models.loading import load_target
from hyflash.models.target import greedy
from hyflash.train.chatprompts import (
    CODE_OPENERS,
    FOLLOW_UPS,
    QUESTION_OPENERS,
    SHORT_WORDS,
    PromptMix,
    _mutate,
    build,
    code_prompts,
    kept_batches,
    magpie,
    near_duplicate,
    normalise,
    read_conversations,
)

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "data" / "chat" / "heldout.jsonl"
TRAIN_PROMPTS = ROOT / "data" / "chat" / "train-prompts.jsonl"


def test_answers_stop_at_end_of_turn_and_equal_the_targets_own_greedy():
    model, _ = tiny_target()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, VOCAB, size=n).tolist() for n in (30, 17, 24, 9, 30)]
    full = [greedy(model, p, 16, max_context=64) for p in prompts]
    stop = full[1][5]  # row 1 ends at its 6th token; the others wherever this id first appears
    got = answer_batch(model, prompts, 16, stop=(stop,))
    for answer, ref in zip(got, full):
        end = ref.index(stop) + 1 if stop in ref else 16
        assert answer.tokens == ref[:end]  # finished rows leaving the batch change no other row
    assert len(got[1].tokens) == 6 and any(len(a.tokens) == 16 for a in got)


def test_answer_features_and_labels_are_the_full_forwards():
    model, _ = tiny_target()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, VOCAB, size=n).tolist() for n in (21, 12, 30)]
    temperature = torch.tensor([0.0, 1.0, 0.0])
    got = answer_batch(model, prompts, 10, temperature, torch.Generator().manual_seed(3), stop=(7,),
                       taps=model.taps)
    for p, a in zip(prompts, got):
        row = p + a.tokens
        with torch.no_grad():
            logits, feats = model(torch.tensor([row]))
        n = len(row)
        assert a.features.shape == (n, model.feature_size) and a.features.dtype == np.float16
        np.testing.assert_allclose(a.features[:n - 1].astype(np.float32), feats[0, :n - 1].numpy(),
                                   rtol=2e-3, atol=2e-3)  # fp16 storage of the same values
        assert not a.features[n - 1].any()  # the last token is never fed back
        have = np.nonzero(a.labels >= 0)[0]
        assert have.tolist() == list(range(len(p) - 1, n - 1))
        assert (a.labels[have] == logits[0, have].argmax(-1).numpy()).all()


def random_chat_target(folder):
    """A random Qwen3 checkpoint (word-level tokenizer, chat template), and end-of-message ids that make it end a
    self-written message after a few tokens."""
    write_checkpoint("qwen3", folder)
    return load_target(folder), load_tokenizer(folder), tuple(range(125_000, 151_936))


def test_writing_tasks_begin_with_an_opener_and_leave_the_questions_as_they_were(tmp_path):
    model, tok, stop = random_chat_target(tmp_path)
    openers = ("w1 w2", "w3")
    questions = magpie(model, tok, stop, 12, seed=0, batch=8)
    assert len(questions) >= 6
    keep = tmp_path / "kept"
    tasks = magpie(model, tok, stop, 12, seed=0, batch=8, keep=keep, openers=openers, stream=1)
    words = [normalise(t) for t in tasks]  # (this word-level tokenizer decodes with spaces of its own)
    assert len(tasks) >= 6 and all(w[:2] == ["w1", "w2"] or w[0] == "w3" for w in words)
    assert len({" ".join(w) for w in words}) == len(tasks)  # no duplicates, no bare opener
    assert {w[0] for w in words} == {"w1", "w3"}  # the openers taken in turn
    assert magpie(model, tok, stop, 12, seed=0, batch=8) == questions  # the questions' sampling is their own
    with torch.no_grad():
        model.embed.weight.mul_(-1)  # another target writes other messages...
    assert magpie(model, tok, stop, 12, seed=0, batch=8, openers=openers, stream=1) != tasks
    rerun = magpie(model, tok, stop, 12, seed=0, batch=8, keep=keep, openers=openers, stream=1)
    assert rerun == tasks  # ...but a rerun reads the kept batches
    rows, summary = build(model, tok, stop, PromptMix(magpie=4, writing=4, code=0, passages=0, follow_up_share=1.0,
                                                      batch=8), heldout=[])
    assert summary["by_source"] == {"magpie": 4, "magpie-writing": 4}
    writing = [r for r in rows if r["category"] == "writing"]
    assert len(writing) == 4 and all(r["turns"][1] in FOLLOW_UPS["writing"] for r in writing)
    assert [r for r in rows if r["source"] == "magpie"] == [r for r in rows if r["category"] == "question"]


def test_short_questions_and_code_requests_keep_their_own_batches_and_length(tmp_path):
    model, tok, stop = random_chat_target(tmp_path)
    keep = tmp_path / "prompts.jsonl.magpie-batches"
    mix = PromptMix(magpie=0, writing=0, questions=6, code_requests=6, code=0, passages=0, follow_up_share=0.0,
                    batch=8)
    rows, summary = build(model, tok, stop, mix, heldout=[], keep=keep)
    assert summary["by_source"] == {"magpie-code": 6, "magpie-questions": 6}
    by_source = {s: [r["turns"][0] for r in rows if r["source"] == s] for s in summary["by_source"]}
    assert {r["category"] for r in rows if r["source"] == "magpie-code"} == {"code"}
    assert {r["category"] for r in rows if r["source"] == "magpie-questions"} == {"question"}
    assert all(4 <= len(normalise(t)) <= SHORT_WORDS for texts in by_source.values() for t in texts)

    def begun(text, openers):  # (this word-level tokenizer knows no English: an opener decodes as w0 w0 ...)
        return any(normalise(text)[:len(normalise(o))] == normalise(o)
                   for o in (tok.decode(tok.encode(o, add_special_tokens=False)) for o in openers))

    assert all(begun(t, CODE_OPENERS) for t in by_source["magpie-code"])
    assert all(begun(t, QUESTION_OPENERS) for t in by_source["magpie-questions"])
    files = kept_batches(keep)
    assert files["magpie-code"].is_file() and files["magpie-questions"].is_file()
    assert not files["magpie"].exists() and not files["magpie-writing"].exists()  # no batches where none asked
    with torch.no_grad():
        model.embed.weight.mul_(-1)  # another target: a rerun still reads each source's own batches
    assert build(model, tok, stop, mix, heldout=[], keep=keep) == (rows, summary)


def test_code_tasks_change_one_operator_for_a_bug_and_read_the_train_split():
    rng = np.random.default_rng(0)
    code = "def f(a, b):\n    if a < b:\n        return a + 1\n    return b\n"
    bugged = _mutate(code, rng)
    assert bugged != code and len(bugged.splitlines()) == len(code.splitlines())
    assert _mutate("def f():\n    pass\n", rng) is None
    rows = code_prompts(40, np.random.default_rng(1), limit_files=80)
    assert len(rows) == 40 and all(r["category"] == "code" and "```python" in r["turns"][0] for r in rows)


def test_near_duplicates_are_caught():
    assert near_duplicate("What causes the seasons on Earth?", "what causes the seasons on earth")
    assert near_duplicate("What causes the seasons?", "So, what causes the seasons on Earth and on Mars?")
    assert not near_duplicate("Write a poem about the sea.", "How do I sort a list in Python?")


def test_heldout_chat_set_is_well_formed():
    rows = read_conversations(HELDOUT)
    by = {}
    for r in rows:
        by[r["category"]] = by.get(r["category"], 0) + 1
    assert len(rows) >= 64 and len(by) >= 6 and min(by.values()) >= 8
    assert all(len(r["turns"]) >= 2 for r in rows if r["category"] == "multi-turn")


@pytest.mark.skipif(not TRAIN_PROMPTS.is_file(), reason="data/chat/train-prompts.jsonl not made yet")
def test_no_training_prompt_near_duplicates_a_heldout_prompt():
    held = [t for r in read_conversations(HELDOUT) for t in r["turns"]]
    train = [t for r in read_conversations(TRAIN_PROMPTS) for t in r["turns"][:1]]
    assert len(train) > 1000
    clashes = [(t, h) for t in train for h in held if near_duplicate(t, h)]
    assert not clashes, clashes[:3]


def test_conversations_are_answered_turn_by_turn_as_chat_renders_them(tmp_path):
    """Two-turn conversations: the second prompt extends the first answer's ids (the `hyflash chat` rule), the
    answer mask covers exactly what the target wrote, and features and labels cover every row."""
    from gguf_files import CHATML, bpe_tokenizer
    from transformers import PreTrainedTokenizerFast

    from hyflash.models.chat import Transcript
    from hyflash.train.conversations import ChatRegenConfig, answer_shard

    raw = bpe_tokenizer()  # byte-level: text round-trips, so each turn extends the ids before it
    tok = PreTrainedTokenizerFast(tokenizer_object=raw)
    tok.chat_template = CHATML
    model, _ = tiny_target(vocab=raw.get_vocab_size())
    eos = (raw.token_to_id("<|im_end|>"),)
    rows = [{"turns": ["hello world", "the quick fox"], "category": "a"}, {"turns": ["add a b"], "category": "b"},
            {"turns": ["lazy dog", "tiny"], "category": "a"}]
    cfg = ChatRegenConfig(max_new=12, seq_len=120, batch=3, greedy_share=1.0)
    arrays, feats = answer_shard(model, tok, eos, rows, cfg, 0)
    assert arrays["turns"].tolist() == [2, 1, 2]
    offsets = np.concatenate([[0], np.cumsum(arrays["length"])])
    assert feats["features"].shape == (offsets[-1], model.feature_size) and feats["labels"].shape == (offsets[-1],)
    for b, row in enumerate(rows):
        n = arrays["length"][b]
        ids = arrays["tokens"][b, :n].tolist()
        chat = Transcript(tok)
        written = 0
        for t, message in enumerate(row["turns"]):
            prompt, text = chat.prompt(message)
            assert ids[:len(prompt)] == prompt  # each turn extends the conversation's own ids
            reply = greedy(model, prompt, 12, max_context=120)
            reply = reply[:reply.index(eos[0]) + 1] if eos[0] in reply else reply
            assert ids[len(prompt):len(prompt) + len(reply)] == reply
            assert arrays["answer"][b, len(prompt):len(prompt) + len(reply)].all()
            chat.record(message, prompt, text, reply)
            written += len(reply)
        assert arrays["answer"][b].sum() == written and chat.ids == ids
        labels = feats["labels"][offsets[b]:offsets[b + 1]]
        answered = np.nonzero(arrays["answer"][b, :n])[0]
        assert (labels[answered - 1] >= 0).all()  # every answer token has the target's choice before it
        with torch.no_grad():
            logits, _ = model(torch.tensor([ids]))
        have = labels >= 0
        assert (labels[have] == logits[0].argmax(-1).numpy()[have]).all()


@pytest.fixture(scope="module")
def conversations(tmp_path_factory):
    """A tiny conversations folder with its feature cache: (folder, target, tokenizer folder)."""
    from gguf_files import CHATML, bpe_tokenizer
    from transformers import PreTrainedTokenizerFast

    from hyflash.train.conversations import ChatRegenConfig, regenerate_chats

    raw = bpe_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw)
    tok.chat_template = CHATML
    model, _ = tiny_target(vocab=raw.get_vocab_size())
    rng = np.random.default_rng(0)
    words = ["hello", "world", "quick", "fox", "lazy", "dog", "tiny", "add"]
    rows = [{"turns": [" ".join(rng.choice(words, 5))] + ([" ".join(rng.choice(words, 3))] if i % 3 == 0 else []),
             "category": "a"} for i in range(60)]
    folder = tmp_path_factory.mktemp("conv") / "regen"
    cfg = ChatRegenConfig(tokens=10**6, max_new=24, seq_len=200, batch=20, greedy_share=0.5)
    summary = regenerate_chats(model, tok, (raw.token_to_id("<|im_end|>"),), rows, cfg, folder,
                               {"target": "tiny", "target_sha256": "x"}, progress=False)
    assert summary["shards"] == 3
    return folder, model


def test_feature_cache_gives_the_loss_of_the_target_in_the_loop(conversations):
    """Same rows, same anchors: training from the cache (fp16 features, stored argmax) and with the target
    run on the rows give the same loss and tau within fp16's rounding (stated: 1e-3 relative)."""
    from hyflash.models.drafter import Drafter, DrafterConfig
    from hyflash.train.cached import ConversationRows
    from hyflash.train.drafter import Distill

    folder, model = conversations
    cached, live = ConversationRows(folder, features=True), ConversationRows(folder, features=False)
    assert cached.describe["conversations"] == 60 and len(cached.held_ids) == 1
    torch.manual_seed(0)
    drafter = Drafter.for_target(model, DrafterConfig.for_target(model, window=16))
    distill = Distill(drafter, model, anchors=6)
    ids = cached.train_ids[:8]
    a, b = cached.rows(ids), live.rows(ids)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    with torch.no_grad():
        loss_cached, m_cached = distill(torch.from_numpy(a.tokens), torch.from_numpy(a.anchorable),
                                        torch.from_numpy(a.features), torch.from_numpy(a.labels))
        loss_live, m_live = distill(torch.from_numpy(b.tokens), torch.from_numpy(b.anchorable))
    assert abs(loss_cached.item() - loss_live.item()) <= 1e-3 * abs(loss_live.item())
    assert m_cached["tau"].item() == pytest.approx(m_live["tau"].item(), abs=1e-6)


@pytest.mark.parametrize("draft_vocab", [0, 40])
def test_soft_labels_are_the_targets_distribution_at_each_slots_position(conversations, draft_vocab):
    """--soft-labels: slot k's soft label is the target's distribution after position a+k-1, read from the
    feature cache (the layers after the last tap), renormalised over the draft vocabulary; its cross-entropy
    equals one from the target run live on the rows, whose argmax is the slot's hard label; the hard
    cross-entropy is unchanged, and the loss mixes the two by the share."""
    from hyflash.models.drafter import Drafter, DrafterConfig
    from hyflash.train.cached import ConversationRows
    from hyflash.train.drafter import Distill

    folder, model = conversations
    data = ConversationRows(folder, features=True)
    rows = data.rows(data.train_ids[:6])
    torch.manual_seed(0)
    drafter = Drafter.for_target(model, DrafterConfig.for_target(model, window=16, draft_vocab=draft_vocab))
    if draft_vocab:
        drafter.d2t.copy_(torch.randperm(model.cfg.vocab_size)[:draft_vocab])
    args = [torch.from_numpy(x) for x in (rows.tokens, rows.anchorable, rows.features, rows.labels)]
    figures = {}
    with torch.no_grad():
        for share in (0.0, 0.5, 1.0):
            loss, metrics = Distill(drafter, model, anchors=6, soft=share)(*args)
            figures[share] = loss.item(), {k: v.item() for k, v in metrics.items()}
        distill = Distill(drafter, model, anchors=6)
        logits, _ = model(args[0])  # the target run live, not the cache
        ref, checked = [], 0
        for b, (a, labels, states, prev, _, copy) in enumerate(distill.predict(args[0], args[1])):
            pos = a[:, None] + torch.arange(labels.shape[1])
            p = torch.softmax(logits[b][pos][..., drafter.d2t] if draft_vocab else logits[b][pos], -1)
            q = torch.log_softmax(drafter.head(states, prev, copy), -1)
            ref.append((-(p * q).sum(-1) * distill.slot_weight).sum(-1).mean())
            inside = drafter.head_index(labels) >= 0
            assert torch.equal(drafter.target_ids(p.argmax(-1))[inside], labels[inside])
            checked += int(inside.sum())
    assert checked > 0
    plain, (half_loss, half), (_, whole) = figures[0.0][1], figures[0.5], figures[1.0]
    assert "soft_ce" not in plain and plain["ce"] == half["ce"] == whole["ce"]
    assert whole["soft_ce"] == pytest.approx(torch.stack(ref).mean().item(), rel=1e-3)  # fp16 features
    assert half_loss == pytest.approx(0.5 * half["ce"] + 0.5 * half["soft_ce"] + 0.1 * half["conf_bce"], rel=1e-6)
    with pytest.raises(ValueError, match="feature cache"):
        Distill(drafter, model, anchors=6, soft=0.5)(*args[:2])


def test_answer_horizon_keeps_the_anchors_of_each_answers_first_tokens():
    """--answer-horizon N: of the anchors an answer allows (all 7 labels the target's), only those whose first
    label is among the answer's first N tokens, in each turn's answer alike."""
    from hyflash.train.cached import answer_anchors

    answer = np.zeros((1, 60), bool)
    answer[0, 10:30] = answer[0, 40:60] = True  # two turns' answers of 20 tokens
    full = np.flatnonzero(answer_anchors(answer)[0])
    assert full.tolist() == list(range(9, 23)) + list(range(39, 53))
    assert np.flatnonzero(answer_anchors(answer, horizon=5)[0]).tolist() == list(range(9, 14)) + list(range(39, 44))
    assert (answer_anchors(answer, horizon=100) == answer_anchors(answer)).all()


def test_answer_horizon_on_a_conversations_folder(conversations, tmp_path, capsys):
    """The folder's rows with a horizon: each anchor kept is one the folder allows whose next token is at most
    the answer's N-th (counted turn by turn, by a scan of the answer mask); train-drafter and eval-drafter
    refuse it on data that is not conversations, in one line, before any run folder is written."""
    from hyflash.cli import main
    from hyflash.train.batches import open_rows
    from hyflash.train.cached import ConversationRows

    folder, _ = conversations
    full, cut = ConversationRows(folder, features=False), open_rows(folder, folder, None, None, features=False, horizon=6)
    assert cut.describe["answer_horizon"] == 6 and "answer_horizon" not in full.describe
    kept = 0
    for anchors, limited, answer in zip(full.anchors, cut.anchors, cut.answer):
        index, run = np.full(len(answer), -1), 0
        for p in range(len(answer)):
            run = run + 1 if answer[p] else 0
            index[p] = run - 1
        want = anchors.copy()
        want[:-1] &= index[1:] < 6
        np.testing.assert_array_equal(limited, want)
        kept += limited.sum()
    assert 0 < kept < sum(a.sum() for a in full.anchors)
    text = tmp_path / "notes.txt"
    text.write_text("some text " * 50)
    for cmd in (["train-drafter", "--out", str(tmp_path / "run")], ["eval-drafter", "--drafter", "reference"]):
        assert main([*cmd, "--target", "reference", "--data", str(text), "--answer-horizon", "8"]) == 2
        err = capsys.readouterr().err.strip()
        assert "--answer-horizon" in err and "conversations" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()
    assert main(["train-drafter", "--out", str(tmp_path / "run"), "--target", "reference", "--data", str(folder),
                 "--answer-horizon", "8", "--distant-repeats", "0.5", "--no-feature-cache"]) == 2
    assert "give one of them" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_cache_features_rebuilds_the_cache_regeneration_wrote(conversations, tmp_path):
    import shutil

    from hyflash.train.cached import cache_features

    folder, model = conversations
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("features"))
    lengths = [np.load(copy / f"shard-{i:05d}.npz")["length"] for i in range(3)]
    assert any((np.diff(n) < 0).any() for n in lengths)  # rows out of length order: the cache regroups them
    assert cache_features(model, copy, progress=False)["shards_written"] == 3
    assert cache_features(model, copy, progress=False)["shards_written"] == 0  # resumable: nothing left
    for i in range(3):
        want = np.load(folder / "features" / f"shard-{i:05d}.npy")
        got = np.load(copy / "features" / f"shard-{i:05d}.npy")
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
        np.testing.assert_array_equal(np.load(copy / "features" / f"shard-{i:05d}.labels.npy"),
                                      np.load(folder / "features" / f"shard-{i:05d}.labels.npy"))


def test_a_checkout_without_features_extends_the_run_and_rewrites_nothing(conversations, tmp_path):
    """The committed shards without their (uncommitted) features: a rerun with a larger --tokens (here with
    --no-features, as a GPU run that trains with the target in the loop makes it) writes only new shards, the
    same as a run with features would, and the answer-token count adds up; the missing features are
    cache-features' to rebuild."""
    import shutil

    from gguf_files import CHATML, bpe_tokenizer
    from transformers import PreTrainedTokenizerFast

    from hyflash.train.conversations import ChatRegenConfig, regenerate_chats

    folder, model = conversations
    copy = tmp_path / "clone"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("features"))
    (copy / "shard-00002.npz").unlink()
    sums = json.loads((copy / "checksums.json").read_text())
    del sums["shard-00002.npz"]  # the run stopped after two shards
    (copy / "checksums.json").write_text(json.dumps(sums))
    counts = json.loads((copy / "answer_tokens.json").read_text())
    del counts["shard-00002"]
    (copy / "answer_tokens.json").write_text(json.dumps(counts))
    before = {p.name: p.read_bytes() for p in copy.glob("shard-*.npz")}
    raw = bpe_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw)
    tok.chat_template = CHATML
    rng = np.random.default_rng(0)
    words = ["hello", "world", "quick", "fox", "lazy", "dog", "tiny", "add"]
    rows = [{"turns": [" ".join(rng.choice(words, 5))] + ([" ".join(rng.choice(words, 3))] if i % 3 == 0 else []),
             "category": "a"} for i in range(60)]
    cfg = ChatRegenConfig(tokens=10**6, max_new=24, seq_len=200, batch=20, greedy_share=0.5, features=False)
    summary = regenerate_chats(model, tok, (raw.token_to_id("<|im_end|>"),), rows, cfg, copy,
                               {"target": "tiny", "target_sha256": "x"}, progress=False)
    assert summary["throughput"]["shards"] == 1 and summary["throughput"]["per_shard"][0]["shard"] == 2
    assert not list((copy / "features").glob("shard-*.npy"))
    assert {p.name: p.read_bytes() for p in copy.glob("shard-*.npz") if p.name in before} == before
    with np.load(copy / "shard-00002.npz") as got, np.load(folder / "shard-00002.npz") as want:
        assert all((got[k] == want[k]).all() for k in want.files)  # a shard is a function of its index
    assert summary["answer_tokens"] == sum(json.loads((folder / "answer_tokens.json").read_text()).values())


def test_train_drafter_reads_the_cache_and_refuses_rows_it_does_not_hold(conversations, tmp_path, capsys):
    import shutil

    from test_copy_curriculum import tiny_target as make

    from hyflash.cli import main
    from hyflash.models.loading import save_target

    folder, model = conversations
    target_dir = tmp_path / "target"
    _, raw = make(vocab=model.cfg.vocab_size)
    save_target(model, target_dir, raw)
    folder = Path(shutil.copytree(folder, tmp_path / "regen"))  # a copy: the module's folder stays as made
    cfg = json.loads((folder / "config.json").read_text())
    from hyflash.models.loading import weights_sha256
    cfg["target_sha256"] = weights_sha256(target_dir)
    (folder / "config.json").write_text(json.dumps(cfg))
    args = ["train-drafter", "--target", str(target_dir), "--data", str(folder), "--window", "16", "--steps", "2",
            "--batch", "2", "--anchors", "4", "--eval-every", "1", "--eval-rows", "1", "--device", "cpu"]
    assert main([*args, "--out", str(tmp_path / "d"), "--distant-repeats", "0.5"]) == 2
    assert "--no-feature-cache" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "d"), "--soft-labels", "0.5", "--no-feature-cache"]) == 2
    err = capsys.readouterr().err
    assert "--soft-labels" in err and err.count("\n") == 1 and not (tmp_path / "d").exists()
    assert main([*args, "--out", str(tmp_path / "soft"), "--soft-labels", "0.5"]) == 0
    assert json.loads((tmp_path / "soft" / "run_config.json").read_text())["soft_labels"] == 0.5
    assert all("soft_ce" in json.loads(line) for line in (tmp_path / "soft" / "log.jsonl").read_text().splitlines())
    assert main([*args, "--out", str(tmp_path / "d")]) == 0
    log = [json.loads(line) for line in (tmp_path / "d" / "log.jsonl").read_text().splitlines()]
    assert any("tau" in rec for rec in log) and not any("soft_ce" in rec for rec in log)
    # hybrid's constants from the same folder: rounds at anchors inside greedy conversations' answers
    capsys.readouterr()
    assert main(["calibrate", "--drafter", str(tmp_path / "d" / "model"), "--target", str(target_dir), "--data",
                 str(folder), "--rows", "4", "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)
    assert cal["sequences"] == 4 and cal["rounds"] > 0 and (tmp_path / "d" / "model" / "hybrid.json").is_file()
    from hyflash.train.cached import ConversationRows
    from hyflash.train.calibrate import chat_rows

    data = ConversationRows(folder, features=False)
    tokens, anchorable = chat_rows(folder, 4, cfg["target_sha256"])
    for row, ok in zip(tokens, anchorable):
        i = next(i for i in data.train_ids if (data.tokens[i] == row).all())
        assert data.greedy[i] and (ok == data.anchors[i]).all() and ok.any()


def test_several_conversations_folders_train_as_one_set(conversations, tmp_path, capsys, monkeypatch):
    """Two folders (the second a shorter copy: two of its three shards) as one --data: every row a batch
    holds is that folder's row, padded as a single folder pads; batches draw from both folders; the held-out
    rows take turns; train-drafter runs on the mix and records both parts; a folder that is not
    conversations is refused in one line."""
    import shutil

    from test_copy_curriculum import tiny_target as make

    from hyflash.cli import main
    from hyflash.models.loading import save_target, weights_sha256
    from hyflash.train import cached
    from hyflash.train.batches import open_rows
    from hyflash.train.cached import ConversationMix, ConversationRows

    folder, model = conversations
    target_dir = tmp_path / "target"
    _, raw = make(vocab=model.cfg.vocab_size)
    save_target(model, target_dir, raw)
    folder = shutil.copytree(folder, tmp_path / "regen")  # a copy: the module's folder stays as made
    short = tmp_path / "short"
    shutil.copytree(folder, short)
    for name, sums in (("shard-00002.npz", "checksums.json"), ("shard-00002.npy", "features/checksums.json"),
                       ("shard-00002.labels.npy", "features/checksums.json")):
        book = json.loads((short / sums).read_text())
        del book[name]
        (short / sums).write_text(json.dumps(book))
    for f in (folder, short):  # both of this target
        cfg = json.loads((f / "config.json").read_text())
        cfg["target_sha256"] = weights_sha256(target_dir)
        (f / "config.json").write_text(json.dumps(cfg))

    monkeypatch.setattr(cached, "HELDOUT_EVERY", 10)  # held-out rows in both folders (6 and 4)
    mix = open_rows([folder, short], target_dir, None, None, weights_sha256(target_dir))
    one, two = ConversationRows(folder), ConversationRows(short)
    assert isinstance(mix, ConversationMix) and len(two.tokens) == 40 < len(one.tokens) == 60
    assert len(mix.train_ids) == len(one.train_ids) + len(two.train_ids)
    assert mix.describe["conversations"] == 100 and len(mix.describe["parts"]) == 2
    ids = [(1, two.train_ids[3]), (0, one.train_ids[5]), (1, two.train_ids[0])]
    got = mix.rows(ids)
    for r, (k, i) in enumerate(ids):
        want = (one, two)[k].rows([i])
        n = want.tokens.shape[1]
        np.testing.assert_array_equal(got.tokens[r, :n], want.tokens[0])
        np.testing.assert_array_equal(got.anchorable[r, :n], want.anchorable[0])
        np.testing.assert_array_equal(got.features[r, :n], want.features[0])
        np.testing.assert_array_equal(got.labels[r, :n], want.labels[0])
        assert not got.anchorable[r, n:].any() and (got.labels[r, n:] == -1).all() and not got.features[r, n:].any()
    drawn = mix.sample(np.random.default_rng(0), 16)
    picks = [mix.train_ids[j] for j in np.random.default_rng(0).integers(0, len(mix.train_ids), size=16)]
    assert {k for k, _ in picks} == {0, 1}  # a batch of 16 holds conversations of both folders
    np.testing.assert_array_equal(drawn.tokens, mix.rows(picks).tokens)
    assert mix.held_ids == [(0, i) if k == 0 else (1, j) for i, j in zip(one.held_ids, two.held_ids) for k in (0, 1)] \
        + [(0, i) for i in one.held_ids[len(two.held_ids):]]  # turns, then the longer folder's rest
    assert len(two.held_ids) == 4 and len(one.held_ids) == 6
    held = mix.heldout(10)
    assert held.greedy.tolist() == [(one, two)[k].greedy[i] for k, i in mix.held_ids]
    assert 0 < held.greedy.sum() < 10  # both kinds among them: the walk below skips the sampled ones
    from hyflash.models.drafter import Drafter, DrafterConfig
    from hyflash.train.drafter import Distill, walked_tau

    torch.manual_seed(0)
    walked = walked_tau(Distill(Drafter.for_target(model, DrafterConfig.for_target(model, window=16)), model, 6), held)
    assert walked["walked_rows"] == held.greedy.sum() and walked["walked_rounds"] > 0
    with pytest.raises(ValueError, match="names a folder twice"):
        open_rows([folder, short, folder], target_dir, None, None, weights_sha256(target_dir))

    args = ["train-drafter", "--target", str(target_dir), "--window", "16", "--steps", "2", "--batch", "2",
            "--anchors", "4", "--eval-every", "1", "--eval-rows", "2", "--device", "cpu"]
    assert main([*args, "--data", str(folder), str(short), "--out", str(tmp_path / "d")]) == 0
    config = json.loads((tmp_path / "d" / "run_config.json").read_text())
    assert [p["data"] for p in config["data"]["parts"]] == [str(folder), str(short)]
    capsys.readouterr()
    assert main([*args, "--data", str(folder), str(target_dir), "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a conversations folder" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "e").exists()
