"""`hyflash bench`: acceptance and speed by context length, every drafter against target-only.

Each ARTIFACTS folder is one export of the same target with a different drafter. For every
prompt, the runs are interleaved in one process (target-only, drafter A, drafter B, …,
prompt-lookup) so that machine drift hits all of them alike; speedups are per-prompt ratios,
then the median. Every greedy speculative output is also checked against target-only output.
Sampled (`--temperature T > 0`): every run of a prompt uses that prompt's seed (seed + prompt
index); the loop is lossless, so outputs differ from target-only only by the random stream, and
the tables hold tau and speed of sampled decoding.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from hyflash.models.hybrid import reliability
from hyflash.models.stdlib import is_heldout, stdlib_files, stdlib_root
from hyflash.runtime_py.backends import BACKENDS
from hyflash.runtime_py.loop import DRAFT_COST, GenerationConfig, Runtime, Stats
from hyflash.runtime_py.manifest import DRAFTER_GRAPHS
from hyflash.runtime_py.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    artifacts: tuple[Path, ...]
    buckets: tuple[int, ...] = (256, 512, 1024, 2048)  # edges: [256,512), [512,1K), [1K,2K)
    prompts_from: Path | None = None  # a file, or a folder of .py files; default: the held-out split
    prompts_per_bucket: int = 4
    max_new_tokens: int = 64
    threads: int | None = None
    seed: int = 0  # prompt lengths; and, sampled, prompt i decodes with seed + i
    backend: str = "onnxruntime"  # or "executorch": every run (target-only included) on that backend
    sampling: Sampling = Sampling()  # greedy by default
    draft_cost: float = DRAFT_COST  # hybrid rows: draft_read's share of a round (GenerationConfig.draft_cost)

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not self.artifacts:
            raise ValueError("give at least one export folder")
        if not self.draft_cost >= 0:
            raise ValueError(f"--draft-cost must be >= 0 (draft_read's share of a round's time), got {self.draft_cost}")
        if len(self.buckets) < 2 or list(self.buckets) != sorted(set(self.buckets)) or self.buckets[0] < 1:
            raise ValueError(f"--buckets must be two or more increasing positive edges, got {list(self.buckets)}")
        if self.prompts_per_bucket < 1 or self.max_new_tokens < 1:
            raise ValueError("--prompts-per-bucket and --max-new-tokens must be positive")


def source_texts(prompts_from: Path | None) -> list[str]:
    if prompts_from is None:
        root = stdlib_root()
        return [(root / rel).read_text(encoding="utf-8", errors="replace")
                for rel in stdlib_files(root) if is_heldout(rel)]
    path = Path(prompts_from)
    if path.is_dir():
        files = sorted(path.rglob("*.py"))
        if not files:
            raise ValueError(f"{path}: no .py files to take prompts from")
        return [f.read_text(encoding="utf-8", errors="replace") for f in files]
    if path.is_file():
        return [path.read_text(encoding="utf-8", errors="replace")]
    raise FileNotFoundError(f"{path}: no such file or folder")


def make_prompts(tokenizer, texts: list[str], cfg: BenchConfig, limit: int) -> dict[tuple[int, int], list[list[int]]]:
    """bucket -> prompts: the first L tokens of the texts joined in a fixed order, L drawn in the bucket."""
    docs = [ids for ids in (tokenizer.encode(t).ids for t in texts) if ids]  # a fixed order
    if not docs:
        raise ValueError("the prompt texts are empty")
    rng = np.random.default_rng(cfg.seed)
    out = {}
    for lo, hi in zip(cfg.buckets, cfg.buckets[1:]):
        hi = min(hi, limit - cfg.max_new_tokens)
        if hi <= lo:
            continue
        prompts = []
        for i in range(cfg.prompts_per_bucket):
            length = int(rng.integers(lo, hi))
            ids, j = [], i * 7 + lo  # the starting text rotates from prompt to prompt
            while len(ids) < length:
                ids.extend(docs[j % len(docs)])
                j += 1
            prompts.append(ids[:length])
        out[(lo, hi)] = prompts
    return out


class OptimumBaseline:
    """Target-only decoding through optimum-onnx's `ORTModelForCausalLM` on the same target folder:
    an independent baseline (its own ONNX export and KV handling), used where optimum-onnx is installed."""

    label = "optimum-ort"

    def __init__(self, target_dir: Path, threads: int | None):
        import onnxruntime as ort
        from optimum.onnxruntime import ORTModelForCausalLM

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.model = ORTModelForCausalLM.from_pretrained(str(target_dir), export=True, session_options=opts)

    @classmethod
    def maybe(cls, target_dir: Path, threads: int | None) -> tuple["OptimumBaseline | None", str]:
        """(baseline, status): status is "ok", "not installed", or why optimum could not run this target."""
        try:
            import optimum.onnxruntime  # noqa: F401
        except ImportError:
            return None, "not installed"
        try:
            baseline = cls(target_dir, threads)
            baseline.tokens_per_s([1, 2, 3], 2)  # its own export may not handle every geometry
        except Exception as e:  # an independent library on a foreign folder: report, never abort the bench
            return None, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return baseline, "ok"

    def tokens_per_s(self, prompt: list[int], max_new: int) -> tuple[float, list[int]]:
        """Decode throughput as `Stats.tokens_per_s` counts it: the time of generating max_new tokens
        minus that of generating one (prefill and the first token), over max_new - 1 tokens."""
        import time

        import torch

        ids = torch.tensor([prompt])
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
        t = time.perf_counter()
        self.model.generate(ids, max_new_tokens=1, **kw)
        first = time.perf_counter() - t
        t = time.perf_counter()
        out = self.model.generate(ids, max_new_tokens=max_new, min_new_tokens=max_new, **kw)
        total = time.perf_counter() - t
        return (max_new - 1) / max(total - first, 1e-9), out[0, len(prompt):].tolist()


GREEDY = Sampling()


def run_once(runtime: Runtime, prompt: list[int], draft: str, max_new: int, sampling: Sampling = GREEDY,
             seed: int = 0, draft_cost: float = DRAFT_COST) -> Stats:
    """One generation of `max_new` tokens (EOS ignored), drafted as `draft`: its stats."""
    stats = Stats()
    gen = GenerationConfig(max_new_tokens=max_new, draft=draft, ignore_eos=True, sampling=sampling, seed=seed,
                           draft_cost=draft_cost)
    for _ in runtime.generate(prompt, gen, stats):
        pass
    return stats


def bench(cfg: BenchConfig, progress: bool = True) -> dict:
    runtimes, labels = open_exports(cfg.artifacts, cfg.backend, cfg.threads)
    first = runtimes[0]
    prompts = make_prompts(export_tokenizer(first), source_texts(cfg.prompts_from), cfg, first.usable_context)
    if not prompts:
        raise ValueError(f"no bucket fits the usable context ({first.usable_context} tokens) with "
                         f"--max-new-tokens {cfg.max_new_tokens}")
    runs = [("target-only", first, "none")] + [(lab, rt, "model") for lab, rt in zip(labels, runtimes)]
    runs.append(("prompt-lookup", first, "prompt-lookup"))
    calibrated = [(lab, rt) for lab, rt in zip(labels, runtimes) if rt.hybrid is not None and rt.confidence() is not None]
    runs += [("hybrid" if len(calibrated) == 1 else f"hybrid-{lab}", rt, "hybrid") for lab, rt in calibrated]
    if cfg.backend != "onnxruntime":
        optimum, optimum_status = None, f"an onnxruntime baseline; this bench runs on {cfg.backend}"
    elif not cfg.sampling.greedy:
        optimum, optimum_status = None, "a greedy baseline; this bench samples"
    else:
        optimum, optimum_status = OptimumBaseline.maybe(Path(first.manifest["target"]["path"]), cfg.threads)
    if progress and optimum_status != "ok":
        print(f"bench: the optimum-ort baseline is left out ({optimum_status})", file=sys.stderr)
    total = sum(len(p) for p in prompts.values()) * (len(runs) + (optimum is not None))
    bar = tqdm(total=total, desc="bench", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    results, graph_ms = [], {}
    for (lo, hi), bucket_prompts in prompts.items():
        per = {label: [] for label, _, _ in runs}
        independent = []  # (tokens/s, same tokens as target-only) of the optimum baseline
        for i, prompt in enumerate(bucket_prompts):
            baseline = None
            for label, rt, draft in runs:  # interleaved: every prompt runs all, in one order
                stats = run_once(rt, prompt, draft, cfg.max_new_tokens, cfg.sampling, cfg.seed + i, cfg.draft_cost)
                if baseline is None:
                    baseline = stats
                elif cfg.sampling.greedy and stats.tokens != baseline.tokens:
                    raise AssertionError(f"{label}: speculative output differs from target-only output "
                                         f"(bucket {lo}-{hi}); this is a bug")
                per[label].append(stats)
                bar.update()
            if optimum is not None:
                tps, tokens = optimum.tokens_per_s(prompt, cfg.max_new_tokens)
                independent.append((tps, tokens == baseline.tokens))
                bar.update()
        base_tps = [s.tokens_per_s for s in per["target-only"]]
        for label, _, draft in runs:
            results.append(_row(label, draft, per[label], base_tps, f"{lo}-{hi}"))
            if "graph_ms_per_round" in results[-1]:
                graph_ms[label] = results[-1]["graph_ms_per_round"]
        if independent:
            results.append({"drafter": OptimumBaseline.label, "bucket": f"{lo}-{hi}", "prompts": len(independent),
                            "tokens_per_s": statistics.median(t for t, _ in independent),
                            "speedup": statistics.median(t / b for (t, _), b in zip(independent, base_tps)),
                            "acceptance_length": 1.0,
                            "same_tokens_as_target_only": sum(same for _, same in independent) / len(independent)})
    bar.close()
    return {"results": results, "graph_ms": graph_ms,
            "target_kv_bytes": first.context_bytes(0)["target_kv_allocated"],
            "max_context": first.max_context, "max_new_tokens": cfg.max_new_tokens, "optimum_ort": optimum_status,
            "backend": cfg.backend, "pte_kernels": first.backend.kernels,
            "temperature": cfg.sampling.temperature, "top_p": cfg.sampling.top_p,
            "seed": cfg.seed, "draft_cost": cfg.draft_cost}


def _row(label: str, draft: str, st: list[Stats], base_tps: list[float], bucket: str) -> dict:
    """One drafting mode's row of a bucket: medians over its prompts, and what its mode adds."""
    row = {"drafter": label, "bucket": bucket, "prompts": len(st),
           "tokens_per_s": statistics.median(s.tokens_per_s for s in st),
           "speedup": statistics.median(s.tokens_per_s / b for s, b in zip(st, base_tps)),
           "acceptance_length": float(np.mean([s.acceptance_length for s in st])) if draft != "none" else 1.0}
    if draft != "none":
        rounds = sum(s.rounds for s in st)
        slots = np.sum([s.accepted_per_slot for s in st], axis=0)
        row["accepted_per_slot"] = [float(x) / rounds for x in slots]
        ms = _graph_ms_per_round(st)
        row["graph_ms_per_round"] = ms
        drafting = sum(v for g, v in ms.items() if g in DRAFTER_GRAPHS)
        row["drafter_share"] = drafting / sum(ms.values()) if ms else 0.0
    if draft == "model":
        row["drafter_context_bytes"] = st[-1].drafter_context_bytes
        expected = [e for s in st for e in s.expected_accepted]
        if expected:  # the confidence head on these held-out rounds
            row["calibration"] = reliability(expected, [k for s in st for k in s.realised_accepted])
    if draft == "hybrid":
        row["lookup_share"] = sum(s.lookup_rounds for s in st) / max(1, sum(s.rounds for s in st))
        row["skipped_read_share"] = sum(s.skipped_reads for s in st) / max(1, sum(s.rounds for s in st))
    return row


