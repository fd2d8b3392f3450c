"""A user's own data for `train-drafter --data`, in the target's own tokens.

Accepted: a text file, a folder of files (every file read as text, `.jsonl` parsed), or `.jsonl`
with one JSON object per line holding either `text` (a document) or `messages` (a chat:
`[{"role": ..., "content": ...}, ...]`). Chats are rendered by the target's own chat template
(`transformers`' `apply_chat_template`, which reads `chat_template.jinja` or
`tokenizer_config.json`); every assistant turn becomes one document (the conversation up to and
including that turn, rendered as the model sees it when it writes that turn), and only the
turn's own tokens are trainable: anchors sit where the next token is the assistant's.

Documents are joined by the target's end-of-text id (`generation_config.json`, else `config.json`,
else the tokenizer's), token ids are int32 (vocabularies past 65,535), and one document in 50
(by a hash of its text) is held out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from hyflash.models.files import jsonl_objects
from hyflash.models.generation import end_of_text_ids

HELDOUT_EVERY = 50


@dataclasses.dataclass(frozen=True)
class Document:
    text: str | None = None
    messages: tuple[dict, ...] | None = None  # a chat, up to and including its last (assistant) turn

    @property
    def key(self) -> bytes:
        return (self.text if self.text is not None else json.dumps(self.messages, sort_keys=True)).encode()

    @property
    def heldout(self) -> bool:
        return int.from_bytes(hashlib.sha256(self.key).digest()[:4], "little") % HELDOUT_EVERY == 0


def end_of_text(folder: Path, tokenizer=None) -> int:
    """The first end-of-text id: what joins documents."""
    return end_of_text_ids(folder, tokenizer)[0]


def chat_prompts(path: Path, tokenizer, max_len: int) -> list[list[int]]:
    """Every assistant turn of the training-side chats as a prompt for the target to answer: the
    conversation before it, rendered with the template's generation prompt (one leaving less than 8 tokens of
    max_len for the answer: left out)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the target has no chat template (chat_template.jinja or tokenizer_config.json) to "
                         "render chat prompts with")
    out = []
    for doc in read_documents(path):
        if doc.messages is None or doc.heldout:
            continue
        ids = tokenizer.apply_chat_template(list(doc.messages[:-1]), tokenize=True, add_generation_prompt=True)
        if len(ids) < max_len - 8:  # room for an answer of at least a drafter's block
            out.append(list(ids))
    if not out:
        raise ValueError(f"{path}: no chat prompt shorter than --seq-len {max_len} (a .jsonl of "
                         "{\"messages\": [...]} with assistant turns)")
    return out


def read_documents(path: Path) -> Iterator[Document]:
    """Documents of a text file, a .jsonl file, or every file under a folder (sorted)."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if f.suffix == ".jsonl":
            yield from _jsonl(f)
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{f}: not UTF-8 text; --data takes text files, .jsonl, or folders of them") from None
        if text:
            yield Document(text=text)


def _jsonl(path: Path) -> Iterator[Document]:
    for i, obj in jsonl_objects(path):
        if isinstance(obj, dict) and isinstance(obj.get("text"), str):
            yield Document(text=obj["text"])
        elif isinstance(obj, dict) and isinstance(obj.get("messages"), list):
            messages = tuple(_message(path, i, m) for m in obj["messages"])
            for j, m in enumerate(messages):  # one document per assistant turn
                if m["role"] == "assistant":
                    yield Document(messages=messages[:j + 1])
        else:
            raise ValueError(f"{path}:{i}: expected an object with \"text\" (a string) or \"messages\" (a list)")


def _message(path: Path, line: int, m) -> dict:
    if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
        raise ValueError(f"{path}:{line}: every message needs a \"role\" and a \"content\" string")
    return {"role": m["role"], "content": m["content"]}


def encode(doc: Document, tokenizer) -> tuple[list[int], list[bool]]:
    """(ids, trainable): a text document is trainable throughout; a chat only in its last turn's tokens."""
    if doc.text is not None:
        ids = tokenizer(doc.text, add_special_tokens=False)["input_ids"]
        return ids, [True] * len(ids)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the data holds chats but the target has no chat template (chat_template.jinja or "
                         "tokenizer_config.json); give plain text instead")
    before = tokenizer.apply_chat_template(list(doc.messages[:-1]), tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(list(doc.messages), tokenize=False)
    if not full.startswith(before):
        raise ValueError("the chat template renders a conversation's history differently once the reply is added; "
                         "its assistant tokens cannot be located")
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    start = len(before)
    return enc["input_ids"], [s >= start and e > s for s, e in enc["offset_mapping"]]


@dataclasses.dataclass
class Stream:
    """Documents joined by end-of-text: ids (N,) int32 and trainable (N,) bool."""
    ids: np.ndarray
    trainable: np.ndarray
    documents: int
    chats: int


def build_streams(path: Path, tokenizer, eos: int, progress: bool = True) -> dict[str, Stream]:
    """{"train": ..., "heldout": ...} streams of the documents under `path`."""
    parts = {"train": ([], [], [0, 0]), "heldout": ([], [], [0, 0])}
    vocab = len(tokenizer)
    for doc in tqdm(read_documents(path), desc="tokenize", unit="doc", disable=not progress, dynamic_ncols=True):
        ids, trainable = encode(doc, tokenizer)
        ids, trainable = ids + [eos], trainable + [False]
        side = parts["heldout" if doc.heldout else "train"]
        side[0].extend(ids)
        side[1].extend(trainable)
        side[2][0] += 1
        side[2][1] += doc.messages is not None
    out = {}
    for name, (ids, trainable, (docs, chats)) in parts.items():
        arr = np.asarray(ids, np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= max(vocab, eos + 1)):
            raise ValueError(f"token id {int(arr.max())} is outside the tokenizer's {vocab} ids")
        out[name] = Stream(arr.astype(np.int32), np.asarray(trainable, bool), docs, chats)
    if not out["train"].documents:
        raise ValueError(f"{path}: no documents to train on")
    return out
