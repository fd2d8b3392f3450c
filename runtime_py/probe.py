"""`hyflash probe`: acceptance when the evidence for the continuation is near, or far back.

A probe prompt holds a passage of held-out text (96 tokens), filler of other held-out text (D
tokens), and the passage's first 24 tokens again (the cue). What comes next is predictable from
the passage, and the probes differ only in where the passage sits:

- nearby: filler, passage, cue: the passage ends right before the cue, inside any drafter's window;
- distant: passage, filler, cue: the passage is D + 24 tokens back, out of a window of W < D + 24.

With `chat`, each probe is a conversation rendered by the export's chat template: a user turn hands over
the passage to keep, another hands over the filler to read (each answered by a fixed short reply), in
the kind's order, then a turn asks for the kept text word for word, and the answer starts with the cue.
The distance is then the filler's tokens plus the template's few between the turns.

What is predicted is the target's own greedy continuation (64 tokens). `explained` is the share of
it that equals the passage's own continuation (tokens 24..87): how much the target uses the
evidence. A probe whose target does not copy shows a low `explained`, and its tau is then no
evidence about a drafter's memory. Every export runs every prompt (interleaved), with prompt-lookup
and target-only as rows; every greedy output is checked equal to target-only's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from tqdm import tqdm

from hyflash.models.generation import load_tokenizer
from hyflash.runtime_py.bench import export_tokenizer, open_exports, run_once, source_texts
from hyflash.runtime_py.chat import no_template
from hyflash.runtime_py.loop import Runtime

PASSAGE, CUE = 96, 24
KINDS = ("nearby", "distant")
KEEP = "Keep this text; I will ask you for it later:\n\n{}"
READ = "Here is something else to read:\n\n{}"
ACK = "Done."
ASK = "Now repeat the text I asked you to keep, word for word."


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    artifacts: tuple[Path, ...]
    kinds: tuple[str, ...] = KINDS
    distances: tuple[int, ...] = (256, 768, 1536)
    prompts: int = 8
    max_new_tokens: int = 64
    prompts_from: Path | None = None  # a file or a folder of .py files; default: the held-out split
    seed: int = 0
    backend: str = "onnxruntime"
    threads: int | None = None
    memory_history: int | None = None  # the ablation: each mamba2 drafter again, its memory limited to M (eager)
    chat: bool = False  # probes as conversations through the export's chat template

    def __post_init__(self):
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ValueError(f"--kind must be nearby, distant or both (comma-separated), got {','.join(self.kinds)}")
        if not self.distances or min(self.distances) < 1:
            raise ValueError(f"--distances must be positive integers, got {list(self.distances)}")
        if self.prompts < 1 or not 2 <= self.max_new_tokens <= PASSAGE - CUE:
            raise ValueError(f"--prompts must be >= 1 and --max-new-tokens in 2..{PASSAGE - CUE} (the first token "
                             "comes from prefill: one more makes a round)")


def _picks(stream: np.ndarray, distance: int, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """n (passage, filler) pairs. Passages depend on the seed only (the same at every kind and distance:
    paired comparisons); a filler is taken at least 2,048 tokens away from its passage."""
    need = PASSAGE + 2 * distance + 2 * 2048  # room for a filler on one side of any passage
    if len(stream) < need:
        raise ValueError(f"the probe text has {len(stream)} tokens; a distance of {distance} needs {need}")
    passage_rng, filler_rng = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1, distance])
    out = []
    for _ in range(n):
        p = int(passage_rng.integers(0, len(stream) - PASSAGE))
        while True:
            f = int(filler_rng.integers(0, len(stream) - distance + 1))
            if f + distance <= p - 2048 or f >= p + PASSAGE + 2048:
                break
        out.append((stream[p:p + PASSAGE], stream[f:f + distance]))
    return out


def probe_prompts(stream: np.ndarray, kind: str, distance: int, n: int, seed: int = 0
                  ) -> tuple[list[list[int]], np.ndarray]:
    """n prompts of `kind` with `distance` filler tokens, and the passages' continuations (n, 72)."""
    prompts, continuations = [], []
    for passage, filler in _picks(stream, distance, n, seed):
        parts = (filler, passage, passage[:CUE]) if kind == "nearby" else (passage, filler, passage[:CUE])
        prompts.append(np.concatenate(parts).tolist())
        continuations.append(passage[CUE:])
    return prompts, np.stack(continuations)


def chat_probe_prompts(tokenizer, stream: np.ndarray, kind: str, distance: int, n: int, seed: int = 0
                       ) -> tuple[list[list[int]], np.ndarray]:
    """The same probes as conversations (`tokenizer`: the export's, with its chat template): the passage and
    the filler handed over in turns in the kind's order, then the request, the answer started with the cue.
    A passage is its text re-encoded (whole, so the cue and continuation are the tokens the answer would
    hold); where that is shorter than PASSAGE tokens, the continuation's missing end is -1 (never matched)."""
    prompts, continuations = [], []
    for passage, filler in _picks(stream, distance, n, seed):
        text = tokenizer.decode(passage.tolist())
        keep = [{"role": "user", "content": KEEP.format(text)}, {"role": "assistant", "content": ACK}]
        read = [{"role": "user", "content": READ.format(tokenizer.decode(filler.tolist()))},
                {"role": "assistant", "content": ACK}]
        turns = (read + keep if kind == "nearby" else keep + read) + [{"role": "user", "content": ASK}]
        body = tokenizer.encode(text, add_special_tokens=False)
        body = body[:PASSAGE] + [-1] * (PASSAGE - len(body))
        prompts.append(list(tokenizer.apply_chat_template(turns, add_generation_prompt=True)) + body[:CUE])
        continuations.append(body[CUE:])
    return prompts, np.array(continuations, np.int64)


