"""`hyflash validate`: every graph of every format against eager PyTorch, as one loop on two backends.

A `Runtime` on the exported graphs and a `Runtime` on the eager backend (the models' own run-time
functions, rebuilt from the export's drafter weights and the target folder the manifest records,
its checksums checked) are driven through the same calls, and every output of every call is
compared, by name. Names, shapes and dtypes are checked first; any failure is an error.

- drafter: commits of 8, 3, 0, 5, 1 rows with NaN in the rows past `n_valid` (never read), each
  followed by the state and window it leaves; drafts from the states reached.
- target: prefill chunks (full and padded), verify blocks after rejections (stale rows behind the
  block), decode steps, up to the last rows of the cache; logits and features of every row, and
  (where the cache is on the host) every cache row the graphs wrote.

Quantized graphs are judged by agreement with fp32, on text: sequences the target writes itself,
run through the graphs the way the runtime runs them (closed loop: the graphs carry their own
cache, window and state, so drift counts). Random features, fine for parity, give near-tied
logits whose argmax any rounding flips: agreement there says nothing about the drafts a user gets.

An export whose single-token steps run a several-row graph (an int8-compute or fp16 target) is exact only where
each verify row is bit for bit the step at its position: that is checked too, on this machine's kernels.

A quantized export is also run across runtimes (greedy, speculative and target-only): the Python runtime's
ExecuTorch programs against `hyflash-run`, which run the same kernels and must agree on every token, and
onnxruntime against ExecuTorch, reported only (their int4 arithmetic differs by design).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from hyflash.export.graphs import GraphSpec, cache_spec, graph_specs
from hyflash.models.lookup import MAX_NGRAM, lookup
from hyflash.models.target import generate
from hyflash.runtime_py.loop import GenerationConfig, Runtime
from hyflash.runtime_py.manifest import (
    PTE_VERIFY_ATTENTION,
    VERIFY_ROWS,
    ArtifactError,
    load_manifest,
    pte_verify_attention,
    verify_graph,
)
from hyflash.runtime_py.native import run_native, runner_path


@dataclasses.dataclass
class Check:
    graph: str
    output: str
    backend: str
    max_diff: float  # max|got - expected|; for kind "agreement": the agreement rate with fp32 eager
    tolerance: float  # the bar: atol + rtol * scale; for "agreement": the minimum rate; "info": nan
    ok: bool
    kind: str = "parity"  # "parity" | "agreement" (quantized graphs) | "info"
    count: int = 0  # for "agreement": how many tokens were compared
    scale: float = 0.0  # max|expected|: what the relative part of the bar is relative to


class Comparer:
    """Collects one Check per compared output; the outputs of graphs judged by agreement instead (`by_agreement`:
    every graph of a quantized model, an fp16 draft_read) are reported, not judged."""

    def __init__(self, specs: dict[str, GraphSpec], backend: str, by_agreement: frozenset = frozenset(),
                 atol: float | None = None):
        """atol: one absolute bar for every float output instead of the specs' (`--atol`)."""
        self.specs, self.backend, self.by_agreement, self.atol = specs, backend, by_agreement, atol
        self.checks: list[Check] = []

    def outputs(self, graph: str, got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
        spec = self.specs[graph]
        for out in spec.outputs:
            if out.name in got:
                self.one(graph, out.name, got[out.name], expected[out.name], out.shape, out.dtype)

    def one(self, graph, name, got, expected, shape, dtype) -> None:
        spec = self.specs[graph]
        if tuple(got.shape) != tuple(shape) or str(got.dtype) != dtype:
            self.checks.append(Check(graph, name, self.backend, float("inf"), 0.0, False))
            return
        diff = float(np.abs(got.astype(np.float64) - expected.astype(np.float64)).max()) if got.size else 0.0
        if not np.isfinite(got).all():
            diff = float("inf")
        scale = float(np.abs(expected).max()) if expected.size else 0.0
        if graph in self.by_agreement:
            if dtype != "int64":
                self.checks.append(Check(graph, name, self.backend, diff, float("nan"), True, "info", scale=scale))
            return
        tol = 0.0 if dtype == "int64" else (self.atol if self.atol is not None else spec.tolerance(name).bound(scale))
        self.checks.append(Check(graph, name, self.backend, diff, tol, bool(diff <= tol), scale=scale))


def check_declarations(folder: Path, manifest: dict, specs: dict[str, GraphSpec], target) -> None:
    """The export must declare exactly what the code does: graph names, then I/O, then the cache."""
    for name, spec in specs.items():
        declared = manifest["graphs"].get(name)
        if declared is None:
            raise ArtifactError(f"{folder}: graph {name!r} is missing from the manifest")
        for kind in ("inputs", "outputs"):
            if declared[kind] != [t.to_json() for t in getattr(spec, kind)]:
                raise ArtifactError(f"{folder}: graph {name!r} {kind} in the manifest differ from the model's")
    if set(manifest["graphs"]) != set(specs):
        raise ArtifactError(f"{folder}: manifest has graphs {sorted(manifest['graphs'])}, expected {sorted(specs)}")
    cache = manifest["cache"]
    kernels = {v: k for k, v in PTE_VERIFY_ATTENTION.items()}[pte_verify_attention(cache)]
    expected = cache_spec(target, manifest["max_context"], cache["dtype"], kernels)
    if "verify_attention" not in cache["pte"]:  # written before the field: its blocks attend row by row
        del expected["pte"]["verify_attention"]
    if cache != expected:
        raise ArtifactError(f"{folder}: the manifest's cache entry differs from the model's")


def _drafter_outputs(rt: Runtime) -> dict[str, np.ndarray]:
    """The state the last commit left, under its graphs' output names (win_k_out, ssm_state_out, ...)."""
    return {f"{name}_out": buf for name, buf in rt.ctx.current.items()}


def drafter_parity(rt: Runtime, eager: Runtime, cmp: Comparer, seed: int) -> None:
    rng = np.random.default_rng(seed)
    feat = rt.contract.io("window_shift", "features")["shape"][1]
    for r in (rt, eager):
        r.ctx.reset()
    pos = 0
    for step, n in enumerate((8, 3, 8, 0, 8, 5, 8, 1, 8)):
        rows = rng.standard_normal((VERIFY_ROWS, feat)).astype(np.float32)
        for r in (rt, eager):
            # rows >= n must never count (state_commit is bound to this same features array)
            r.calls["window_shift", r.ctx.index].inputs["features"][:] = np.nan
            r.fold(rows, pos, n)
        got, expected = _drafter_outputs(rt), _drafter_outputs(eager)
        cmp.outputs("window_shift", got, expected)
        if "state_commit" in cmp.specs:
            cmp.outputs("state_commit", got, expected)
        pos += n
        if step % 2 == 0:
            anchor = int(rng.integers(rt.vocab))
            # a lookup block, for a drafter that reads one: at times the anchor repeated (no match, n = 0)
            match = int(rng.integers(MAX_NGRAM + 1))
            found = (rng.integers(rt.vocab, size=rt.block) if match else np.full(rt.block, anchor), match)
            outs = [r.calls["draft_read", r.ctx.index].outputs for r in (rt, eager)]
            for r in (rt, eager):
                r.draft(anchor, pos, found=found)
            cmp.outputs("draft_read", *outs)


def target_calls(max_context: int, chunk: int, widths: tuple[int, ...] = (VERIFY_ROWS,)) -> list[tuple[str, int, int]]:
    """(graph, position, tokens) for target parity: full and padded prefill chunks, verify blocks of every
    width that leave stale rows behind (a rejection), decode steps, and blocks at the end of the cache."""
    # a padded chunk, then a full one, both from row 0 (the export keeps chunk <= max_context - 8)
    calls, pos = [("target_prefill", 0, max(1, chunk // 2)), ("target_prefill", 0, chunk)], chunk
    end = max_context - VERIFY_ROWS
    if pos + 4 + VERIFY_ROWS <= max_context:
        calls += [("target_verify", pos, VERIFY_ROWS), ("target_decode", pos + 3, 1),
                  ("target_verify", pos + 4, VERIFY_ROWS)]
        pos += 4 + 2  # two of the last block's rows kept
    late = []
    for w in widths:  # each narrower verify: its last row left stale (at the end where none fits here)
        if w != VERIFY_ROWS and pos + w <= end:
            calls.append((verify_graph(w), pos, w))
            pos += w - 1
        elif w != VERIFY_ROWS:
            late.append(w)
    while pos + chunk <= end:
        calls.append(("target_prefill", pos, chunk))
        pos += chunk
    while pos < end:
        calls.append(("target_verify", pos, min(VERIFY_ROWS, end - pos)))
        pos += min(VERIFY_ROWS, end - pos)
    calls += [(verify_graph(w), end, w) for w in late]
    return calls + [("target_verify", end, VERIFY_ROWS), ("target_decode", max_context - 1, 1)]


def target_parity(rt: Runtime, eager: Runtime, cmp: Comparer, seed: int) -> None:
    rng = np.random.default_rng(seed + 1)
    for r in (rt, eager):
        r.cache.reset()
    calls = target_calls(rt.max_context, rt.chunk, rt.contract.verify_widths)
    if {g for g, _, _ in calls} != set(rt.contract.target_graphs):
        raise AssertionError(f"target parity would leave a graph unchecked: {calls}")
    for graph, pos, n in calls:
        tokens = rng.integers(0, rt.vocab, n).tolist()
        outs = []
        for r in (rt, eager):
            r.run_target(graph, tokens, pos)
            r.cache.commit(pos, n)
            outs.append(r.calls[graph].outputs)
        cmp.outputs(graph, *outs)
    if rt.cache.data is not None:  # every row the graphs wrote, padding and stale rows included
        c = rt.contract.cache
        for i, name in enumerate(("present_key", "present_value")):
            cmp.one("target_verify", name, rt.cache.data[i], eager.cache.data[i], rt.cache.data[i].shape, c["dtype"])


AGREEMENT_TEXTS, AGREEMENT_TOKENS = 8, 256


def agreement_length(max_context: int) -> int:
    """Tokens per agreement text: 256, or what the context leaves room for."""
    return min(AGREEMENT_TOKENS, max_context - VERIFY_ROWS)


def agreement_texts(target, max_context: int, seed: int) -> list[list[int]]:
    """Token sequences the eager target writes itself, sampled at temperature 1 from a random first
    token: text on the target's own distribution, for any target, tokenizer or not."""
    gen = torch.Generator().manual_seed(seed)
    length = agreement_length(max_context)
    texts = []
    for _ in range(AGREEMENT_TEXTS):
        first = int(torch.randint(0, target.cfg.vocab_size, (1,), generator=gen))
        texts.append([first] + generate(target, [first], length - 1, max_context, generator=gen))
    return texts


def text_windows(folder: Path, text: str, length: int) -> list[list[int]]:
    """AGREEMENT_TEXTS windows of `length` tokens, evenly spread over `text` (the export's tokenizer)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ArtifactError(f"{path}: missing; --text needs the export's tokenizer (or leave --text out)")
    ids = Tokenizer.from_file(str(path)).encode(text).ids
    if len(ids) < length:
        raise ValueError(f"--text has {len(ids)} tokens; agreement needs at least {length} (give a longer text)")
    starts = np.linspace(0, len(ids) - length, AGREEMENT_TEXTS).astype(int)
    return [ids[s:s + length] for s in starts]


def drafter_agreement(rt: Runtime, eager: Runtime, features: np.ndarray, tokens: list[int],
                      rng: np.random.Generator) -> tuple[int, int]:
    """One text, teacher-forced as the runtime runs it: the first quarter (the prompt) committed 8
    rows at a time, then rounds of a draft from the anchor and a commit of 1..8 rows, on both
    runtimes (each keeps its own window and state). -> (agreeing, compared) draft tokens."""
    for r in (rt, eager):
        r.ctx.reset()
    pos, prompt = 0, len(tokens) // 4
    while pos < prompt:
        n = min(VERIFY_ROWS, prompt - pos)
        for r in (rt, eager):
            r.fold(features[pos:pos + n], pos, n)
        pos += n
    agree = total = 0
    while pos + VERIFY_ROWS <= len(tokens):
        found = lookup(tokens[:pos + 1], rt.block)  # what the loop would find (read by a lookup-input drafter)
        got, expected = (r.draft(tokens[pos], pos, found=found).copy() for r in (rt, eager))
        agree, total = agree + int((got == expected).sum()), total + got.size
        n = int(rng.integers(1, VERIFY_ROWS + 1))
        for r in (rt, eager):
            r.fold(features[pos:pos + n], pos, n)
        pos += n
    return agree, total


def target_agreement(rt: Runtime, expected: np.ndarray, tokens: list[int],
                     rng: np.random.Generator) -> dict[str, tuple[int, int]]:
    """One text through the target graphs as the runtime runs them: the first quarter prefilled in
    chunks, then verify blocks of every width (advancing 1..w rows) and single decode steps, each writing
    its own cache rows. expected: fp32 eager argmax per position. -> graph: (agreeing, compared) rows."""
    counts = {name: (0, 0) for name in rt.contract.target_graphs}
    widths = rt.contract.verify_widths
    rt.cache.reset()

    def run(name: str, pos: int, n: int) -> None:
        logits, _ = rt.run_target(name, tokens[pos:pos + n], pos)
        agree, total = counts[name]
        counts[name] = agree + int((logits[:n].argmax(-1) == expected[pos:pos + n]).sum()), total + n

    pos, prompt = 0, len(tokens) // 4
    while pos < prompt:
        n = min(rt.chunk, prompt - pos)
        run("target_prefill", pos, n)
        rt.cache.commit(pos, n)
        pos += n
    while pos + VERIFY_ROWS <= len(tokens):
        if rng.random() < 0.25:
            run(rt.contract.step_graph, pos, 1)
            rt.cache.commit(pos, 1)
            pos += 1
        else:
            w = widths[int(rng.integers(len(widths)))]
            run(verify_graph(w), pos, w)  # all w rows judged; the rows past the commit go stale
            step = int(rng.integers(1, w + 1))
            rt.cache.commit(pos, step)
            pos += step
    return counts


def step_rows_agree(rt: Runtime, tokens: list[int], places: int = 6) -> list[Check]:
    """An export whose single-token steps run a several-row graph (`target.step_rows`: an int8-compute or fp16 target)
    is exact only if every verify row is, bit for bit, the step at its position: measured here, on this
    machine's kernels. Per verify width: `places` blocks after a prefilled quarter of `tokens`, each block's
    rows against the steps that then decode the same tokens one at a time."""
    checks = []
    for w in rt.contract.verify_widths:
        rt.cache.reset()
        pos, prompt = 0, len(tokens) // 4
        while pos < prompt:
            n = min(rt.chunk, prompt - pos)
            rt.run_target("target_prefill", tokens[pos:pos + n], pos)
            rt.cache.commit(pos, n)
            pos += n
        worst, rows = 0.0, 0
        for _ in range(places):
            if pos + w + 1 > len(tokens):
                break
            block = rt.run_target(verify_graph(w), tokens[pos:pos + w], pos)[0][:w].copy()
            for i in range(w):
                step = rt.run_target(rt.contract.step_graph, tokens[pos + i:pos + i + 1], pos + i)[0][0]
                rt.cache.commit(pos + i, 1)
                worst = max(worst, float(np.abs(block[i] - step).max()))
                rows += 1
            pos += w
        checks.append(Check(verify_graph(w), f"logits rows = {rt.contract.step_graph} steps", rt.backend.name,
                            worst, 0.0, worst == 0.0, "parity", rows))
    return checks


def quantized_agreement(rt: Runtime, eager: Runtime, quant: dict, texts, seed: int,
                        min_agreement: float) -> list[Check]:
    """Agreement rows for the quantized model(s) of one backend, pooled over the texts:
    (tokens, eager features, eager argmax) each."""
    counts: dict[tuple[str, str], tuple[int, int]] = {}

    def add(graph, output, agree, total):
        a, t = counts.get((graph, output), (0, 0))
        counts[graph, output] = a + agree, t + total

    # separate streams: the drafter's rounds are the same whether or not the target is quantized too
    drafter_rng, target_rng = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    for tokens, features, expected in texts:
        if quant["drafter"] != "none":
            add("draft_read", "draft_tokens", *drafter_agreement(rt, eager, features, tokens, drafter_rng))
        if quant["target"] != "none":
            for graph, (a, t) in target_agreement(rt, expected, tokens, target_rng).items():
                add(graph, "argmax(logits)", a, t)
    return [Check(g, o, rt.backend.name, a / t, min_agreement, a / t >= min_agreement, "agreement", t)
            for (g, o), (a, t) in counts.items() if t]


def validate(folder: str | Path, target_override: str | None = None, atol: float | None = None,
             backends: tuple[str, ...] | None = None, seed: int = 1234, min_agreement: float = 0.9,
             text: str | None = None) -> list[Check]:
    """All checks of one export. `text`: measure quantized agreement on windows of this text
    instead of text the target writes."""
    folder = Path(folder)
    manifest = load_manifest(folder)
    eager = Runtime(folder, "eager", target=target_override)
    target, drafter = eager.backend.target, eager.backend.drafter
    specs = graph_specs(target, drafter, manifest["max_context"], manifest["prefill_chunk"], manifest["cache"]["dtype"],
                        tuple(manifest["verify_widths"]))
    check_declarations(folder, manifest, specs, target)
    kinds = backends or tuple(k for k, key in (("onnxruntime", "onnx"), ("executorch", "pte"))
                              if any(g.get(key) for g in manifest["graphs"].values()))
    quant = dict(manifest["quantization"])
    tables = quant.get("embeddings", "none")
    if tables != "none":  # quantized vocabulary tables: judge the models whose graphs read them by agreement
        readers = ("drafter",) if tables.startswith("drafter-") else ("drafter", "target")
        quant = {m: f"embeddings {tables}" if quant[m] == "none" and m in readers else quant[m]
                 for m in ("drafter", "target")}
    by_agreement = {g for g, s in specs.items() if quant[s.model] != "none"}  # a quantized model: all its graphs
    if manifest["cache"]["dtype"] == "float16" and quant["drafter"] == "none":
        # fp16 rounding flips near-ties in draft_read's argmax chain (each slot's Markov bias follows the slot
        # before), after which the slots differ wholly: its drafts are judged by agreement with fp32; the
        # window and state, which hold no argmax, by parity
        quant["drafter"] = "fp16"
        by_agreement.add("draft_read")
    texts = []
    if (quant["drafter"], quant["target"]) != ("none", "none"):
        length = agreement_length(manifest["max_context"])
        if length < 4 * VERIFY_ROWS:
            raise ValueError(f"{folder}: max_context {manifest['max_context']} leaves too few tokens to measure "
                             f"quantized agreement (needs >= {5 * VERIFY_ROWS}); export with a larger --max-context")
        token_lists = (text_windows(folder, text, length) if text is not None
                       else agreement_texts(target, manifest["max_context"], seed))
        with torch.no_grad():  # the eager target once per text, for every backend
            for tokens in token_lists:
                logits, features = target(torch.tensor([tokens]))
                texts.append((tokens, features[0].numpy(), logits[0].argmax(-1).numpy()))
    checks = []
    for kind in kinds:
        rt = Runtime(folder, kind)
        cmp = Comparer(specs, kind, frozenset(by_agreement), atol)
        drafter_parity(rt, eager, cmp, seed)
        target_parity(rt, eager, cmp, seed)
        checks.extend(cmp.checks)
        if texts:
            checks.extend(quantized_agreement(rt, eager, quant, texts, seed, min_agreement))
            if rt.contract.step_rows != 1:
                checks.extend(step_rows_agree(rt, texts[0][0]))
    if texts:
        checks.extend(cross_runtime_agreement(folder, kinds, [tokens for tokens, _, _ in texts]))
    return checks


CROSS_PROMPT, CROSS_NEW = 24, 32  # prompt and answer tokens of the cross-runtime checks, per text and mode


def _greedy(runtime: Runtime, prompt: list[int], draft: str) -> list[int]:
    cfg = GenerationConfig(max_new_tokens=CROSS_NEW, draft=draft, ignore_eos=True)
    return [t for new in runtime.generate(prompt, cfg) for t in new]


def cross_runtime_agreement(folder: Path, kinds: tuple[str, ...], texts: list[list[int]]) -> list[Check]:
    """A quantized export across runtimes, greedy, from the first tokens of each agreement text, speculative
    and target-only: the Python runtime's ExecuTorch programs against hyflash-run (the same kernels by default:
    judged, every token equal) and onnxruntime against ExecuTorch (reported: fp32-compute MatMulNBits and
    8da4w differ by design). Each row: the share of generations equal token for token."""
    prompts = [t[:CROSS_PROMPT] for t in texts]
    checks = []
    if "executorch" not in kinds:
        return checks
    pte = Runtime(folder, "executorch")
    python = {(i, d): _greedy(pte, p, d) for i, p in enumerate(prompts) for d in ("model", "none")}
    runner = runner_path()
    if pte.backend.kernels == "hyflash" and runner.is_file():
        equal = [run_native(folder, prompts[i], CROSS_NEW, draft, runner=runner,
                            ignore_eos=True)["tokens"] == tokens for (i, draft), tokens in python.items()]
        checks.append(Check("loop", "tokens", "hyflash-run", sum(equal) / len(equal), 1.0, all(equal),
                            "agreement", len(equal)))
    else:  # no runner built, or another kernel choice than the runner's: reported, not judged
        checks.append(Check("loop", "tokens", "hyflash-run", float("nan"), float("nan"), True, "info"))
    if "onnxruntime" in kinds:
        ort = Runtime(folder, "onnxruntime")
        equal = [_greedy(ort, prompts[i], "none") == tokens for (i, d), tokens in python.items() if d == "none"]
        checks.append(Check("loop", "tokens", "ort-vs-pte", sum(equal) / len(equal), float("nan"), True, "info",
                            len(equal)))
    return checks


def summarize(checks: list[Check]) -> list[Check]:
    """One row per (graph, output, backend): the worst case."""
    worst: dict[tuple, Check] = {}
    for c in checks:
        key = (c.graph, c.output, c.backend)
        if key not in worst or (c.ok, -c.max_diff) < (worst[key].ok, -worst[key].max_diff):
            worst[key] = c
    return list(worst.values())  # agreement rows arrive pooled over the texts: one per key


def format_table(rows: list[Check]) -> str:
    lines = [f"{'graph':<15} {'output':<16} {'backend':<12} {'diff / agree':>13} {'bar':>10} {'scale':>9}  ok"]
    for c in rows:
        if c.graph == "loop" and c.kind == "info" and c.count == 0:
            value, tol, scale = "not run", "(info)", ""  # no runner, or another kernel choice than its
        elif c.graph == "loop" and c.kind == "info":
            value, tol, scale = f"{c.max_diff:.1%} of {c.count}", "(info)", ""
        elif c.kind == "agreement":
            value, tol, scale = f"{c.max_diff:.1%} of {c.count}", f">= {c.tolerance:.0%}", ""
        else:
            value, tol = f"{c.max_diff:.3g}", "(info)" if c.kind == "info" else f"{c.tolerance:.2g}"
            scale = f"{c.scale:.3g}"
        lines.append(f"{c.graph:<15} {c.output:<16} {c.backend:<12} {value:>13} {tol:>10} {scale:>9}  "
                     f"{'yes' if c.ok else 'NO'}")
    return "\n".join(lines)
