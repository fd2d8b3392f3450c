"""`hyflash profile`: what each graph costs at a given committed length, side by side in one run.

For every committed length c: a prompt of c tokens is prefilled (timed: time to first token and
prefill tokens/s), then each graph is called repeatedly at position c (a warm-up call, then
back-to-back calls) and the median taken:
`target_decode` (1 row), every verify width (`target_verify` 8 rows, `target_verify_{w}` w rows),
`target_prefill` (one chunk), and the drafter's three graphs (`draft_read`, `state_commit` and
`window_shift` with a full commit). A single-token step's cost, the width rule's width 1 and the
denominator of verify/decode, is the export's step graph's (`target_decode`, or the two-row verify graph of
an int8-compute or fp16 target, `Contract.step_graph`). `cost_curve` turns a report into the width rule's costs
(`costs.json`, which `hyflash profile --write-costs` writes beside the export).
Calls at one position overwrite the same cache rows, which is what a rejected round does.
Then target-only decoding (tokens/s) from the same prompt, beside optimum-ort's where installed.

Beside the times, each target graph's arithmetic (`target_macs`: the weights' multiply-adds per row
plus attention over the committed keys) and the rate it ran at (GFLOP/s): a graph far below the
machine's rate is held up by per-call overhead or by reading its weights, one near it by arithmetic.
Verify does 8x decode's arithmetic on the same weights, so where decode's rate is low and verify's
high, verify/decode is the arithmetic showing.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from hyflash.models.config import TargetConfig
from hyflash.models.widths import CostCurve, Costs
from hyflash.runtime_py.bench import OptimumBaseline, export_tokenizer, source_texts
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
from hyflash.runtime_py.manifest import DRAFTER_GRAPHS, VERIFY_ROWS, verify_graph


def profile_prompt(runtime: Runtime, length: int, seed: int = 0) -> list[int]:
    """`length` tokens of held-out text where the export has a tokenizer, else seeded random ids.
    Every context takes a prefix of the same text: ask once for the longest."""
    if (runtime.folder / "tokenizer.json").is_file():
        tok = export_tokenizer(runtime)
        ids: list[int] = []
        for text in source_texts(None):
            ids.extend(tok.encode(text).ids)
            if len(ids) >= length:
                return ids[:length]
    return np.random.default_rng(seed).integers(0, runtime.vocab, length).tolist()


def target_macs(cfg: TargetConfig, rows: int, committed: int) -> int:
    """Multiply-adds of one target call on `rows` new rows after `committed` rows: every layer's
    projections and gated MLP and the LM head once a row, and attention (q.k and p.v for every head)
    over the committed keys plus the rows up to its own (causal). Norms, RoPE and softmax left out."""
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    weights = cfg.num_layers * (h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size) + h * cfg.vocab_size
    keys = rows * committed + rows * (rows + 1) // 2
    return rows * weights + cfg.num_layers * 2 * q * keys


def target_gflops(cfg: TargetConfig, committed: int, ms: dict[str, float]) -> dict[str, float]:
    """The rate (GFLOP/s, 2 per multiply-add) target_decode and target_verify ran at."""
    rows = {"target_decode": 1, "target_verify": VERIFY_ROWS}
    return {g: 2 * target_macs(cfg, n, committed) / (ms[g] * 1e6) for g, n in rows.items()}


def prefill_time(runtime: Runtime, prompt: list[int]) -> dict:
    """Time to first token (speculative prefill: target chunks and drafter commits) and tokens/s."""
    t = time.perf_counter()
    int(runtime.prefill(prompt, True, Stats()).argmax())
    s = time.perf_counter() - t
    return {"ttft_ms": s * 1e3, "prefill_tokens_per_s": len(prompt) / s}


def loop_calls(runtime: Runtime, c: int) -> dict[str, Callable[[], object]]:
    """Each graph's call as the loop makes it at committed length c (after `prefill_time`), by graph name.
    Calls at one position overwrite the same rows and never commit, so the state stays put."""
    tok, i = 1, runtime.ctx.index
    shift = runtime.calls["window_shift", i]
    shift.inputs["n_valid"][0] = VERIFY_ROWS
    shift.inputs["positions"][:] = np.arange(c, c + VERIFY_ROWS)
    calls = {verify_graph(w): (lambda w=w: runtime.run_target(verify_graph(w), [tok] * w, c))
             for w in (1, *runtime.contract.verify_widths)}
    if c + runtime.chunk <= runtime.max_context:
        calls["target_prefill"] = lambda: runtime.run_target("target_prefill", [tok] * runtime.chunk, c)
    calls["draft_read"] = lambda: runtime.draft(tok, c, found=(np.full(runtime.block, tok), 0))
    if runtime.has_memory:
        calls["state_commit"] = runtime.calls["state_commit", i].run
    calls["window_shift"] = shift.run
    return calls


def back_to_back(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Milliseconds of `repeats` calls of each function: per function a warm-up call, then its calls back to
    back, function after function."""
    times = {}
    for name, fn in calls.items():
        fn()
        times[name] = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1e3)
    return times


def call_times(runtime: Runtime, c: int, repeats: int) -> dict[str, list[float]]:
    """Milliseconds of each call as the loop makes it, at committed length c (after `prefill_time`), timed
    `back_to_back` (the way research/results/profile_baseline.json was measured; timing the graphs in
    interleaved rounds instead gave no steadier ratios: research/scripts/profile_rounds_ab.py)."""
    return back_to_back(loop_calls(runtime, c), repeats)


