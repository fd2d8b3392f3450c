"""Talking to an export as an app does: the export carries generation_config.json and the chat
template; `generate --chat` equals `transformers`' greedy answer to the templated prompt and stops at the
generation config's EOS; a conversation keeps the target's cache and the drafter's context between turns and
prefills only the new turn, with the same tokens as one generation over the whole history; top-k as
`transformers` applies it."""

import io
import json

import numpy as np
import pytest
import torch
from hf_models import save_hf_model
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from hyflash.cli import main
from hyflash.models.generation import load_tokenizer
from hyflash.runtime_py.chat import Conversation
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
from hyflash.runtime_py.sampling import Sampling

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
VOCAB, IM_START, IM_END, END = 96, 93, 94, 95
WORDS = 80  # w0..w79 at ids 0..79


def chat_checkpoint(folder, eos: list[int]):
    hf = save_hf_model("qwen3", folder, vocab_size=VOCAB, eos_token_id=END, bos_token_id=None)
    vocab = {f"w{i}": i for i in range(WORDS)}
    vocab.update({"\n": 80, " ": 81, "user": 82, "assistant": 83, "system": 84})
    vocab.update({f"x{i}": i for i in range(85, IM_START)})
    vocab.update({"<|im_start|>": IM_START, "<|im_end|>": IM_END, "<|endoftext|>": END})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # tokens are whole pieces of text, spaces included: decode = concatenation
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE, "eos_token": "<|im_end|>",
        "clean_up_tokenization_spaces": False, "model_max_length": 4096}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": False}))
    return hf


def export(target, out):
    assert main(["export", "--target", str(target), "--drafter", "random", "--out", str(out), "--format", "onnx",
                 "--max-context", "160", "--prefill-chunk", "16", "--window", "24"]) == 0
    return out


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory):
    """A chat checkpoint whose generation config ends a turn at <|im_end|> or at the 4th new token of
    transformers' greedy answer to the test message (so that a random model stops at a known EOS)."""
    target = tmp_path_factory.mktemp("chat-target")
    hf = chat_checkpoint(target, [IM_END])
    tok = load_tokenizer(target)
    prompt = tok.apply_chat_template([{"role": "user", "content": "w5 w6 w7"}], add_generation_prompt=True)
    with torch.no_grad():
        free = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(prompt):].tolist()
    i = next(i for i in range(3, 24) if free[i] not in free[:i] and IM_END not in free[:i + 1])
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [free[i], IM_END],
                                                               "do_sample": False}))
    return target, hf, export(target, tmp_path_factory.mktemp("chat-export") / "out"), free[i]


def test_export_carries_generation_config_and_chat_template(chat_export):
    target, _, out, stop = chat_export
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["generation"]["eos_token_ids"] == [stop, IM_END] and manifest["generation"]["chat_template"]
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (target / name).read_bytes(), name
    assert Runtime(out).eos == {stop, IM_END}  # the generation config's, not config.json's (END)


def test_generate_chat_equals_transformers_and_stops_at_the_generation_config_eos(chat_export, capsys):
    from transformers import GenerationConfig as HFGenerationConfig

    target, hf, out, stop = chat_export
    tok = load_tokenizer(target)
    for system in (None, "w9 w8"):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user",
                                                                                      "content": "w5 w6 w7"}]
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), generation_config=HFGenerationConfig.from_pretrained(target),
                              max_new_tokens=24, pad_token_id=0)[0, len(prompt):].tolist()
        capsys.readouterr()
        assert main(["generate", str(out), "--chat", "w5 w6 w7", "--max-new-tokens", "24", "--json"]
                    + (["--system", system] if system else [])) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["prompt_tokens"] == len(prompt)
        assert got["tokens"] == ref, (got["tokens"], ref)
        if system is None:  # the answer checked for this message ends at the planted EOS
            assert got["tokens"][-1] == stop and got["stop_reason"] == "eos"


@pytest.mark.parametrize("drafts", [("model", "model", "model"), ("prompt-lookup", "model", "none")])
def test_a_conversation_prefills_only_each_new_turn_and_equals_one_generation_over_its_history(chat_export, drafts):
    """Each turn equals a fresh generation over the conversation's whole prompt; the runtime keeps every
    committed row, and a turn after one that did not run the drafter (prompt-lookup, none) starts afresh
    when it drafts with the model. Replies are cut at 9 tokens: a round that accepted drafts past the cut
    commits only what it emitted (prompt-lookup on repeated messages makes accepted drafts likely)."""
    _, _, out, _ = chat_export
    chat_rt, fresh_rt = Runtime(out), Runtime(out)
    conversation = Conversation(chat_rt, load_tokenizer(out), GenerationConfig(max_new_tokens=9, ignore_eos=True),
                                system="w1 w2")
    before, previous = 0, None  # tokens the earlier turns left in the conversation; the draft they used
    for turn, (message, draft) in enumerate(zip(["w5 w6 w7 w5 w6 w7", "w10 w11", "w5 w6 w7 w5 w6 w7"], drafts)):
        conversation.cfg = GenerationConfig(max_new_tokens=9, ignore_eos=True, draft=draft)
        prompt, _ = conversation.prompt(message)
        assert prompt[:before] == conversation.ids  # the history is kept token for token
        stats = Stats()
        got = [t for new in conversation.turn(message, stats) for t in new]
        fresh = Stats()
        ref = [t for new in fresh_rt.generate(prompt, conversation.cfg, fresh) for t in new]
        assert got == ref and len(got) == 9
        kept = turn > 0 and not (draft != "none" and draft != "prompt-lookup" and previous in ("none", "prompt-lookup"))
        # the runtime kept everything but the last reply token (never committed): it prefills the rest
        assert stats.prefilled == (len(prompt) - before + 1 if kept else len(prompt)), (turn, draft)
        assert fresh.prefilled == len(prompt)
        assert chat_rt.cache.tokens == (prompt + got)[:-1]
        assert chat_rt.ctx.rows == (len(chat_rt.cache.tokens) if draft == "model" else -1)
        before, previous = len(prompt) + len(got), draft


