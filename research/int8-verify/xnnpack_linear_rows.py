"""What do XNNPACK's quantized linears cost for 8 rows against 1, by weight scheme, and is a row exact?

On the `.pte` int4 export (ExecuTorch's 8da4w, int4 weights in groups of 32) an 8-row verify costs about 2
decode steps, and what is left after the attention kernel's rewrite is the linears (docs/results-smollm2.md,
"The cache kernels rewritten"). This lowers the linears of SmolLM2-135M-Instruct's 30 layers (random
weights at its shapes: q, o 576 -> 576; k, v 576 -> 192; gate, up 576 -> 1536; down 1536 -> 576) to one
.pte per weight scheme, each with a 1-row and an 8-row method, and reports the median ms per call (2
threads), the 8-row / 1-row ratio, and whether each row of the 8-row call equals the same row run alone,
bit for bit (what a verify needs). Schemes: fp32; 8da4w in groups of 32 (shipped), 64 and 192; 8da4w per
output channel; 8da8w per channel. Raw JSON to research/int8-verify/results/xnnpack_linear_rows.json.
`--vocab`: the vocabulary projection instead (576 -> 49,152, the int4 export's 8da4w LM head), its output the
logits of every row; raw JSON to results/xnnpack_vocab_rows.json.

    .venv/bin/python research/int8-verify/xnnpack_linear_rows.py [--vocab] [--out PATH]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn

RESULTS = Path(__file__).parent / "results"
HIDDEN, KV, MLP, LAYERS, VOCAB = 576, 192, 1536, 30, 49152
THREADS, REPEATS = 2, 200


class Linears(nn.Module):
    """The target's projections, layer after layer, with a residual so that every output is used."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleDict({
            "q": nn.Linear(HIDDEN, HIDDEN, bias=False), "k": nn.Linear(HIDDEN, KV, bias=False),
            "v": nn.Linear(HIDDEN, KV, bias=False), "o": nn.Linear(HIDDEN, HIDDEN, bias=False),
            "gate": nn.Linear(HIDDEN, MLP, bias=False), "up": nn.Linear(HIDDEN, MLP, bias=False),
            "down": nn.Linear(MLP, HIDDEN, bias=False)}) for _ in range(LAYERS))

    def forward(self, x):
        for m in self.layers:
            kv = (m["k"](x) + m["v"](x)).repeat(1, HIDDEN // KV)
            h = x + m["o"](m["q"](x)) + kv
            x = torch.nn.functional.rms_norm(h + m["down"](nn.functional.silu(m["gate"](h)) * m["up"](h)), (HIDDEN,))
        return x


class Vocab(nn.Module):
    """The LM head alone: (rows, 576) -> (rows, 49,152) logits."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x):
        return self.head(x)


def quantized(module: nn.Module, scheme: str) -> nn.Module:
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    if scheme == "fp32":
        return module
    bits, _, grain = scheme.partition("-")
    granularity = PerAxis(0) if grain == "channel" else PerGroup(int(grain))
    quantize_(module, Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4 if bits == "8da4w" else torch.int8, weight_granularity=granularity))
    return module


def lower(scheme: str, path: Path, kind: type[nn.Module]) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    module = quantized(kind().eval(), scheme)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        programs = {f"rows{m}": torch.export.export(module, (torch.randn(m, HIDDEN),), strict=False)
                    for m in (1, 8)}
        path.write_bytes(to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)


def timed(method, x: torch.Tensor) -> float:
    for _ in range(20):
        method.execute([x])
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        method.execute([x])
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", action="store_true", help="the vocabulary projection instead of the layers' linears")
    ap.add_argument("--out", type=Path, help="the JSON's path (default: results/xnnpack_{vocab,linear}_rows.json)")
    args = ap.parse_args()
    kind, out = (Vocab, RESULTS / "xnnpack_vocab_rows.json") if args.vocab else (Linears, RESULTS / "xnnpack_linear_rows.json")
    out = args.out or out
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    from executorch.runtime import Runtime

    from hyflash.runtime_py.chatbench import machine

    _unsafe_reset_threadpool(THREADS)
    x = torch.randn(8, HIDDEN, generator=torch.Generator().manual_seed(1))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in ("fp32", "8da4w-32", "8da4w-64", "8da4w-192", "8da4w-channel", "8da8w-channel"):
            path = Path(tmp) / f"{scheme}.pte"
            lower(scheme, path, kind)
            program = Runtime.get().load_program(str(path))
            one, eight = program.load_method("rows1"), program.load_method("rows8")
            block = eight.execute([x])[0]
            alone = torch.cat([one.execute([x[i:i + 1]])[0] for i in range(8)])
            ms1, ms8 = timed(one, x[:1]), timed(eight, x)
            rows.append({"scheme": scheme, "ms_1_row": ms1, "ms_8_rows": ms8, "ratio_8_to_1": ms8 / ms1,
                         "rows_bit_equal": bool(torch.equal(block, alone)),
                         "max_abs_row_diff": float((block - alone).abs().max())})
            print(f"{scheme:>14}: 1 row {ms1:6.2f} ms, 8 rows {ms8:6.2f} ms ({ms8 / ms1:.2f}x), rows bit-equal "
                  f"{rows[-1]['rows_bit_equal']} (max diff {rows[-1]['max_abs_row_diff']:.1e})", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    shapes = {"hidden": HIDDEN, "vocab": VOCAB} if args.vocab else {"hidden": HIDDEN, "kv": KV, "mlp": MLP}
    out.write_text(json.dumps({"machine": machine(THREADS), "threads": THREADS, "repeats": REPEATS, "module": kind.__name__,
                               **({} if args.vocab else {"layers": LAYERS}), "shapes": shapes, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
