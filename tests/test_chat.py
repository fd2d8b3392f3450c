"""Talking to an export as an app does (issue 17): the export carries generation_config.json and the chat
template; `generate --chat` equals `transformers`' greedy answer to the templated prompt and stops at the
generation config's EOS; a conversation keeps the target's cache and the drafter's context between turns and
prefills only the new turn, with the same tokens as one generation over the whole history; top-k as
`transformers` applies it."""

import io
import json

import numpy as np
import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from hf_models import save_hf_model
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


def test_a_conversation_prefills_only_each_new_turn_and_equals_one_generation_over_its_history(chat_export):
    _, _, out, _ = chat_export
    cfg = GenerationConfig(max_new_tokens=9, ignore_eos=True)  # each reply cut mid-block: commits stop at the cut
    chat_rt, fresh_rt = Runtime(out), Runtime(out)
    conversation = Conversation(chat_rt, load_tokenizer(out), cfg, system="w1 w2")
    before = 0  # tokens the previous turns left in the conversation (prompt and reply)
    for turn, message in enumerate(["w5 w6 w7", "w10 w11", "w3 w40 w41 w42"]):
        prompt, _ = conversation.prompt(message)
        assert prompt[:before] == conversation.ids  # the history is kept token for token
        stats = Stats()
        got = [t for new in conversation.turn(message, stats) for t in new]
        fresh = Stats()
        ref = [t for new in fresh_rt.generate(prompt, cfg, fresh) for t in new]
        assert got == ref and len(got) == 9
        # the runtime kept everything but the last reply token (never committed): it prefills the rest
        assert stats.prefilled == (len(prompt) if turn == 0 else len(prompt) - before + 1)
        assert fresh.prefilled == len(prompt)
        assert chat_rt.text == (prompt + got)[:-1] and chat_rt.drafter_rows == len(chat_rt.text)
        before = len(prompt) + len(got)


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
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 50)).astype(np.float32) * 3
    logits[0, :4] = logits[0, 4]  # ties at the k-th value are kept by both
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
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
    with pytest.raises(ValueError, match="--top-k"):
        Sampling(temperature=1.0, top_k=-1)