def test_sampling_defaults_come_from_the_generation_config(chat_export, tmp_path, capsys):
    """An export whose generation_config.json samples: generate uses its temperature / top-k / top-p
    (the same tokens as the runtime given them, seeded), flags override them, and settings the loop
    does not apply are named in one note."""
    import shutil

    _, _, out, _ = chat_export
    sampled = tmp_path / "sampled"
    shutil.copytree(out, sampled)
    config = {"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.05,
              "eos_token_id": [IM_END]}
    (sampled / "generation_config.json").write_text(json.dumps(config))
    manifest = json.loads((sampled / "manifest.json").read_text())
    from hyflash.runtime_py.manifest import file_hashes, seal

    manifest["files"] = file_hashes(sampled, list(manifest["files"]))
    (sampled / "manifest.json").write_text(json.dumps(seal({k: v for k, v in manifest.items()
                                                            if k != "manifest_sha256"})))
    prompt = [3, 4, 5, 6]

    def run(sampling):
        stats = Stats()
        cfg = GenerationConfig(max_new_tokens=12, ignore_eos=True, sampling=sampling, seed=7)
        return [t for new in Runtime(sampled).generate(prompt, cfg, stats) for t in new]
    for flags, sampling in [([], Sampling(0.7, 0.9, 5)), (["--temperature", "0"], Sampling(0.0, 0.9, 5)),
                            (["--top-k", "0", "--top-p", "1"], Sampling(0.7, 1.0, 0))]:
        capsys.readouterr()
        assert main(["generate", str(sampled), "--prompt-ids", "3,4,5,6", "--max-new-tokens", "12", "--seed", "7",
                     "--ignore-eos", "--json", *flags]) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out)["tokens"] == run(sampling), flags
        assert "repetition_penalty=1.05, which hyflash does not apply" in captured.err
    assert run(Sampling(0.7, 0.9, 5)) != run(Sampling())  # sampled, not greedy


def test_chat_command_keeps_the_conversation(chat_export, capsys, monkeypatch):
    _, _, out, _ = chat_export
    monkeypatch.setattr("sys.stdin", io.StringIO("w5 w6 w7\n\nw10 w11\n"))
    capsys.readouterr()
    assert main(["chat", str(out), "--max-new-tokens", "6", "--ignore-eos", "--json"]) == 0
    turns = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(turns) == 2  # the empty line is no turn
    first, second = turns
    assert first["prefilled"] == first["prompt_tokens"]
    assert second["prefilled"] < second["prompt_tokens"] - first["prompt_tokens"]  # the history was not re-run


def test_chat_needs_a_template(both_formats, capsys):
    assert main(["generate", str(both_formats), "--chat", "w1 w2"]) == 2
    assert "no chat template" in capsys.readouterr().err


def test_top_k_then_top_p_as_transformers_applies_them():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 50)).astype(np.float32) * 3
    order = np.argsort(-logits[0])
    logits[0, order[3:7]] = logits[0, order[4]]  # ties across the 5th largest value: top-5 keeps all of them
    for t, k, p in [(0.7, 5, 1.0), (1.0, 5, 0.6), (1.3, 0, 0.8), (1.0, 49, 0.95), (0.5, 50, 1.0)]:
        ours = Sampling(temperature=t, top_k=k, top_p=p).probs(logits)
        z = torch.from_numpy(logits)
        z = TemperatureLogitsWarper(t)(None, z)
        if k:
            z = TopKLogitsWarper(k)(None, z)
        if p < 1:
            z = TopPLogitsWarper(p)(None, z)
        theirs = torch.softmax(z.double(), -1).numpy()
        assert ((ours > 0) == (theirs > 0)).all(), (t, k, p)
        if (k, p) == (5, 1.0):
            assert (ours[0] > 0).sum() == 7  # the two tied beyond the 5th kept too
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
    with pytest.raises(ValueError, match="--top-k"):
        Sampling(temperature=1.0, top_k=-1)


