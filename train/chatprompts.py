"""Chat prompts made on this machine, with no hub: what `hyflash regenerate` answers to make a drafter's
chat training data.

Five sources, mixed and shuffled so that any prefix of the file has the same makeup:

- **self-written questions** (the "Magpie" way): the target's template up to the start of a user
  turn, and the target writes the user's message itself (sampled), kept if it ends at the
  template's end of turn, is not too short or long, and is no duplicate;
- **self-written writing tasks**: the same, the user's message begun with an opener ("Write a short
  poem", "Draft an email", ...) that the target completes;
- **self-written short questions and code requests**: the same with openers the way people ask ("Why do",
  "What is the difference between", "Write a Python function that", ...): Magpie's own questions are
  long requests for advice, while people often ask in a line;
- **code tasks** on functions of the interpreter's standard library (train split of `hyflash
  corpus`): explain, document, fix (one operator changed), complete (first half given), rewrite;
- **passage tasks** on prose docstrings of the same files: summarise, rewrite, extract.

A share of conversations gets a second user turn (a follow-up fitting its kind), answered after the
first answer. Every prompt near-duplicating a held-out prompt (`near_duplicate`) is dropped.
Written as `{"turns": [...], "category": ..., "source": ...}` lines (the held-out set's format).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import re
import textwrap
from pathlib import Path

import numpy as np
import torch

from hyflash.models.batched import answer_batch
from hyflash.models.files import jsonl_objects
from hyflash.models.stdlib import is_heldout, stdlib_files, stdlib_root
from hyflash.models.target import Target

SENTINEL = "\u2063HYFLASH\u2063"
MAGPIE_TEMPERATURE = 0.7  # at 1.0 a 135 M model writes many incoherent questions

CODE_TASKS = {
    "explain": "Explain what this Python function does:\n\n```python\n{code}```",
    "document": "Write a docstring for this Python function:\n\n```python\n{code}```",
    "fix": "This Python function has a bug. Find it and fix it:\n\n```python\n{code}```",
    "complete": "Complete this Python function:\n\n```python\n{code}```",
    "rewrite": "Rewrite this Python function to make it shorter and easier to read:\n\n```python\n{code}```",
}
PASSAGE_TASKS = [
    ("rewrite", "Summarise the following text in two sentences."),
    ("rewrite", "Summarise the following text in three bullet points."),
    ("rewrite", "Rewrite the following text in simpler words."),
    ("rewrite", "Paraphrase the following text."),
    ("extraction", "List the technical terms used in the following text."),
    ("extraction", "Extract every function, class or module name mentioned in the following text."),
    ("extraction", "List the main facts stated in the following text."),
    ("extraction", "What does the following text say should be passed as arguments? Answer with a list."),
]
FOLLOW_UPS = {
    "question": ["Can you explain that more simply?", "Can you give an example?", "Why is that?",
                 "Summarise your answer in one sentence.", "What else should I know about it?"],
    "code": ["Can you add comments to the code?", "How would you test this?", "Can you make it faster?",
             "Explain it step by step.", "What happens with an empty input?"],
    "rewrite": ["Make it shorter.", "Now write it as a list.", "Make it more formal."],
    "extraction": ["Put them in alphabetical order.", "Which of these is the most important?",
                   "Now answer in one sentence."],
    "writing": ["Make it shorter.", "Make it more formal.", "Give it a title.", "Write it for a child.",
                "Write another version."],
}
WRITING_OPENERS = ("Write a short poem", "Write a short story", "Write an email", "Write a letter", "Write a",
                   "Write a paragraph", "Write a dialogue", "Write a speech", "Write a description",
                   "Compose a", "Draft an email", "Draft a message", "Describe", "Tell a story")
QUESTION_OPENERS = ("What is", "What are", "Why do", "Why is", "How does", "How do", "What causes",
                    "What is the difference between", "How can I", "Explain", "What are some", "Who was",
                    "When did", "Give me", "Is it true that", "What happens when")
CODE_OPENERS = ("Write a Python function that", "Write a Python function to", "Write a Python program that",
                "Write a Python class", "Write a function that", "Write a Python script that", "In Python, how do I",
                "Write a Python function which")
SHORT_WORDS = 30  # the short questions and code requests kept: at most this many words


@dataclasses.dataclass(frozen=True)
class SelfWritten:
    """A source of user messages the target writes itself: the `PromptMix` field counting it, what its progress
    calls them, its category, the openers it completes (taken in turn; "": it writes the whole message), its own
    sampling stream, the suffix of its kept-batches file, and the most words a kept message may have."""
    field: str
    label: str
    category: str
    openers: tuple[str, ...]
    stream: int
    keep_suffix: str
    max_words: int = 80


SELF_WRITTEN = {  # by source, in the order `build` writes them
    "magpie": SelfWritten("magpie", "questions", "question", ("",), 0, ""),
    "magpie-writing": SelfWritten("writing", "writing tasks", "writing", WRITING_OPENERS, 1, ".writing"),
    "magpie-questions": SelfWritten("questions", "short questions", "question", QUESTION_OPENERS, 2, ".questions",
                                    SHORT_WORDS),
    "magpie-code": SelfWritten("code_requests", "code requests", "code", CODE_OPENERS, 3, ".code", SHORT_WORDS),
}


@dataclasses.dataclass(frozen=True)
class PromptMix:
    magpie: int = 2000  # self-written questions kept (at most; duplicates and rejects removed)
    writing: int = 500  # self-written writing tasks kept (at most, as magpie)
    questions: int = 0  # self-written short questions ("Why do", "What is", ...)
    code_requests: int = 0  # self-written code requests ("Write a Python function that", ...)
    code: int = 2000
    passages: int = 1500
    follow_up_share: float = 0.25
    seed: int = 0
    batch: int = 64

    def __post_init__(self):
        if min(self.magpie, self.writing, self.questions, self.code_requests, self.code, self.passages) < 0:
            raise ValueError("prompt counts must be >= 0")
        if not 0 <= self.follow_up_share <= 1:
            raise ValueError(f"--follow-up-share must be in [0, 1], got {self.follow_up_share}")


def normalise(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def near_duplicate(a: str, b: str) -> bool:
    """Two prompts that say nearly the same: their word sequences 75% alike (difflib's ratio), or one holding
    the other whole (four words or more)."""
    a, b = normalise(a), normalise(b)
    short, long = sorted((a, b), key=len)
    if len(short) >= 4 and " ".join(short) in " ".join(long):
        return True
    m = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return m.real_quick_ratio() >= 0.75 and m.quick_ratio() >= 0.75 and m.ratio() >= 0.75


def user_prefix(tokenizer) -> list[int]:
    """The template's tokens before a first user message's text (its default system turn included)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False,
                                         add_generation_prompt=False)
    return tokenizer.encode(text[:text.index(SENTINEL)], add_special_tokens=False)


