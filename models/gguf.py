"""A GGUF file (llama.cpp's format) -> an ordinary Hugging Face checkpoint folder.

`transformers` reads the GGUF (undoing llama.cpp's Q/K permutation and dequantizing every tensor to
fp32); this module writes what it read as safetensors, a config, the tokenizer, the chat template
and a `generation_config.json`, so every other part of hyflash sees a plain folder. Two things
differ from `save_pretrained`'s own output, both to make the folder behave as the original
checkpoint does:

- the tokenizer's post-processor adds no BOS (GGUF-derived tokenizers prepend one; the chat
  template writes its own markers and `apply_chat_template` adds nothing);
- no `tokenizer.model` (for a byte-level BPE `save_pretrained` writes the whole GGUF there).

A quantized GGUF (Q4_1, Q8_0, ...) becomes its dequantized fp32 model: that is "the fp32 model".
"""

from __future__ import annotations

import json
from pathlib import Path

from hyflash.models.files import building, write_json_atomic

# GGUF `general.architecture` -> the family hyflash exports (mistral GGUFs are written as "llama")
SUPPORTED = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "phi3": "Phi-3"}
MARKER = "hyflash_converted.json"  # written last: a folder holding it is a finished conversion


def read_metadata(path: Path) -> dict:
    """The GGUF's key/value metadata (scalars and short arrays; the token tables are left out)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as e:
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from None
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "merges", "token_type", "scores")):
            continue
        try:
            out[key] = field.contents()
        except (ValueError, IndexError, TypeError):
            continue
    return out


def architecture(path: Path) -> str:
    """The GGUF's family if hyflash supports it; otherwise a one-line refusal."""
    arch = read_metadata(path).get("general.architecture")
    if arch not in SUPPORTED:
        names = ", ".join(sorted(SUPPORTED))
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not one hyflash exports (supported: {names})")
    return arch


def convert(path: str | Path, out: str | Path, source: dict | None = None) -> Path:
    """Write `out` from the GGUF at `path` (the folder appears whole or not at all); returns `out`.
    `source` (where the GGUF came from) is recorded in the folder's marker file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, out = Path(path), Path(out)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    meta = read_metadata(path)
    arch = architecture(path)
    with building(out) as tmp:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype="float32")
        model.save_pretrained(tmp, safe_serialization=True)
        del model
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        tokenizer.save_pretrained(tmp)
        (tmp / "tokenizer.model").unlink(missing_ok=True)
        _drop_bos(tmp)
        _generation_config(tmp, meta)
        write_json_atomic(tmp / MARKER, {"gguf": path.name, "architecture": arch, **(source or {})})
    return out


def _drop_bos(folder: Path) -> None:
    """The tokenizer adds no special tokens of its own: its post-processor only undoes byte-level offsets."""
    path = folder / "tokenizer.json"
    if path.is_file():
        spec = json.loads(path.read_text())
        spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                  "use_regex": False}
        path.write_text(json.dumps(spec, ensure_ascii=False) + "\n")
    path = folder / "tokenizer_config.json"
    if path.is_file():
        config = json.loads(path.read_text())
        config["add_bos_token"] = False
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _generation_config(folder: Path, meta: dict) -> None:
    """Greedy by default; generation ends at the GGUF's end-of-sequence id and its end-of-turn id (if any)."""
    eos = [int(meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
    config = {"eos_token_id": sorted(set(eos), key=eos.index), "do_sample": False}
    if "tokenizer.ggml.bos_token_id" in meta:
        config["bos_token_id"] = int(meta["tokenizer.ggml.bos_token_id"])
    if "tokenizer.ggml.padding_token_id" in meta:
        config["pad_token_id"] = int(meta["tokenizer.ggml.padding_token_id"])
    write_json_atomic(folder / "generation_config.json", config)


def is_converted(folder: Path) -> bool:
    return (Path(folder) / MARKER).is_file() and (Path(folder) / "config.json").is_file()
