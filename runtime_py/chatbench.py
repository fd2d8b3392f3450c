"""`hyflash bench EXPORTS --chat FILE.jsonl`: acceptance and speed on chat, every drafting mode of every export
against that export's own target-only decoding, the peers beside them.

FILE holds `{"turns": [...], "category": ...}` lines (the MT-bench question format). Every user turn is
answered in order through the export's chat template, the conversation's cache and drafter state kept
between turns as `hyflash chat` keeps them; an answer ends at the template's end of turn or at
`max_new_tokens`. For each conversation the runs are interleaved (each export's target-only, then its
drafting modes; then the peers), so machine drift hits all of them alike. Every answer of a drafting
mode is checked against its own export's target-only answer (greedy: they must be equal). A peer's
answers are compared too, for information: its plain decoding with hyflash's target-only of the same
precision, its n-gram speculation with its own plain decoding.

Reported per category and pooled: tau (tokens per verify round, bonus included), decode tokens/s
(tokens after the first / decode time), time to first token, speedup (median of per-conversation
ratios to the same export's target-only), the drafter's share of a round's graph time, and the share
of answers that hit the token cap. Peers are fed the ids hyflash's target-only run of the matching
precision read at each turn.

With a runner (`hyflash-run`), every .pte export is also answered by it, target-only and drafted (the
drafter's blocks and prompt-lookup's, under each width policy), as an app would: one runner a conversation
(`--conversation`), fed the ids the Python target-only run read at each turn, keeping its context between
turns as the Python runtime does. Its drafted answers must equal its own target-only answers, and those the
Python runtime's when that ran the same programs (`--backend executorch`); against other programs (ONNX)
they are compared for information.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import sys
import time
from collections import Counter
from importlib import metadata
from pathlib import Path

from tqdm import tqdm

from hyflash.models.chat import Transcript
from hyflash.models.files import jsonl_objects
from hyflash.models.generation import load_tokenizer
from hyflash.runtime_py.backends import BACKENDS
from hyflash.runtime_py.bench import open_exports
from hyflash.runtime_py.chat import Conversation
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
from hyflash.runtime_py.manifest import DRAFTER_GRAPHS, PTE_FILE
from hyflash.runtime_py.native import run_conversation
from hyflash.runtime_py.peers import PEERS, PeerRun, open_peers
from hyflash.runtime_py.ptekernels import chosen

PACKAGES = ("hyflash", "torch", "transformers", "onnxruntime", "executorch", "onnxruntime-genai", "optimum-onnx")


@dataclasses.dataclass(frozen=True)
class ChatBenchConfig:
    artifacts: tuple[Path, ...]
    chat: Path
    max_new_tokens: int = 128
    threads: int | None = None
    backend: str = "onnxruntime"
    limit: int | None = None  # the first N conversations only
    per_category: int | None = None  # the first N conversations of each category only
    peers: tuple[str, ...] = ()
    runner: Path | None = None  # hyflash-run: the .pte exports answered by it too
    widths: tuple = ("full",)  # each drafting mode once per width policy: full, a verify width, rule

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not self.artifacts:
            raise ValueError("give at least one export folder")
        if self.max_new_tokens < 1:
            raise ValueError("--max-new-tokens must be positive")
        bad = [p for p in self.peers if p not in PEERS]
        if bad:
            raise ValueError(f"--peer takes {', '.join(PEERS)}; got {bad[0]!r}")
        if self.runner is not None and not Path(self.runner).is_file():
            raise FileNotFoundError(f"{self.runner}: no hyflash-run there; build it with `make runner`")


def read_chats(path: Path, limit: int | None = None, per_category: int | None = None) -> list[dict]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file; --chat takes a .jsonl of {{\"turns\": [...], \"category\": ...}}")
    rows = []
    for n, row in jsonl_objects(path):
        turns = row.get("turns") if isinstance(row, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise ValueError(f'{path}:{n}: expected {{"turns": ["user message", ...], "category": ...}}')
        rows.append({"turns": turns, "category": str(row.get("category", "all"))})
    if not rows:
        raise ValueError(f"{path}: no conversations")
    if per_category:
        seen: Counter = Counter()
        kept = []
        for r in rows:
            seen[r["category"]] += 1
            if seen[r["category"]] <= per_category:
                kept.append(r)
        rows = kept
    return rows[:limit] if limit else rows


def modes(runtime: Runtime, widths: tuple = ("full",)) -> list[str]:
    """The drafting modes an export supports, target-only first; each drafting mode once per width policy
    (`mode@policy`, plain `mode` for the full block)."""
    drafting = (["model"] if runtime.manifest["drafter"]["name"] != "random" else []) + ["prompt-lookup"]
    if runtime.hybrid is not None and runtime.confidence() is not None:
        drafting.append("hybrid")
    return ["none"] + [m if w == "full" else f"{m}@{w}" for m in drafting for w in widths]


def converse(runtime: Runtime, tokenizer, turns: list[str], mode: str, max_new: int) -> list[Stats]:
    """Every turn answered in order, the conversation kept between turns: one Stats a turn. mode: a drafting
    mode, with `@policy` for a verify width other than the full block."""
    draft, _, width = mode.partition("@")
    width = int(width) if width.isdigit() else width or "full"
    conversation = Conversation(runtime, tokenizer, GenerationConfig(max_new_tokens=max_new, draft=draft, width=width))
    out = []
    for message in turns:
        stats = Stats()
        for _ in conversation.turn(message, stats):
            pass
        out.append(stats)
    return out


@dataclasses.dataclass
class Answers:
    """One mode's answers to one conversation (one entry per turn)."""
    category: str
    tokens: list[list[int]]
    ttft_s: list[float]
    decode_s: list[float]
    rounds: int = 0
    drafter_ms: float = 0.0
    graph_ms: float = 0.0
    capped: int = 0
    same: int | None = None  # answers equal to the same export's target-only answers
    widths: dict = dataclasses.field(default_factory=dict)  # rounds by rows verified (1: a plain step)

    @property
    def decode_tokens(self) -> int:
        return sum(max(len(t) - 1, 0) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / sum(self.decode_s) if sum(self.decode_s) else 0.0

    @classmethod
    def of_stats(cls, category: str, stats: list[Stats], max_new: int) -> "Answers":
        decode = {g: ms for s in stats for g, ms in s.graph_ms.items() if not g.startswith("prefill/")}
        return cls(category, [s.tokens for s in stats], [s.prefill_s for s in stats], [s.decode_s for s in stats],
                   rounds=sum(s.rounds for s in stats),
                   drafter_ms=sum(ms for g, ms in decode.items() if g in DRAFTER_GRAPHS),
                   graph_ms=sum(decode.values()),
                   capped=sum(s.stop_reason == "max_new_tokens" for s in stats),
                   widths={w: sum(s.widths.get(w, 0) for s in stats) for w in {w for s in stats for w in s.widths}})

    @classmethod
    def of_native(cls, category: str, runs: list[dict]) -> "Answers":
        """From hyflash-run's JSON, one per turn (graph_ms there is per call)."""
        decode = [(g, ms * r["graph_calls"][g]) for r in runs for g, ms in r["graph_ms"].items()
                  if not g.startswith("prefill/")]
        return cls(category, [r["tokens"] for r in runs], [r["prefill_s"] for r in runs], [r["decode_s"] for r in runs],
                   rounds=sum(r["rounds"] for r in runs), drafter_ms=sum(ms for g, ms in decode if g in DRAFTER_GRAPHS),
                   graph_ms=sum(ms for _, ms in decode), capped=sum(r["stop_reason"] == "max_new_tokens" for r in runs),
                   widths={int(w): sum(r["widths"].get(w, 0) for r in runs) for w in {w for r in runs for w in r["widths"]}})

    @classmethod
    def of_peer(cls, category: str, runs: list[PeerRun], max_new: int) -> "Answers":
        return cls(category, [r.tokens for r in runs], [r.ttft_s for r in runs], [r.decode_s for r in runs],
                   capped=sum(len(r.tokens) >= max_new for r in runs))


def summarise(label: str, answers: list[Answers], baseline: list[Answers]) -> dict:
    """One row: pooled over `answers` (conversations), speedup against `baseline` (same conversations)."""
    n_answers = sum(len(a.tokens) for a in answers)
    rounds = sum(a.rounds for a in answers)
    ratios = [a.tokens_per_s / b.tokens_per_s for a, b in zip(answers, baseline) if b.tokens_per_s]
    row = {"run": label, "conversations": len(answers), "answers": n_answers,
           "tau": (sum(a.decode_tokens for a in answers) / rounds) if rounds else 1.0,
           "decode_tokens_per_s": sum(a.decode_tokens for a in answers) / max(sum(sum(a.decode_s) for a in answers), 1e-9),
           "speedup": statistics.median(ratios) if ratios else 0.0,
           "ttft_ms": 1000 * statistics.median([t for a in answers for t in a.ttft_s]),
           "drafter_share": (sum(a.drafter_ms for a in answers) / sum(a.graph_ms for a in answers)
                             if sum(a.graph_ms for a in answers) else 0.0),
           "capped_share": sum(a.capped for a in answers) / n_answers,
           "mean_answer_tokens": sum(len(t) for a in answers for t in a.tokens) / n_answers}
    widths = {w: sum(a.widths.get(w, 0) for a in answers) for w in sorted({w for a in answers for w in a.widths})}
    if len(widths) > 1:  # a width policy that varied: the share of rounds at each width
        row["width_share"] = {str(w): n / rounds for w, n in widths.items()}
    if answers and answers[0].same is not None:
        row["same_as_target_only"] = sum(a.same for a in answers) / n_answers
    return row


def machine(threads: int | None) -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": threads, "python": platform.python_version(),
            "packages": versions, "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def bench_chat(cfg: ChatBenchConfig, progress: bool = True) -> dict:
    chats = read_chats(cfg.chat, cfg.limit, cfg.per_category)
    runtimes, _ = open_exports(cfg.artifacts, cfg.backend, cfg.threads)
    labels = [rt.folder.name for rt in runtimes]
    if len(set(labels)) < len(labels):
        raise ValueError(f"two exports share a folder name ({labels}); rename one")
    tokenizers = [load_tokenizer(rt.folder) for rt in runtimes]
    if "rule" in cfg.widths:  # this device's costs, read before anything runs
        for rt in runtimes:
            rt.cost_curve()
    runs = [(f"{lab}/{m}", i, m) for i, (lab, rt) in enumerate(zip(labels, runtimes)) for m in modes(rt, cfg.widths)]
    native = _native_runs(cfg, labels, runtimes)
    log = (lambda msg: print(msg, file=sys.stderr)) if progress else (lambda msg: None)
    peers, peer_status = open_peers(cfg.peers, Path(runtimes[0].manifest["target"]["path"]), cfg.threads, log)
    eos = tuple(runtimes[0].eos)
    got: dict[str, list[Answers]] = {label: [] for label, _, _ in runs}
    got.update({p.label: [] for p in peers})
    got.update({label: [] for label, _, _ in native})
    bar = tqdm(total=len(chats), desc="bench --chat", unit="conversation", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)
    for chat in chats:
        prompts_by_export: list[list[list[int]]] = []  # per export: each turn's prompt ids (target-only)
        for i, (rt, tok) in enumerate(zip(runtimes, tokenizers)):
            baseline = None
            for label, j, mode in runs:
                if j != i:
                    continue
                stats = converse(rt, tok, chat["turns"], mode, cfg.max_new_tokens)
                answers = Answers.of_stats(chat["category"], stats, cfg.max_new_tokens)
                if baseline is None:  # target-only comes first: what every mode of this export must equal
                    baseline = answers
                    prompts_by_export.append(_turn_prompts(tok, chat["turns"], stats))
                answers.same = sum(a == b for a, b in zip(answers.tokens, baseline.tokens))
                got[label].append(answers)
        for peer in peers:  # the ids hyflash's target-only read at each turn (fp32 or int4 export alike)
            source = _matching_export(peer.label, runtimes)
            answers = Answers.of_peer(chat["category"], [peer.answer(p, cfg.max_new_tokens, eos)
                                                         for p in prompts_by_export[source]], cfg.max_new_tokens)
            reference = got[_peer_reference(peer.label, labels, runtimes)][-1]
            answers.same = sum(a == b for a, b in zip(answers.tokens, reference.tokens))
            got[peer.label].append(answers)
        for label, i, mode in native:  # target-only first: the reference of the drafted runs
            draft, _, width = mode.partition("@")
            answers = Answers.of_native(chat["category"], run_conversation(
                runtimes[i].folder, prompts_by_export[i], cfg.max_new_tokens, draft=draft, width=width or "full",
                threads=cfg.threads, runner=cfg.runner, kernels=chosen()))
            reference = got[_native_reference(labels[i], mode)][-1]
            answers.same = sum(a == b for a, b in zip(answers.tokens, reference.tokens))
            got[label].append(answers)
        bar.update()
    bar.close()
    return _report(cfg, chats, runs + native, labels, runtimes, peers, peer_status, got)


def _native_runs(cfg: ChatBenchConfig, labels: list[str], runtimes: list[Runtime]) -> list[tuple[str, int, str]]:
    """(label, export index, mode) of the runner's runs: each .pte export, target-only, then the drafter's and
    prompt-lookup's blocks under each width policy (model, model@4, model@rule, prompt-lookup, ...)."""
    if cfg.runner is None:
        return []
    pte = [i for i, rt in enumerate(runtimes) if (rt.folder / PTE_FILE).is_file()]
    if not pte:
        raise ValueError("--runner runs .pte programs and no export has them; export with --format pte or both")
    def drafted(rt: Runtime) -> list[str]:
        methods = (["model"] if rt.manifest["drafter"]["name"] != "random" else []) + ["prompt-lookup"]
        return [m if w == "full" else f"{m}@{w}" for m in methods for w in cfg.widths]

    return [(f"{labels[i]}/hyflash-run/{m}", i, m) for i in pte for m in ["none"] + drafted(runtimes[i])]


def _native_reference(export_label: str, mode: str) -> str:
    """What a runner's answers are compared with: its target-only ones with the Python runtime's target-only
    ones, its drafted ones with its own target-only ones."""
    return f"{export_label}/none" if mode == "none" else f"{export_label}/hyflash-run/none"


def _turn_prompts(tokenizer, turns: list[str], stats: list[Stats]) -> list[list[int]]:
    """The ids of each turn's prompt as a conversation with these answers renders them."""
    chat = Transcript(tokenizer)
    out = []
    for message, s in zip(turns, stats):
        prompt, text = chat.prompt(message)
        out.append(prompt)
        chat.record(message, prompt, text, s.tokens)
    return out


def _peer_reference(peer_label: str, labels: list[str], runtimes: list[Runtime]) -> str:
    """What a peer's answers are compared with: its n-gram run with its own plain decoding (the same model),
    its plain decoding with hyflash's target-only on the export of the same precision."""
    if peer_label.endswith("-ngram"):
        return peer_label.removesuffix("-ngram")
    return f"{labels[_matching_export(peer_label, runtimes)]}/none"


def _matching_export(peer_label: str, runtimes: list[Runtime]) -> int:
    """The export whose target-only prompts a peer reads: the first int4-target export for an int4 peer."""
    quantized = [i for i, rt in enumerate(runtimes) if rt.manifest["quantization"]["target"] != "none"]
    plain = [i for i, rt in enumerate(runtimes) if rt.manifest["quantization"]["target"] == "none"]
    if "int4" in peer_label:
        return (quantized or plain)[0]
    return (plain or quantized)[0]


def _report(cfg, chats, runs, labels, runtimes, peers, peer_status, got) -> dict:
    categories = sorted({c["category"] for c in chats})
    base_of = {label: f"{labels[j]}/hyflash-run/none" if "/hyflash-run/" in label else f"{labels[j]}/none"
               for label, j, _ in runs}
    for p in peers:  # a peer's speedup: against hyflash's target-only of the matching export
        base_of[p.label] = f"{labels[_matching_export(p.label, runtimes)]}/none"
    compared = {p.label: _peer_reference(p.label, labels, runtimes) for p in peers}
    if cfg.backend != "executorch":  # the runner's target-only against other programs (ONNX): information
        compared.update({label: f"{labels[j]}/none" for label, j, m in runs if "/hyflash-run/" in label and m == "none"})
    same_with = {label: _native_reference(labels[j], m) for label, j, m in runs if "/hyflash-run/" in label}
    results = []
    for label in got:
        answers, base = got[label], got[base_of[label]]
        results.append({**summarise(label, answers, base), "category": "all",
                        "same_compared_with": compared.get(label, same_with.get(label, base_of[label]))})
        for c in categories:
            pick = [i for i, a in enumerate(answers) if a.category == c]
            results.append({**summarise(label, [answers[i] for i in pick], [base[i] for i in pick]), "category": c})
    differ = [r for r in results if r["category"] == "all" and r["run"] not in compared
              and r.get("same_as_target_only", 1.0) < 1.0]
    return {"kind": "chat", "chat_file": str(cfg.chat), "conversations": len(chats), "categories": categories,
            "max_new_tokens": cfg.max_new_tokens, "backend": cfg.backend,
            "pte_kernels": runtimes[0].backend.kernels if cfg.runner is None else chosen(),
            "runner": str(cfg.runner) if cfg.runner else None, "exports": [str(a) for a in cfg.artifacts],
            "export_labels": labels, "peers": peer_status, "machine": machine(cfg.threads), "results": results,
            "exact": not differ,
            "per_conversation": {label: [{"category": a.category, "answer_tokens": [len(t) for t in a.tokens],
                                          "tokens_per_s": a.tokens_per_s, "rounds": a.rounds, "same": a.same}
                                         for a in answers] for label, answers in got.items()}}


def format_chat(report: dict) -> str:
    head = (f"{'run':34} {'category':12} {'tau':>5} {'tok/s':>7} {'speedup':>7} {'TTFT ms':>8} {'drafter':>7} "
            f"{'capped':>6} {'same':>5}")
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        same = f"{r['same_as_target_only']:.2f}" if "same_as_target_only" in r else "  -"
        lines.append(f"{r['run']:34} {r['category']:12} {r['tau']:5.2f} {r['decode_tokens_per_s']:7.1f} "
                     f"{r['speedup']:6.2f}x {r['ttft_ms']:8.1f} {r['drafter_share']:7.2f} {r['capped_share']:6.2f} "
                     f"{same:>5}")
    for name, status in report["peers"].items():
        if status != "ok":
            lines.append(f"peer {name} left out: {status}")
    m = report["machine"]
    lines.append(f"{report['conversations']} conversations, {report['max_new_tokens']} new tokens at most, "
                 f"{m['cpu']}, threads {m['threads']}; every drafted answer equal to its target-only answer: "
                 f"{'yes' if report['exact'] else 'NO'}")
    return "\n".join(lines)


def pooled(report: dict) -> dict[str, dict]:
    """run -> its pooled row (for scripts)."""
    return {r["run"]: r for r in report["results"] if r["category"] == "all"}



def markdown_chat(report: dict, categories: bool = True) -> str:
    """The report as Markdown: pooled rows, then (categories) tau and speedup by category."""
    rows = [r for r in report["results"] if r["category"] == "all"]
    lines = ["| run | tau | decode tok/s | speedup | TTFT ms | drafter share | capped | same |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        same = f"{r['same_as_target_only']:.2f}" if "same_as_target_only" in r else "-"
        lines.append(f"| {r['run']} | {r['tau']:.2f} | {r['decode_tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['ttft_ms']:.0f} | {r['drafter_share']:.2f} | {r['capped_share']:.2f} | {same} |")
    if categories:
        cats = report["categories"]
        lines += ["", "| run | " + " | ".join(f"{c} tau / speedup" for c in cats) + " |",
                  "|---|" + "---:|" * len(cats)]
        by = {(r["run"], r["category"]): r for r in report["results"]}
        for r in rows:
            cells = [f"{by[r['run'], c]['tau']:.2f} / {by[r['run'], c]['speedup']:.2f}x" for c in cats]
            lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