def test_bench_chat_answers_every_turn_and_checks_every_mode(chat_export, tmp_path, capsys):
    """`bench --chat`: every turn of every conversation answered in order by every mode, each drafted answer
    equal to target-only's, rows per category and pooled, raw JSON with the machine and package versions."""
    from hyflash.runtime_py.chatbench import ChatBenchConfig, bench_chat
    from hyflash.runtime_py.loop import Runtime

    folder = chat_export[2]
    chats = tmp_path / "chats.jsonl"
    chats.write_text("\n".join(json.dumps(r) for r in [
        {"turns": ["w5 w6 w7"], "category": "a"},
        {"turns": ["w1 w2", "w3 w3 w3"], "category": "b"},
        {"turns": ["w9 w8 w7 w6"], "category": "a"}]) + "\n")
    report = bench_chat(ChatBenchConfig(artifacts=(folder,), chat=chats, max_new_tokens=12), progress=False)
    assert report["exact"] and report["categories"] == ["a", "b"]
    runs = {(r["run"], r["category"]): r for r in report["results"]}
    label = report["export_labels"][0]
    for mode in ("none", "prompt-lookup"):
        pooled = runs[(f"{label}/{mode}", "all")]
        assert pooled["conversations"] == 3 and pooled["answers"] == 4
        assert pooled["same_as_target_only"] == 1.0 and pooled["tau"] >= 1.0
        assert runs[(f"{label}/{mode}", "b")]["answers"] == 2
    assert runs[(f"{label}/none", "all")]["speedup"] == 1.0
    assert report["machine"]["packages"]["onnxruntime"] and report["machine"]["cpu"]
    from hyflash.runtime_py.chatbench import markdown_chat
    table = markdown_chat(report)
    assert f"| {label}/prompt-lookup |" in table and "b tau / speedup" in table
    # the two-turn conversation's second answer is what `hyflash chat` gives after the first
    from hyflash.models.generation import load_tokenizer
    conversation = Conversation(Runtime(folder), load_tokenizer(folder), GenerationConfig(max_new_tokens=12))
    want = []
    for message in ["w1 w2", "w3 w3 w3"]:
        stats = Stats()
        for _ in conversation.turn(message, stats):
            pass
        want.append(len(stats.tokens))
    assert report["per_conversation"][f"{label}/none"][1]["answer_tokens"] == want
    out = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--chat", str(chats), "--max-new-tokens", "8", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["exact"] and "prompt-lookup" in capsys.readouterr().out
    assert main(["bench", str(folder), "--chat", str(chats), "--temperature", "0.5"]) == 2


def test_generate_cut_at_a_stop_string_still_reports_its_speed(chat_export, capsys):
    """A stop string closes the generation early; its JSON still has the decode time and the drafter's context."""
    folder = chat_export[2]
    args = ["generate", str(folder), "--prompt", "w5 w6 w7", "--max-new-tokens", "12", "--ignore-eos", "--json"]
    assert main(args) == 0
    full = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    half = full["text"][:len(full["text"]) // 2]  # reached about halfway through
    assert len(full["tokens"]) == 12 and half
    assert main([*args, "--stop", half]) == 0
    cut = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cut["stop_reason"] == "stop string" and len(cut["tokens"]) < len(full["tokens"])
    assert cut["decode_s"] > 0 and cut["tokens_per_s"] > 0 and cut["drafter_context_bytes"]


def test_onnxruntime_genai_peer_gives_the_targets_greedy_tokens(tmp_path, monkeypatch):
    """The peer bench --chat measures: onnxruntime-genai's own builder run on a target folder (through
    genai_build), fed ids; in fp32 its greedy answer is the target's own (`transformers`')."""
    pytest.importorskip("onnxruntime_genai")
    from gguf_files import bpe_tokenizer

    from hyflash.runtime_py.peers import GenaiPeer, build_genai

    monkeypatch.setenv("HYFLASH_CACHE", str(tmp_path / "cache"))
    target = tmp_path / "llama"  # head size 16: onnxruntime-genai's attention needs a multiple of 16
    tok = bpe_tokenizer()  # <|endoftext|>, <|im_start|>, <|im_end|> at 0, 1, 2
    hf = save_hf_model("llama", target, vocab_size=tok.get_vocab_size(), rope_theta=500.0)  # theta: carried?
    tok.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}))
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [2], "do_sample": False}))
    peer = GenaiPeer(build_genai(target, "fp32"), 1, False, "ort-genai-fp32")
    prompt = [5, 6, 7, 80, 81, 9]
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=2,
                       pad_token_id=0)[0, len(prompt):].tolist()
    want = want[:want.index(2) + 1] if 2 in want else want
    got = peer.answer(prompt, 10, (2,))
    assert got.tokens == want and got.decode_s > 0


def test_bench_chat_subset_keeps_every_category(tmp_path):
    from hyflash.runtime_py.chatbench import read_chats

    path = tmp_path / "chat.jsonl"
    cats = ["a", "a", "a", "b", "c", "c", "b", "b"]
    path.write_text("".join(json.dumps({"turns": [f"q{i}"], "category": c}) + "\n" for i, c in enumerate(cats)))
    picked = read_chats(path, per_category=2)
    assert [r["turns"][0] for r in picked] == ["q0", "q1", "q3", "q4", "q5", "q6"]
