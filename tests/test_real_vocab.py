"""Real checkpoints' vocabularies and chat: a drafter trained on a user's chat .jsonl for a
target with a 151,936-token (Qwen3) or 128,256-token (Llama-3) vocabulary, exported, validated, and
generating what `transformers` generates. No hub: the tokenizers are built here, with their own chat
templates, special tokens at the real ids, and end-of-text from generation_config.json."""

import json

import numpy as np
import pytest
import torch
from hf_models import save_hf_model
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from hyflash.cli import main
from hyflash.export.validate import summarize, validate
from hyflash.models.generation import load_tokenizer
from hyflash.train.sources import Document, encode, end_of_text

QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3_TEMPLATE = ("<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] }}<|eot_id|>{% endfor %}"
                   "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
FAMILIES = {
    # vocab, special tokens at their real ids, eos ids (generation_config.json), template
    "qwen3": (151_936, {"<|endoftext|>": 151_643, "<|im_start|>": 151_644, "<|im_end|>": 151_645},
              [151_645, 151_643], QWEN_TEMPLATE),
    "llama3": (128_256, {"<|begin_of_text|>": 128_000, "<|end_of_text|>": 128_001, "<|start_header_id|>": 128_006,
                         "<|end_header_id|>": 128_007, "<|eot_id|>": 128_009}, [128_001, 128_009], LLAMA3_TEMPLATE),
}
WORDS = 400  # plain words w0..w399 at ids 0..; the rest of the vocabulary unused, as in any real tokenizer


def write_checkpoint(family: str, folder):
    vocab, special, eos, template = FAMILIES[family]
    variant = "qwen3" if family == "qwen3" else "llama"
    hf = save_hf_model(variant, folder, vocab_size=vocab, eos_token_id=eos[0], bos_token_id=None)
    words = {f"w{i}": i for i in range(WORDS)}
    words.update({"\n": WORDS, " ": WORDS + 1, "\n\n": WORDS + 2, "user": WORDS + 3, "assistant": WORDS + 4,
                  "system": WORDS + 5})
    taken = set(special.values())
    filler = {f"x{i}": i for i in range(len(words), vocab) if i not in taken}  # no holes up to the vocabulary size
    tok = Tokenizer(models.WordLevel({**words, **filler, **special}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+"), behavior="isolated")
    tok.add_special_tokens(list(special))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
        "eos_token": next(k for k, v in special.items() if v == eos[0]), "model_max_length": 4096}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": False}))
    return hf


def chat_jsonl(path, n=40):
    lines = []
    for i in range(n):
        user = " ".join(f"w{(7 * i + j) % WORDS}" for j in range(12))
        reply = " ".join(f"w{(3 * i + 2 * j) % WORDS}" for j in range(30))
        lines.append(json.dumps({"messages": [{"role": "user", "content": user},
                                              {"role": "assistant", "content": reply}]}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_chat_data_is_rendered_by_the_targets_template_with_loss_on_the_reply(family, tmp_path):
    write_checkpoint(family, tmp_path)
    tok = load_tokenizer(tmp_path)
    assert end_of_text(tmp_path, tok) == FAMILIES[family][2][0]
    messages = ({"role": "user", "content": "w1 w2"}, {"role": "assistant", "content": "w3 w4 w5"})
    ids, trainable = encode(Document(messages=messages), tok)
    assert ids == tok.apply_chat_template(list(messages), tokenize=True)
    reply = [t for t, on in zip(ids, trainable) if on]
    assert tok.convert_ids_to_tokens(reply[:5]) == ["w3", " ", "w4", " ", "w5"]  # the reply, nothing before it
    assert 0 not in ids  # every piece of the rendered chat is a known token
    assert max(ids) >= 128_000  # the special tokens at their real ids


@pytest.mark.slow  # suite time: a training run and an export at a real vocabulary
@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_train_export_validate_generate_at_a_real_vocabulary(family, tmp_path, capsys):
    target = tmp_path / "target"
    hf = write_checkpoint(family, target)
    data = chat_jsonl(tmp_path / "chat.jsonl")
    run = tmp_path / "drafter"
    assert main(["train-drafter", "--target", str(target), "--data", str(data), "--out", str(run),
                 "--seq-len", "64", "--anchors", "4", "--batch", "2", "--steps", "2", "--warmup", "1",
                 "--markov-rank", "8", "--threads", "2"]) == 0
    out = tmp_path / "export"
    assert main(["export", "--target", str(target), "--drafter", str(run / "model"), "--out", str(out),
                 "--format", "onnx", "--max-context", "96", "--prefill-chunk", "16", "--window", "24"]) == 0
    rows = summarize(validate(out))
    assert all(r.ok for r in rows), [r for r in rows if not r.ok]
    tok = load_tokenizer(target)
    prompt = tok.apply_chat_template([{"role": "user", "content": "w5 w6 w7"}], add_generation_prompt=True)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    for draft in ("model", "none"):
        capsys.readouterr()
        assert main(["generate", str(out), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "20",
                     "--ignore-eos", "--json"] + (["--no-draft"] if draft == "none" else [])) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] == ref


def test_regenerate_answers_chat_prompts_and_trains_on_the_answers(tmp_path, capsys):
    """regenerate from a chat .jsonl: every assistant turn's history, rendered by the target's template,
    answered by the target up to its EOS (greedy rows = transformers' greedy answer); train-drafter reads
    the folder with anchors inside the answers only."""
    from hyflash.train.batches import open_rows
    from hyflash.train.regenerate import load_regenerated

    target = tmp_path / "target"
    hf = write_checkpoint("qwen3", target)
    data = chat_jsonl(tmp_path / "chat.jsonl", n=12)
    out = tmp_path / "regen"
    assert main(["regenerate", "--target", str(target), "--prompts-from", str(data), "--out", str(out),
                 "--batch", "4", "--seq-len", "72", "--greedy-share", "1.0", "--threads", "2"]) == 0
    regen = load_regenerated(out)
    tok = load_tokenizer(target)
    eos = FAMILIES["qwen3"][2]
    assert len(regen.tokens) >= 8 and (regen.length <= 72).all()
    for row, p, n in zip(regen.tokens[:3], regen.prompt_len, regen.length):
        prompt = row[:p].tolist()
        assert prompt[-3:] == tok.convert_tokens_to_ids(["<|im_start|>", "assistant", "\n"])  # the generation prompt
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=72 - p, do_sample=False, eos_token_id=eos,
                              pad_token_id=0)[0, p:].tolist()
        assert row[p:n].tolist() == ref[:n - p]  # up to and including the first EOS, or to seq_len
    # an answer stops at its first EOS (kept), the rest of the row EOS-filled: take as EOS the third token
    # the target answers to the first prompt
    from hyflash.models.loading import load_target
    from hyflash.train.regenerate import ChatPrompts, RegenConfig, make_shard

    p0, first = int(regen.prompt_len[0]), regen.tokens[0]
    stop = int(first[p0 + 2])
    cfg = RegenConfig(batch=2, seq_len=72, greedy_share=1.0, prompt_len=None)
    shard = make_shard(load_target(target), ChatPrompts([first[:p0].tolist()] * 2, (stop,)), cfg, 0)
    cut = p0 + 1 + next(i for i, t in enumerate(first[p0:]) if t == stop)
    assert shard["length"].tolist() == [cut, cut] and (shard["tokens"][:, cut:] == stop).all()
    assert (shard["tokens"][0, :cut] == first[:cut]).all()
    rows = open_rows(out, target, None, None)
    allowed = rows.sample(np.random.default_rng(0), 8)
    for toks, ok in zip(allowed.tokens, allowed.anchorable):
        i = int(np.flatnonzero((regen.tokens == toks).all(1))[0])
        assert not ok[:regen.prompt_len[i] - 1].any() and not ok[regen.length[i] - 1:].any()