def chat_template_tokenizer(runtime: Runtime):
    """The export's tokenizer with its chat template; one line if the export has none."""
    if not (runtime.manifest.get("generation") or {}).get("chat_template"):
        raise ValueError(no_template(runtime.folder).replace("use --prompt", "probe without --chat"))
    return load_tokenizer(runtime.folder)


def probe(cfg: ProbeConfig, progress: bool = True) -> dict:
    runtimes, labels = open_exports(cfg.artifacts, cfg.backend, cfg.threads)
    if cfg.memory_history is not None:
        limited = [(f"{label}-history{cfg.memory_history}", Runtime(rt.folder, "eager", cfg.threads,
                                                                    memory_history=cfg.memory_history))
                   for label, rt in zip(labels, runtimes) if rt.manifest["drafter"]["config"]["memory"] == "mamba2"]
        if not limited:
            raise ValueError("--memory-history needs an export whose drafter has mamba2 memory")
        labels, runtimes = labels + [lab for lab, _ in limited], runtimes + [rt for _, rt in limited]
    first = runtimes[0]
    tokenizer = export_tokenizer(first)
    stream = np.array([t for text in source_texts(cfg.prompts_from) for t in tokenizer.encode(text).ids], np.int64)
    chat_tokenizer = chat_template_tokenizer(first) if cfg.chat else None

    def fits(longest: int) -> None:
        if longest > first.usable_context:
            raise ValueError(f"a distance of {max(cfg.distances)} makes {longest}-token probes; this export's usable "
                             f"context is {first.usable_context}: use shorter --distances")

    fits(PASSAGE + max(cfg.distances) + CUE + cfg.max_new_tokens)  # before building: a chat probe's turns add more
    cells = {(k, d): (chat_probe_prompts(chat_tokenizer, stream, k, d, cfg.prompts, cfg.seed) if cfg.chat
                      else probe_prompts(stream, k, d, cfg.prompts, cfg.seed)) for k in cfg.kinds for d in cfg.distances}
    fits(max(len(p) for prompts, _ in cells.values() for p in prompts) + cfg.max_new_tokens)
    runs = ([("target-only", first, "none")] + [(lab, rt, "model") for lab, rt in zip(labels, runtimes)]
            + [("prompt-lookup", first, "prompt-lookup")])
    bar = tqdm(total=len(cells) * cfg.prompts * len(runs), desc="probe", disable=not progress, dynamic_ncols=True)
    rows = []
    for (kind, distance), (prompts, continuations) in cells.items():
        tokens = {label: 0 for label, _, _ in runs}
        rounds = dict(tokens)
        explained = []
        for prompt, expected in zip(prompts, continuations):
            reference = None
            for label, rt, draft in runs:
                stats = run_once(rt, prompt, draft, cfg.max_new_tokens)
                if reference is None:
                    reference = stats.tokens
                elif stats.tokens != reference:
                    raise AssertionError(f"{label}: greedy speculative output differs from target-only output on a "
                                         f"{kind} probe (distance {distance}): the loop is not exact")
                tokens[label] += len(stats.tokens) - 1
                rounds[label] += stats.rounds
                bar.update()
            explained.append(float(np.mean(np.array(reference) == expected[:len(reference)])))
        rows.append({"kind": kind, "distance": distance, "prompts": len(prompts),
                     "explained": float(np.mean(explained)),
                     "tau": {label: tokens[label] / rounds[label] for label, _, _ in runs[1:]}})
    bar.close()
    return {"artifacts": [str(a) for a in cfg.artifacts], "backend": cfg.backend, "memory_history": cfg.memory_history,
            "chat": cfg.chat, "passage": PASSAGE, "cue": CUE,
            "max_new_tokens": cfg.max_new_tokens, "window": {lab: rt.manifest["window"] for lab, rt in
                                                              zip(labels, runtimes)}, "rows": rows}


def format_probe(report: dict) -> str:
    labels = list(report["rows"][0]["tau"])
    lines = [f"{'probe':<9} {'distance':>8} {'explained':>9} " + " ".join(f"{lab:>14}" for lab in labels)]
    for r in report["rows"]:
        lines.append(f"{r['kind']:<9} {r['distance']:>8} {r['explained']:>9.0%} "
                     + " ".join(f"{r['tau'][lab]:>14.2f}" for lab in labels))
    return "\n".join(lines)


def plot_probe(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(r["kind"] for r in report["rows"]))
    labels = list(report["rows"][0]["tau"])
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        rows = [r for r in report["rows"] if r["kind"] == kind]
        x = [r["distance"] for r in rows]
        for lab in labels:
            ax.plot(x, [r["tau"][lab] for r in rows], marker="o", label=lab)
        ax.set(title=f"{kind} evidence (explained: " + ", ".join(f"{r['explained']:.0%}" for r in rows) + ")",
               xlabel="filler tokens", ylabel="tau (tokens per round)", xscale="log")
        ax.set_xticks(x, [str(d) for d in x])
        ax.set_xticks([], minor=True)  # a log axis labels its minor ticks too, over the distances
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