def magpie(model: Target, tokenizer, eos: tuple[int, ...], n: int, seed: int, batch: int,
           progress=lambda done, total: None, keep: Path | None = None, openers: tuple[str, ...] = ("",),
           stream: int = 0, max_words: int = 80) -> list[str]:
    """Up to n distinct user messages the target writes itself after its template's user-turn prefix, each
    begun with one of `openers` in turn ("": the target writes it all), of 4 to `max_words` words. `stream`
    keeps the sampling of another source apart. `keep`: a file the batches are appended to as they finish
    (one JSON list each), read back by a rerun."""
    prefix = user_prefix(tokenizer)
    starts = [tokenizer.encode(o, add_special_tokens=False) for o in openers]
    out: list[str] = []
    seen: set[str] = set()
    batches = [json.loads(line) for line in keep.read_text().splitlines()] if keep and keep.is_file() else []
    tries = 0
    while len(out) < n and tries < 4 * n:
        gen = torch.Generator().manual_seed(seed * 100_003 + tries + stream * 1_000_003)  # each batch its own seed
        if batches:
            texts = batches.pop(0)
        else:
            begun = [starts[(tries + j) % len(starts)] for j in range(batch)]
            answers = answer_batch(model, [prefix + b for b in begun], 96, torch.full((batch,), MAGPIE_TEMPERATURE),
                                   gen, stop=eos)
            texts = [tokenizer.decode(b + a.tokens[:-1], skip_special_tokens=True).strip()
                     if a.tokens and a.tokens[-1] in eos else None  # None: ran past 96 tokens
                     for b, a in zip(begun, answers)]
            if keep:
                with open(keep, "a", encoding="utf-8") as f:
                    f.write(json.dumps(texts) + "\n")
        tries += batch
        for text in texts:
            if text is None:
                continue
            key = " ".join(normalise(text))
            if not 4 <= len(key.split()) <= max_words or key in seen or SENTINEL in text or text in openers:
                continue
            seen.add(key)
            out.append(text)
        progress(len(out), n)
    return out[:n]


def _functions(limit_files: int | None = None) -> list[str]:
    """Functions of 4-30 lines from the stdlib's train split, dedented, docstrings removed."""
    root = stdlib_root()
    out = []
    for rel in stdlib_files(root)[:limit_files]:
        if is_heldout(rel):
            continue
        try:
            source = (root / rel).read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("__"):
                if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
                    if len(node.body) == 1:
                        continue
                    node.body = node.body[1:]
                try:
                    code = ast.unparse(node) + "\n"
                except (ValueError, RecursionError):
                    continue
                if 4 <= code.count("\n") <= 30 and len(code) <= 1500:
                    out.append(code)
    return out


MUTATIONS = [(" < ", " <= "), (" <= ", " < "), (" > ", " >= "), (" == ", " != "), (" + 1", " - 1"),
             (" and ", " or "), ("[1:]", "[:-1]"), (" is None", " is not None")]