def graph_times(runtime: Runtime, c: int, repeats: int) -> dict[str, float]:
    """Median ms of each graph called at committed length c (the cache and drafter hold c rows)."""
    return {g: statistics.median(t) for g, t in call_times(runtime, c, repeats).items()}


def target_only_tokens_per_s(runtime: Runtime, prompt: list[int], new_tokens: int) -> tuple[float, list[int]]:
    stats = Stats()
    for _ in runtime.generate(prompt, GenerationConfig(max_new_tokens=new_tokens, draft="none", ignore_eos=True),
                              stats):
        pass
    return stats.tokens_per_s, stats.tokens


def profile(folder: Path, backend: str = "onnxruntime", contexts: tuple[int, ...] = (256, 1024, 2048),
            threads: int | None = None, repeats: int = 30, new_tokens: int = 64, optimum: bool = True,
            progress: bool = True) -> dict:
    runtime = Runtime(folder, backend, threads)
    too_long = [c for c in contexts if c + max(new_tokens, runtime.chunk) > runtime.usable_context]
    if too_long:
        raise ValueError(f"--contexts {too_long[0]} leaves no room for {new_tokens} new tokens in this export's "
                         f"usable context ({runtime.usable_context}); use smaller contexts")
    baseline, status = None, "not asked"
    if optimum and backend == "onnxruntime":
        baseline, status = OptimumBaseline.maybe(Path(runtime.manifest["target"]["path"]), threads)
    rows = []
    cfg = TargetConfig.from_hf(runtime.manifest["target"]["config"])
    text = profile_prompt(runtime, max(contexts))
    for c in tqdm(contexts, desc="profile", disable=not progress, file=sys.stderr, dynamic_ncols=True):
        prompt = text[:c]
        row = {"context": c, **prefill_time(runtime, prompt)}
        ms = graph_times(runtime, c, repeats)
        row["graph_ms"] = ms
        step = row["step_graph"] = runtime.contract.step_graph  # what a single-token step runs (target_decode)
        row["verify_over_decode"] = ms["target_verify"] / ms[step]
        row["target_gflops"] = target_gflops(cfg, c, ms)
        row["drafter_ms_per_round"] = sum(ms[g] for g in DRAFTER_GRAPHS if g in ms)
        # hybrid drafting's --draft-cost for this export: draft_read against the rest of a round
        row["draft_read_share"] = ms["draft_read"] / (ms["target_verify"] + row["drafter_ms_per_round"] - ms["draft_read"])
        row["target_only_tokens_per_s"], tokens = target_only_tokens_per_s(runtime, prompt, new_tokens)
        if baseline is not None:
            tps, theirs = baseline.tokens_per_s(prompt, new_tokens)
            row["optimum_ort_tokens_per_s"] = tps
            row["target_only_over_optimum_ort"] = row["target_only_tokens_per_s"] / tps
            row["optimum_ort_same_tokens"] = theirs == tokens
        row["verify_over_decode_by_width"] = {str(w): ms[verify_graph(w)] / ms[step]
                                              for w in runtime.contract.verify_widths}
        rows.append(row)
    return {"export": str(folder), "backend": backend, "pte_kernels": runtime.backend.kernels,
            "threads": threads, "repeats": repeats,
            "new_tokens": new_tokens, "optimum_ort": status, "format_version": runtime.manifest["format_version"],
            "rows": rows}


def cost_curve(report: dict) -> CostCurve:
    """The width rule's costs from a profile: each verify width's ms, draft_read's, and a commit's
    (state_commit + window_shift), at each committed length profiled."""
    points = []
    for r in report["rows"]:
        ms = r["graph_ms"]
        widths = {1: ms[r.get("step_graph", "target_decode")],
                  **{int(w): ms[verify_graph(int(w))] for w in r["verify_over_decode_by_width"]}}
        points.append(Costs(widths, ms["draft_read"], ms.get("state_commit", 0.0) + ms["window_shift"]))
    return CostCurve(tuple(r["context"] for r in report["rows"]), tuple(points))


def format_profile(report: dict) -> str:
    graphs = sorted({g for r in report["rows"] for g in r["graph_ms"]})
    head = f"{'context':>7} " + " ".join(f"{g:>15}" for g in graphs)
    head += (f" {'verify/decode':>13} {'GFLOP/s d/v':>11} {'draft/round':>11} {'prefill tok/s':>13} {'TTFT ms':>8}"
             f" {'tok/s':>7}")
    lines = [f"{report['backend']}, ms per call (median of {report['repeats']})", head]
    for r in report["rows"]:
        line = f"{r['context']:>7} " + " ".join(f"{r['graph_ms'].get(g, float('nan')):>15.2f}" for g in graphs)
        rate = r["target_gflops"]
        line += (f" {r['verify_over_decode']:>13.2f} {rate['target_decode']:>5.0f}/{rate['target_verify']:<5.0f}"
                 f" {r['drafter_ms_per_round']:>11.2f} "
                 f"{r['prefill_tokens_per_s']:>13.0f} {r['ttft_ms']:>8.1f} {r['target_only_tokens_per_s']:>7.1f}")
        if "optimum_ort_tokens_per_s" in r:
            line += f"  (optimum-ort {r['optimum_ort_tokens_per_s']:.1f} tok/s)"
        lines.append(line)
    return "\n".join(lines)
