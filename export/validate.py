"""`hyflash validate`: every graph of every format against eager PyTorch, on fresh inputs.

The eager models are rebuilt from the export's own drafter weights and the target folder the
manifest records (its checksums checked). Inputs are not the tracing example: caches and
windows filled by real commits, several `n_valid` values, NaN in padding rows. Names are
checked first, then shapes and dtypes, then values; any failure is an error.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from ..models.loading import load_target
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


def validation_cases(specs, target, drafter, seed: int, anchors_per_state: int = 1):
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
        for token in torch.randint(0, d.vocab_size, (anchors_per_state, 1), generator=gen):
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


def _agreement(spec, name, backend, got, expected) -> list[Check]:
    """Quantized graphs: token agreement with fp32 (draft tokens, or the target's argmax per row);
    float outputs are reported (max diff), not judged."""
    checks = []
    for out_spec, g, e in zip(spec.outputs, got, expected):
        e = e.numpy()
        if out_spec.name == "draft_tokens":
            checks.append(Check(name, "draft_tokens", backend, float((g == e).mean()), 0.0, True, "agreement"))
        elif out_spec.name == "logits":
            agree = float((g.argmax(-1) == e.argmax(-1)).mean())
            checks.append(Check(name, "argmax(logits)", backend, agree, 0.0, True, "agreement"))
        if out_spec.dtype == "float32":
            diff = float(np.abs(g - e).max()) if np.isfinite(g).all() else float("inf")
            checks.append(Check(name, out_spec.name, backend, diff, float("nan"), True, "info"))
    return checks


def _pool_agreement(checks: list[Check], min_agreement: float) -> list[Check]:
    """Average the per-case agreement rates of each (graph, output, backend); judge the mean."""
    pooled: dict[tuple, list[float]] = {}
    rest = []
    for c in checks:
        if c.kind == "agreement":
            pooled.setdefault((c.graph, c.output, c.backend), []).append(c.max_diff)
        else:
            rest.append(c)
    for (graph, output, backend), rates in pooled.items():
        rate = float(np.mean(rates))
        rest.append(Check(graph, output, backend, rate, min_agreement, rate >= min_agreement, "agreement"))
    return rest


def validate(folder: str | Path, target_override: str | None = None, atol: float | None = None,
             backends: tuple[str, ...] | None = None, seed: int = 1234, min_agreement: float = 0.9) -> list[Check]:
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
    cases = validation_cases(specs, target, drafter, seed, anchors_per_state=8 if quant["drafter"] != "none" else 1)
    checks = []
    eager = {name: graph_module(spec, target, drafter) for name, spec in specs.items()}
    for kind in kinds:
        graphs = open_graphs(kind, folder, manifest)
        for name, spec in specs.items():
            for inputs in cases[name]:
                with torch.no_grad():
                    expected = eager[name](*inputs)
                got = graphs.run(name, [x.numpy() for x in inputs])
                compare = _agreement if quant[spec.model] != "none" else _compare
                checks.extend(compare(spec, name, kind, got, expected))
    return _pool_agreement(checks, min_agreement)


def summarize(checks: list[Check]) -> list[Check]:
    """One row per (graph, output, backend): the worst case."""
    worst: dict[tuple, Check] = {}
    for c in checks:
        key = (c.graph, c.output, c.backend)
        if key not in worst or (c.ok, -c.max_diff) < (worst[key].ok, -worst[key].max_diff):
            worst[key] = c
    return list(worst.values())  # agreement rows arrive pooled: one per key already


def format_table(rows: list[Check]) -> str:
    lines = [f"{'graph':<15} {'output':<16} {'backend':<12} {'max abs diff':>12} {'tolerance':>10}  ok"]
    for c in rows:
        if c.kind == "agreement":
            value, tol = f"{c.max_diff:.1%} agree", f">= {c.tolerance:.0%}"
        else:
            value, tol = f"{c.max_diff:.3g}", "(info)" if c.kind == "info" else f"{c.tolerance:.1g}"
        lines.append(f"{c.graph:<15} {c.output:<16} {c.backend:<12} {value:>12} {tol:>10}  "
                     f"{'yes' if c.ok else 'NO'}")
    return "\n".join(lines)
