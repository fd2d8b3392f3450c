"""`hyflash validate`: every graph of every format against eager PyTorch, on fresh inputs.

The eager models are rebuilt from the export's own drafter weights and the target folder the
manifest records (its checksums checked). Inputs are not the tracing example: caches and
windows filled by real commits, several `n_valid` values, NaN in padding rows. Names are
checked first, then shapes and dtypes, then values; any failure is an error.

Quantized graphs are judged by agreement with fp32, on text: sequences the target writes itself,
run through the graphs teacher-forced the way the runtime runs them (closed loop: the graphs
carry their own cache, window and state, so drift counts). Random features and caches, fine for
parity, give near-tied logits whose argmax any rounding flips: agreement there says nothing
about the drafts a user gets.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from ..models.loading import load_target
from ..models.target import generate, write_cache
from ..train.drafter import load_drafter
from .graphs import VERIFY_ROWS, graph_module, graph_specs
from .manifest import ArtifactError, load_manifest, sha256


@dataclasses.dataclass
class Check:
    graph: str
    output: str
    backend: str
    max_diff: float  # for kind "agreement": the agreement rate with fp32 eager
    tolerance: float  # for "agreement": the minimum rate; for "info": nan (reported, not judged)
    ok: bool
    kind: str = "parity"  # "parity" | "agreement" (quantized graphs) | "info"
    count: int = 0  # for "agreement": how many tokens were compared


def load_eager(folder: Path, manifest: dict, target_override: str | None = None):
    """(target, drafter) as eager modules, from the recorded target folder and the export's drafter."""
    target_dir = Path(target_override or manifest["target"]["path"])
    if not target_dir.is_dir():
        raise FileNotFoundError(f"{target_dir}: the target folder recorded in the manifest is gone; "
                                "pass --target DIR")
    for name, expected in manifest["target"]["files"].items():
        path = target_dir / name
        if not path.is_file() or sha256(path) != expected:
            raise ArtifactError(f"{path}: not the target this export was made from (sha256 differs or file missing)")
    target = load_target(target_dir, tuple(manifest["target"]["taps"]))
    return target, load_drafter(folder / "drafter", target)


