"""`hyflash demo`: export the embedded reference pair (once), validate it, generate, compare.

The export is cached under $XDG_CACHE_HOME/hyflash (or ~/.cache/hyflash), keyed by the weights
and the code that exports them, so later runs skip straight to generation.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from tokenizers import Tokenizer

import hyflash.export as export_pkg
import hyflash.models as models_pkg
import hyflash.runtime_py as runtime_pkg
from hyflash import __version__
from hyflash.export.pipeline import ExportConfig, export
from hyflash.export.validate import summarize, validate
from hyflash.models.loading import resolve
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
from hyflash.runtime_py.manifest import load_manifest

# A short module to continue, as an editor asks a code model to (the reference target was trained on
# Python's standard library). It ends mid-line: a prompt ending in "\n" splits what the tokenizer merges
# in training ("\n" + indentation is one token), and a small target then starts an unindented line.
PROMPT = '''"""Word statistics for plain text files."""

import re
from collections import Counter

_WORD = re.compile(r"\\w+")


def read_words(path, encoding="utf-8"):
    """Return the list of words in the file at path, lower-cased."""
    with open(path, encoding=encoding) as f:
        return [word.lower() for word in _WORD.findall(f.read())]


def count_words(words):
    """Return a Counter of the words."""
    return Counter(words)


def most_common(path, n=10, encoding="utf-8"):
    """Return the n most common words of the file at path, with their counts."""
    words = read_words(path, encoding)
    return count_words(words).most_common(n)


def count_lines(path, encoding="utf-8"):
    """Return the number of lines in the file at path."""
    with open(path, encoding=encoding) as f:
        return sum(1 for line in f)


def count_chars(path, encoding="utf-8"):
    """Return the number of characters in the file at path."""
    with open(path, encoding=encoding) as f:'''

WARMUP_TOKENS = 8  # each mode's first calls (onnxruntime's first runs of a graph) are left out of the timing


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hyflash"


def export_key(target: Path, drafter: Path) -> str:
    """A digest of the reference weights and of the code that exports and runs them."""
    h = hashlib.sha256(__version__.encode())
    read_by_export = ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "hybrid.json")
    files = [target / n for n in read_by_export] + [drafter / n for n in read_by_export]
    for root in (Path(models_pkg.__file__).parent, Path(export_pkg.__file__).parent,
                 Path(runtime_pkg.__file__).parent):  # the manifest's format lives in runtime_py
        files += sorted(root.glob("*.py"))
    for f in files:
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def run_demo(max_new_tokens: int = 96, progress: bool = True) -> dict:
    target, drafter = resolve("reference", "target"), resolve("reference", "drafter")
    folder = cache_root() / f"reference-{export_key(target, drafter)}"
    try:
        load_manifest(folder)
    except (OSError, ValueError):
        print(f"exporting the reference pair to {folder} (once)", file=sys.stderr)
        export(ExportConfig(target=target, drafter=str(drafter), out=folder, formats=("onnx",), force=True),
               progress=True)
        for stale in folder.parent.glob("reference-*"):  # exports of older weights or code
            if stale != folder and stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
    failed = [r for r in summarize(validate(folder)) if not r.ok]
    if failed:
        raise RuntimeError(f"the cached export failed validation ({failed[0].graph}.{failed[0].output}); "
                           f"delete {folder} and rerun")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompt = tok.encode(PROMPT).ids
    runtime = Runtime(folder)
    modes = ("model", "none", "prompt-lookup") + (("hybrid",) if runtime.hybrid is not None else ())
    for draft in modes:
        list(runtime.generate(prompt, GenerationConfig(max_new_tokens=WARMUP_TOKENS, draft=draft)))
    spec, base = Stats(), Stats()
    out = sys.stdout if progress else sys.stderr
    print(PROMPT, end="", file=out, flush=True)
    shown = ""
    for _ in runtime.generate(prompt, GenerationConfig(max_new_tokens=max_new_tokens), spec):
        text = tok.decode(spec.tokens)
        print(text[len(shown):], end="", file=out, flush=True)
        shown = text
    print(file=out)
    for _ in runtime.generate(prompt, GenerationConfig(max_new_tokens=max_new_tokens, draft="none"), base):
        pass
    _same_as_target_only("speculative", spec, base)
    result = {**spec.to_json(), "text": shown, "speedup": spec.tokens_per_s / base.tokens_per_s,
              "target_only_tokens_per_s": base.tokens_per_s, "export": str(folder)}
    # the baseline a user would pick instead (prompt-lookup, free to draft), and hybrid drafting where the
    # drafter is calibrated for it (each round the drafter's block or lookup's)
    for draft in modes[2:]:
        other = Stats()
        for _ in runtime.generate(prompt, GenerationConfig(max_new_tokens=max_new_tokens, draft=draft), other):
            pass
        _same_as_target_only(draft, other, base)
        result[draft] = {"acceptance_length": other.acceptance_length, "tokens_per_s": other.tokens_per_s,
                         "speedup": other.tokens_per_s / base.tokens_per_s, "rounds": other.rounds}
        if draft == "hybrid":
            result[draft]["lookup_rounds"] = other.lookup_rounds
    return result


def _same_as_target_only(mode: str, stats: Stats, base: Stats) -> None:
    if stats.tokens != base.tokens:
        raise RuntimeError(f"{mode} output differs from target-only output: this is a bug, please report it")
