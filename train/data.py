"""The reference corpus (the interpreter's standard library), its split, the tokenizer, batches.

The split is by file, on a stable hash of the path relative to the stdlib root, so every
machine with the same Python puts the same files on the same side; `corpus` records it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from hyflash.models.stdlib import HELDOUT_PERCENT, is_heldout, stdlib_files, stdlib_root

EOS = "<|endoftext|>"


def write_corpus(out: Path, root: Path | None = None) -> dict:
    """Write train.txt and heldout.txt (files joined by EOS) and split.json into `out`."""
    root = root or stdlib_root()
    out.mkdir(parents=True, exist_ok=True)
    split = {"train": [], "heldout": []}
    texts = {"train": [], "heldout": []}
    for rel in stdlib_files(root):
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        side = "heldout" if is_heldout(rel) else "train"
        split[side].append(rel)
        texts[side].append(text)
    for side in texts:
        (out / f"{side}.txt").write_text(EOS.join(texts[side]) + EOS, encoding="utf-8")
    record = {"python": sys.version.split()[0], "stdlib": str(root), "heldout_percent": HELDOUT_PERCENT,
              "hash": "sha256(relative path)[:4] little-endian % 100 < heldout_percent",
              "files": {k: len(v) for k, v in split.items()},
              "bytes": {k: sum(len(t.encode()) for t in v) for k, v in texts.items()},
              "heldout": split["heldout"]}
    (out / "split.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def train_tokenizer(train_txt: Path, vocab_size: int, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=True,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_documents(train_txt), trainer=trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))


def _documents(path: Path):
    yield from path.read_text(encoding="utf-8").split(EOS)


def encode_file(tokenizer_path: Path, text_path: Path) -> np.ndarray:
    """The whole text as one int32 stream (vocabularies past 65,535), documents separated by the EOS id."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    eos = tok.token_to_id(EOS)
    docs = [d for d in _documents(text_path) if d]
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


def check_corpus(corpus: Path, tokenizer_path: Path, side: str = "train") -> None:
    """Missing inputs name the command that makes them."""
    if not (Path(corpus) / f"{side}.txt").is_file():
        raise FileNotFoundError(f"{Path(corpus) / f'{side}.txt'}: no corpus there; make it with "
                                f"`hyflash corpus --out {corpus}` (or pass --corpus DIR)")
    if not Path(tokenizer_path).is_file():
        raise FileNotFoundError(f"{tokenizer_path}: no tokenizer there; make it with "
                                f"`hyflash train-tokenizer --corpus {corpus}` (or pass --tokenizer FILE)")


def token_stream(corpus: Path, tokenizer_path: Path, side: str) -> np.ndarray:
    """Tokens of a split, cached next to the corpus as .npy (keyed by the tokenizer's hash)."""
    corpus, tokenizer_path = Path(corpus), Path(tokenizer_path)
    check_corpus(corpus, tokenizer_path, side)
    key = hashlib.sha256(tokenizer_path.read_bytes()).hexdigest()[:12]
    cache = corpus / f"{side}.{key}.npy"
    if cache.is_file():
        return np.load(cache)
    ids = encode_file(tokenizer_path, corpus / f"{side}.txt")
    np.save(cache, ids)
    return ids


def sample_windows(stream: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """n random windows of `length` tokens: (n, length) int64."""
    starts = rng.integers(0, len(stream) - length, size=n)
    return np.stack([stream[s:s + length] for s in starts]).astype(np.int64)