def open_exports(artifacts, backend: str, threads: int | None) -> tuple[list[Runtime], list[str]]:
    """Runtimes of exports of one target (same target files, same max_context), and their labels: the
    drafter's name and quantization, or the folder names where two would share one (an ablation)."""
    runtimes = [Runtime(folder, backend, threads) for folder in artifacts]
    first = runtimes[0]
    for rt in runtimes[1:]:
        if rt.manifest["target"]["files"] != first.manifest["target"]["files"]:
            raise ValueError(f"{rt.folder}: exported from a different target than {first.folder}; "
                             "compare drafters of one target")
        if rt.max_context != first.max_context:
            raise ValueError(f"{rt.folder}: max_context {rt.max_context} differs from {first.max_context}")
    labels = [_label(rt.manifest) for rt in runtimes]
    if len(set(labels)) < len(labels):
        labels = [rt.folder.name for rt in runtimes]
    if len(set(labels)) < len(labels):
        raise ValueError(f"two exports have the same drafter and folder name ({labels}); rename a folder")
    return runtimes, labels


def export_tokenizer(runtime: Runtime):
    """The export's tokenizer.json (prompts are built from text)."""
    path = runtime.folder / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: building prompts from text needs the export's tokenizer")
    return Tokenizer.from_file(str(path))