def _mutate(code: str, rng: np.random.Generator) -> str | None:
    """The function with one operator changed (a bug to find), or None if none applies."""
    options = [(a, b) for a, b in MUTATIONS if a in code]
    if not options:
        return None
    a, b = options[int(rng.integers(len(options)))]
    spots = [m.start() for m in re.finditer(re.escape(a), code)]
    at = spots[int(rng.integers(len(spots)))]
    return code[:at] + b + code[at + len(a):]


def code_prompts(n: int, rng: np.random.Generator, limit_files: int | None = None) -> list[dict]:
    """n code tasks on functions of the stdlib's train split (its first `limit_files` files only, if given)."""
    functions = _functions(limit_files)
    order = rng.permutation(len(functions))
    out = []
    for i in order:
        if len(out) >= n:
            break
        task = list(CODE_TASKS)[int(rng.integers(len(CODE_TASKS)))]
        code = functions[i]
        if task == "fix":
            code = _mutate(code, rng)
            if code is None:
                continue
        elif task == "complete":
            lines = code.splitlines(keepends=True)
            code = "".join(lines[:max(2, len(lines) // 2)])
        out.append({"turns": [CODE_TASKS[task].format(code=code)], "category": "code", "source": f"stdlib-{task}"})
    return out


def _passages() -> list[str]:
    """Prose docstrings (modules, classes, functions) of 300-1,200 characters from the stdlib's train split."""
    root = stdlib_root()
    out = []
    for rel in stdlib_files(root):
        if is_heldout(rel):
            continue
        try:
            tree = ast.parse((root / rel).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if not doc:
                    continue
                doc = textwrap.dedent(doc).strip()
                if len(doc) > 1200:  # cut at a paragraph boundary
                    doc = doc[:1200].rsplit("\n\n", 1)[0]
                symbols = sum(doc.count(c) for c in "()[]{}=>_")
                if 300 <= len(doc) <= 1200 and symbols < len(doc) / 40:
                    out.append(doc)
    return out


def passage_prompts(n: int, rng: np.random.Generator) -> list[dict]:
    passages = _passages()
    out = []
    for i in rng.permutation(len(passages))[:n]:
        category, instruction = PASSAGE_TASKS[int(rng.integers(len(PASSAGE_TASKS)))]
        out.append({"turns": [f"{instruction}\n\n{passages[i]}"], "category": category, "source": "stdlib-docstring"})
    return out


def kept_batches(keep: Path) -> dict[str, Path]:
    """The files `build` keeps its self-written batches in for a rerun, by source: Magpie's questions' is
    `keep` itself, the others' carry their source's suffix."""
    return {source: keep.with_name(keep.name + w.keep_suffix) for source, w in SELF_WRITTEN.items()}


def build(model: Target, tokenizer, eos: tuple[int, ...], mix: PromptMix, heldout: list[dict],
          progress=lambda kind, done, total: None, keep: Path | None = None) -> tuple[list[dict], dict]:
    """The prompts (shuffled, follow-ups added, held-out near-duplicates dropped) and a summary.
    `keep`: where the self-written batches are kept for a rerun (`kept_batches`)."""
    rng = np.random.default_rng(mix.seed)
    rows = []
    for source, w in SELF_WRITTEN.items():
        if n := getattr(mix, w.field):
            rows += [{"turns": [t], "category": w.category, "source": source}
                     for t in magpie(model, tokenizer, eos, n, mix.seed, mix.batch,
                                     lambda done, total, label=w.label: progress(label, done, total),
                                     kept_batches(keep)[source] if keep else None, w.openers, w.stream,
                                     w.max_words)]
    rows += code_prompts(mix.code, rng)
    rows += passage_prompts(mix.passages, rng)
    held = [t for h in heldout for t in h["turns"]]
    kept = [r for r in rows if not any(near_duplicate(r["turns"][0], h) for h in held)]
    for r in kept:
        if rng.random() < mix.follow_up_share:
            options = FOLLOW_UPS[r["category"]]
            r["turns"].append(options[int(rng.integers(len(options)))])
    kept = [kept[i] for i in rng.permutation(len(kept))]
    summary = {"conversations": len(kept), "dropped_as_heldout_near_duplicates": len(rows) - len(kept),
               "by_source": _count(kept, "source"), "by_category": _count(kept, "category"),
               "multi_turn": sum(len(r["turns"]) > 1 for r in kept), **dataclasses.asdict(mix)}
    return kept, summary


def _count(rows: list[dict], key: str) -> dict:
    out: dict = {}
    for r in rows:
        out[r[key]] = out.get(r[key], 0) + 1
    return dict(sorted(out.items()))


def read_conversations(path: Path) -> list[dict]:
    """`{"turns": [...], ...}` lines; one-line errors for anything else."""
    out = []
    for n, row in jsonl_objects(path):
        turns = row.get("turns") if isinstance(row, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise ValueError(f'{path}:{n}: expected {{"turns": ["user message", ...]}} with non-empty strings')
        out.append(row)
    if not out:
        raise ValueError(f"{path}: no conversations")
    return out
