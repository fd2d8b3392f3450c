"""What a checkpoint says about generating from it: end-of-text ids, sampling defaults, the files
an app needs to talk to the model (tokenizer and chat template, as `transformers` saves them).

The export copies these into its folder (docs/design.md, "The export folder"), so that an app
holds everything without the original checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

# the tokenizer and chat-template files `transformers` reads beside a model; a fast tokenizer (tokenizer.json)
# makes the slow tokenizer's files (vocab.json, merges.txt, tokenizer.model) unread, so they are carried only
# where there is no tokenizer.json
TALK_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
              "chat_template.json", "added_tokens.json")
SLOW_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.model")


def talk_files(folder: Path) -> list[str]:
    """The names of `folder`'s files an app needs to tokenize and render chats, as the runtime reads them."""
    folder = Path(folder)
    names = TALK_FILES if (folder / "tokenizer.json").is_file() else TALK_FILES + SLOW_TOKENIZER_FILES
    return [n for n in names if (folder / n).is_file()]


def end_of_text_ids(folder: Path, tokenizer=None) -> list[int]:
    """The target's end-of-text ids: generation_config.json, else config.json, else the tokenizer's."""
    for name in ("generation_config.json", "config.json"):
        path = Path(folder) / name
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            if isinstance(eos, list) and eos:
                return [int(e) for e in eos]
            if isinstance(eos, int):
                return [eos]
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        return [int(tokenizer.eos_token_id)]
    raise ValueError(f"{folder}: no end-of-text id (set eos_token_id in generation_config.json or config.json)")


def load_tokenizer(folder: Path):
    """The target's own tokenizer, as `transformers` loads it (with its chat template)."""
    from transformers import AutoTokenizer

    if not any((Path(folder) / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(f"{folder}: no tokenizer.json or tokenizer_config.json; pass --tokenizer or add "
                                "the checkpoint's tokenizer files")
    return AutoTokenizer.from_pretrained(str(folder))


def generation_config(folder: Path):
    """The checkpoint's `transformers.GenerationConfig`: its generation_config.json, else the one
    `transformers` derives from config.json (what `model.generate` would use)."""
    from transformers import AutoConfig, GenerationConfig

    folder = Path(folder)
    if (folder / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(str(folder))
    return GenerationConfig.from_model_config(AutoConfig.from_pretrained(str(folder)))


# settings `transformers` would apply that the speculative loop does not (it samples from the target's
# distribution after temperature, top-k and top-p only): name -> the value that means "off"
UNSUPPORTED = {"repetition_penalty": 1.0, "min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0,
               "eta_cutoff": 0.0, "no_repeat_ngram_size": 0, "num_beams": 1}


def sampling_defaults(gen) -> tuple[dict, list[str]]:
    """A GenerationConfig's sampling settings as the runtime takes them (greedy unless do_sample), and
    the settings it sets that the runtime does not apply ("name=value")."""
    ignored = [f"{k}={getattr(gen, k)}" for k, off in UNSUPPORTED.items() if getattr(gen, k, off) not in (off, None)]
    if not gen.do_sample:
        return {"temperature": 0.0, "top_p": 1.0, "top_k": 0}, ignored
    return {"temperature": float(gen.temperature if gen.temperature is not None else 1.0),
            "top_p": float(gen.top_p if gen.top_p is not None else 1.0),
            "top_k": int(gen.top_k or 0)}, ignored