def validation_cases(specs, target, drafter, seed: int):
    """graph -> list of input tuples (torch), drawn from states reached by real commits."""
    gen = torch.Generator().manual_seed(seed)
    d = drafter.cfg
    max_context = next(iter(s for s in specs.values() if s.model == "target")).inputs[3].shape[2]
    feat = target.feature_size
    ctx = drafter.init_context(max_context)
    committed = 0
    states = []
    for n_valid in [8, 3, 8, 5, 8, 8, 1, 8]:
        f = torch.randn(VERIFY_ROWS, feat, generator=gen)
        f[n_valid:] = float("nan")
        positions = torch.arange(committed, committed + VERIFY_ROWS)
        nv = torch.tensor([n_valid])
        with torch.no_grad():
            if d.memory != "off":
                ctx["ssm_state"], ctx["conv_state"] = drafter.state_commit(f, nv, ctx["ssm_state"], ctx["conv_state"])
            ctx["win_k"], ctx["win_v"], ctx["win_pos"] = drafter.window_shift(f, positions, nv, ctx["win_k"],
                                                                              ctx["win_v"], ctx["win_pos"])
        committed += n_valid
        states.append((committed, {k: v.clone() for k, v in ctx.items()}))
    cases = {name: [] for name in specs}
    for i, (pos, st) in enumerate(states[2::2]):
        f = torch.randn(VERIFY_ROWS, feat, generator=gen)
        n_valid = [0, 3, 8][i % 3]
        f[n_valid:] = float("nan")
        nv = torch.tensor([n_valid])
        state = (st["ssm_state"],) if d.memory != "off" else ()
        token = torch.randint(0, d.vocab_size, (1,), generator=gen)
        cases["draft_read"].append((token, torch.tensor([pos]), st["win_k"], st["win_v"], st["win_pos"], *state))
        cases["window_shift"].append((f, torch.arange(pos, pos + VERIFY_ROWS), nv, st["win_k"], st["win_v"],
                                      st["win_pos"]))
        if "state_commit" in cases:
            cases["state_commit"].append((f, nv, st["ssm_state"], st["conv_state"]))
    t = target.cfg
    for name, spec in specs.items():
        if spec.model != "target":
            continue
        rows = spec.inputs[0].shape[0]
        for start, n_valid in ((0, rows), (min(37, max_context - rows), max(1, rows // 2)),
                               (max(0, max_context - rows - 5), 1)):
            k = torch.randn(t.num_layers, t.num_kv_heads, max_context, t.head_dim, generator=gen)
            v = torch.randn(t.num_layers, t.num_kv_heads, max_context, t.head_dim, generator=gen)
            tokens = torch.randint(0, t.vocab_size, (rows,), generator=gen)
            cases[name].append((tokens, torch.arange(start, start + rows), torch.tensor([n_valid]), k, v))
    return cases


def _compare(spec, name, backend, got, expected) -> list[Check]:
    checks = []
    for out_spec, g, e in zip(spec.outputs, got, expected):
        e = e.numpy()
        if tuple(g.shape) != tuple(out_spec.shape) or str(g.dtype) != out_spec.dtype:
            checks.append(Check(name, out_spec.name, backend, float("inf"), 0.0, False))
            continue
        tol = 0.0 if out_spec.dtype == "int64" else spec.tolerance(out_spec.name)
        diff = float(np.abs(g.astype(np.float64) - e.astype(np.float64)).max()) if g.size else 0.0
        checks.append(Check(name, out_spec.name, backend, diff, tol, bool(diff <= tol)))
    return checks


def _info(spec, name, backend, got, expected) -> list[Check]:
    """Quantized graphs on the parity inputs: float outputs' max diff, reported (not judged)."""
    checks = []
    for out_spec, g, e in zip(spec.outputs, got, expected):
        if out_spec.dtype == "float32":
            e = e.numpy()
            diff = float(np.abs(g - e).max()) if np.isfinite(g).all() else float("inf")
            checks.append(Check(name, out_spec.name, backend, diff, float("nan"), True, "info"))
    return checks


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
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(path)).encode(text).ids
    if len(ids) < length:
        raise ValueError(f"--text has {len(ids)} tokens; agreement needs at least {length} (give a longer text)")
    starts = np.linspace(0, len(ids) - length, AGREEMENT_TEXTS).astype(int)
    return [ids[s:s + length] for s in starts]


@torch.no_grad()
def drafter_agreement(graphs, drafter, features: torch.Tensor, tokens: list[int], max_context: int,
                      rng: np.random.Generator) -> tuple[int, int]:
    """One text, teacher-forced as the runtime runs it: the first quarter (the prompt) committed 8
    rows at a time, then rounds of a draft from the anchor and a commit of 1..8 rows. The graphs
    keep their own window and state, eager PyTorch the fp32 ones. -> (agreeing, compared) draft tokens."""
    eager = drafter.init_context(max_context)
    mine = {k: v.numpy().copy() for k, v in eager.items()}
    memory = drafter.cfg.memory != "off"

    def commit(pos: int, n: int) -> None:
        rows = torch.zeros(VERIFY_ROWS, features.shape[1])
        rows[:n] = features[pos:pos + n]
        nv, positions = torch.tensor([n]), torch.arange(pos, pos + VERIFY_ROWS)
        if memory:
            eager["ssm_state"], eager["conv_state"] = drafter.state_commit(rows, nv, eager["ssm_state"],
                                                                           eager["conv_state"])
            mine["ssm_state"], mine["conv_state"] = graphs.run(
                "state_commit", [rows.numpy(), nv.numpy(), mine["ssm_state"], mine["conv_state"]])
        eager["win_k"], eager["win_v"], eager["win_pos"] = drafter.window_shift(
            rows, positions, nv, eager["win_k"], eager["win_v"], eager["win_pos"])
        mine["win_k"], mine["win_v"], mine["win_pos"] = graphs.run(
            "window_shift", [rows.numpy(), positions.numpy(), nv.numpy(), mine["win_k"], mine["win_v"],
                             mine["win_pos"]])

    pos, prompt = 0, len(tokens) // 4
    while pos < prompt:
        n = min(VERIFY_ROWS, prompt - pos)
        commit(pos, n)
        pos += n
    agree = total = 0
    while pos + VERIFY_ROWS <= len(tokens):
        anchor, at = torch.tensor([tokens[pos]]), torch.tensor([pos])
        expected = drafter.draft_read(anchor, at, eager["win_k"], eager["win_v"], eager["win_pos"],
                                      eager["ssm_state"] if memory else None)[0].numpy()
        got = graphs.run("draft_read", [anchor.numpy(), at.numpy(), mine["win_k"], mine["win_v"], mine["win_pos"]]
                         + ([mine["ssm_state"]] if memory else []))[0]
        agree, total = agree + int((got == expected).sum()), total + got.size
        n = int(rng.integers(1, VERIFY_ROWS + 1))
        commit(pos, n)
        pos += n
    return agree, total


def target_agreement(graphs, specs, expected: np.ndarray, tokens: list[int],
                     rng: np.random.Generator) -> dict[str, tuple[int, int]]:
    """One text through the target graphs as the runtime runs them: the first quarter prefilled in
    chunks, then verify blocks (advancing 1..8 rows) and single decode steps, each writing its own
    K/V rows. expected: fp32 eager argmax per position. -> graph: (agreeing, compared) rows."""
    shape = specs["target_decode"].inputs[3].shape
    k_cache, v_cache = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    counts = {name: (0, 0) for name in ("target_prefill", "target_verify", "target_decode")}

    def run(name: str, pos: int, n: int) -> None:
        rows = specs[name].inputs[0].shape[0]
        ids = np.zeros(rows, np.int64)
        ids[:n] = tokens[pos:pos + n]
        logits, _, k_new, v_new = graphs.run(name, [ids, np.arange(pos, pos + rows), np.array([n]), k_cache, v_cache])
        write_cache(k_cache, k_new, pos, n)
        write_cache(v_cache, v_new, pos, n)
        agree, total = counts[name]
        counts[name] = agree + int((logits[:n].argmax(-1) == expected[pos:pos + n]).sum()), total + n

    chunk = specs["target_prefill"].inputs[0].shape[0]
    pos, prompt = 0, len(tokens) // 4
    while pos < prompt:
        n = min(chunk, prompt - pos)
        run("target_prefill", pos, n)
        pos += n
    while pos + VERIFY_ROWS <= len(tokens):
        if rng.random() < 0.25:
            run("target_decode", pos, 1)
            pos += 1
        else:
            run("target_verify", pos, VERIFY_ROWS)  # all 8 rows judged; the rows past the commit go stale
            pos += int(rng.integers(1, VERIFY_ROWS + 1))
    return counts


def quantized_agreement(graphs, specs, drafter, quant: dict, max_context: int, texts, seed: int,
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
            add("draft_read", "draft_tokens", *drafter_agreement(graphs, drafter, features, tokens,
                                                                 max_context, drafter_rng))
        if quant["target"] != "none":
            for graph, (a, t) in target_agreement(graphs, specs, expected, tokens, target_rng).items():
                add(graph, "argmax(logits)", a, t)
    return [Check(g, o, graphs.name, a / t, min_agreement, a / t >= min_agreement, "agreement", t)
            for (g, o), (a, t) in counts.items() if t]


def validate(folder: str | Path, target_override: str | None = None, atol: float | None = None,
             backends: tuple[str, ...] | None = None, seed: int = 1234, min_agreement: float = 0.9,
             text: str | None = None) -> list[Check]:
    """All checks of one export. `text`: measure quantized agreement on windows of this text
    instead of text the target writes."""
    from ..runtime_py.backends import open_graphs

    folder = Path(folder)
    manifest = load_manifest(folder)
    target, drafter = load_eager(folder, manifest, target_override)
    specs = graph_specs(target, drafter, manifest["max_context"], manifest["prefill_chunk"])
    # names first, then shapes and dtypes: the export must declare exactly what the code does
    for name, spec in specs.items():
        declared = manifest["graphs"].get(name)
        if declared is None:
            raise ArtifactError(f"{folder}: graph {name!r} is missing from the manifest")
        for kind in ("inputs", "outputs"):
            mine = [t.to_json() for t in getattr(spec, kind)]
            if declared[kind] != mine:
                raise ArtifactError(f"{folder}: graph {name!r} {kind} in the manifest differ from the model's")
    if set(manifest["graphs"]) != set(specs):
        raise ArtifactError(f"{folder}: manifest has graphs {sorted(manifest['graphs'])}, expected {sorted(specs)}")
    if atol is not None:
        specs = {n: dataclasses.replace(s, atol=atol, state_atol=atol) for n, s in specs.items()}
    kinds = backends or tuple(k for k, key in (("onnxruntime", "onnx"), ("executorch", "pte"))
                              if any(g.get(key) for g in manifest["graphs"].values()))
    quant = manifest["quantization"]
    cases = validation_cases(specs, target, drafter, seed)
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
                texts.append((tokens, features[0], logits[0].argmax(-1).numpy()))
    checks = []
    eager = {name: graph_module(spec, target, drafter) for name, spec in specs.items()}
    for kind in kinds:
        graphs = open_graphs(kind, folder, manifest)
        for name, spec in specs.items():
            for inputs in cases[name]:
                with torch.no_grad():
                    expected = eager[name](*inputs)
                got = graphs.run(name, [x.numpy() for x in inputs])
                compare = _info if quant[spec.model] != "none" else _compare
                checks.extend(compare(spec, name, kind, got, expected))
        if texts:
            checks.extend(quantized_agreement(graphs, specs, drafter, quant, manifest["max_context"], texts, seed,
                                              min_agreement))
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
    lines = [f"{'graph':<15} {'output':<16} {'backend':<12} {'diff / agree':>13} {'tolerance':>10}  ok"]
    for c in rows:
        if c.kind == "agreement":
            value, tol = f"{c.max_diff:.1%} of {c.count}", f">= {c.tolerance:.0%}"
        else:
            value, tol = f"{c.max_diff:.3g}", "(info)" if c.kind == "info" else f"{c.tolerance:.1g}"
        lines.append(f"{c.graph:<15} {c.output:<16} {c.backend:<12} {value:>13} {tol:>10}  "
                     f"{'yes' if c.ok else 'NO'}")
    return "\n".join(lines)
