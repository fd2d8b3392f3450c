"""An int4 `.pte` export whose target linears use another weight scheme than the shipped one (8da4w, groups of
32): `--scheme channel` (one scale per output channel) or `--scheme group64`, everything else as `hyflash export`
makes it (vocabulary tables and the drafter as its flags say). A study, not a product option: it wraps the
export's quantize step in this process (the `.pte` lowered here, not in a process of its own).

    .venv/bin/python research/int8-verify/export_int4_weights.py --scheme channel -- --target smollm2-135m-instruct \
        --drafter smollm2-135m-instruct --format pte --quantize-target int4 --quantize-embeddings int4 --quantize int4 \
        --out runs/exports/smol-pte-int4-channel
"""

import argparse
import copy

from torch import nn

from hyflash.cli import main as cli
from hyflash.export import pipeline, quantize
from hyflash.models.drafter import Drafter
from hyflash.models.target import Target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", choices=("channel", "group64"), required=True)
    ap.add_argument("export_args", nargs=argparse.REMAINDER, help="-- then hyflash export's arguments")
    a = ap.parse_args()
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    granularity = PerAxis(0) if a.scheme == "channel" else PerGroup(64)
    shipped = quantize.quantize_module

    def quantize_module(module, mode, embeddings="none", in_place=False):
        if mode != "int4" or not any(isinstance(m, Target) for m in module.modules()):  # a target method's module
            return shipped(module, mode, embeddings, in_place)
        if not in_place:
            shared = {id(t): t for m in module.modules() if isinstance(m, Drafter) for t in (m.embed, m.lm_head)}
            module = copy.deepcopy(module, shared)
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=granularity)
        quantize_(module, config, filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and not fqn.endswith("lm_head")
                  and m.in_features % 64 == 0)
        print(f"target linears: int4, {a.scheme}", flush=True)
        return shipped(module, "none", embeddings, in_place=True)

    pipeline.quantize_module = quantize_module
    pipeline.PTE_OWN_PROCESS_PARAMS = float("inf")  # lowered in this process, where the wrapper is
    args = a.export_args[1:] if a.export_args[:1] == ["--"] else a.export_args
    cli(["export", *args])


if __name__ == "__main__":
    main()