def _label(manifest: dict) -> str:
    """The manifest's drafter name, with the quantization when there is one: hyflash, hyflash-int4."""
    q, label = manifest["quantization"], manifest["drafter"]["name"]
    if q["drafter"] != "none":
        label += f"-{q['drafter']}"
    if q["target"] != "none":
        label += f"-target-{q['target']}"
    if q.get("embeddings", "none") != "none":
        label += f"-embeddings-{q['embeddings']}"
    return label


def _graph_ms_per_round(stats: list[Stats]) -> dict[str, float]:
    """Decode-phase milliseconds of each graph per round (prefill and its commits left out)."""
    rounds = sum(s.rounds for s in stats)
    graphs = {g for s in stats for g in s.graph_ms if not g.startswith("prefill/")}
    return {g: sum(s.graph_ms.get(g, 0.0) for s in stats) / rounds for g in sorted(graphs)} if rounds else {}


def format_results(report: dict) -> str:
    lines = [f"{'drafter':<14} {'bucket':<10} {'tau':>5} {'tok/s':>8} {'speedup':>8} {'draft share':>12}"]
    for r in report["results"]:
        share = f"{r['drafter_share']:.0%}" if "drafter_share" in r else "-"
        lines.append(f"{r['drafter']:<14} {r['bucket']:<10} {r['acceptance_length']:>5.2f} {r['tokens_per_s']:>8.1f} "
                     f"{r['speedup']:>7.2f}x {share:>12}")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    buckets = list(dict.fromkeys(r["bucket"] for r in rows))
    drafters = [d for d in dict.fromkeys(r["drafter"] for r in rows) if d != "target-only"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for d in drafters:
        tau = [next(r["acceptance_length"] for r in rows if r["drafter"] == d and r["bucket"] == b) for b in buckets]
        sp = [next(r["speedup"] for r in rows if r["drafter"] == d and r["bucket"] == b) for b in buckets]
        if d != OptimumBaseline.label:  # a target-only baseline: tau is 1 by definition
            ax1.plot(buckets, tau, marker="o", label=d)
        ax2.plot(buckets, sp, marker="o", label=d)
    ax2.legend()
    ax1.set(title="acceptance length (tokens per round)", xlabel="prompt length bucket", ylabel="tau")
    ax2.axhline(1.0, color="gray", lw=0.8)
    ax2.set(title="speedup over target-only (median)", xlabel="prompt length bucket", ylabel="x")
    ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown_tables(report: dict) -> str:
    """Two Markdown tables for docs: tau by drafter and bucket, and median speedup (drafter share)."""
    rows = report["results"]
    buckets = list(dict.fromkeys(r["bucket"] for r in rows))
    drafters = [d for d in dict.fromkeys(r["drafter"] for r in rows) if d != "target-only"]
    cell = {(r["drafter"], r["bucket"]): r for r in rows}
    head = "| drafter | " + " | ".join(buckets) + " |\n|---" + "|---" * len(buckets) + "|"
    tau = [head] + [f"| {d} | " + " | ".join(f"{cell[d, b]['acceptance_length']:.2f}" for b in buckets) + " |"
                    for d in drafters if d != OptimumBaseline.label]
    speed = [head] + [f"| {d} | " + " | ".join(
        f"{cell[d, b]['speedup']:.2f}x ({cell[d, b]['drafter_share']:.0%})" if cell[d, b].get("drafter_share")
        else f"{cell[d, b]['speedup']:.2f}x" for b in buckets) + " |" for d in drafters]
    base = " | ".join(f"{cell['target-only', b]['tokens_per_s']:.1f}" for b in buckets)
    speed.append(f"| target-only tokens/s | {base} |")
    return "\n".join(tau) + "\n\n" + "\n".join(speed)
