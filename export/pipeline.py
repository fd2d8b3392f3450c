"""`hyflash export`: target + drafter -> one folder of graphs, weights and a manifest, atomically.

Everything is written into a temporary sibling folder; only a complete export (manifest last)
is renamed into place, so a failed or killed export leaves no folder that passes validation.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import multiprocessing
import os
import platform
import resource
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from hyflash import __version__
from hyflash.export.graphs import FLOAT_DTYPES, cache_spec, check_dtype, graph_specs
from hyflash.export.lower import OnnxWeights, export_onnx_graph, export_pte
from hyflash.export.quantize import (
    DRAFTER_EMBEDDING_MODES,
    DRAFTER_MODES,
    EMBEDDING_MODES,
    TARGET_COMPUTE,
    TARGET_MODES,
    quantize_module,
    quantize_onnx,
    quantize_vocab_onnx,
)
from hyflash.models.drafter import Drafter, DrafterConfig
from hyflash.models.files import replace_folder, sha256, write_json_atomic
from hyflash.models.generation import end_of_text_ids, generation_config, talk_files
from hyflash.models.loading import (
    drafter_config_dict,
    load_drafter,
    load_target,
    resolve,
    save_drafter,
    target_info,
    weight_files,
)
from hyflash.models.target import Target, to_fp16
from hyflash.runtime_py.manifest import (
    FORMAT_VERSION,
    PTE_FILE,
    PTE_VERIFY_ATTENTION,
    QUANTIZED_EMBEDDING_KERNELS,
    VERIFY_ROWS,
    VERIFY_WIDTHS,
    check_widths,
    file_hashes,
    seal,
)

FORMATS = ("onnx", "pte")
# A target this large lowers its .pte in a process of its own, before this one holds the models: the
# lowering's peak is then its own (Qwen3-1.7B: 22.0 GiB in one process with the ONNX graphs before it).
PTE_OWN_PROCESS_PARAMS = 100_000_000


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    target: Path
    drafter: str  # a drafter folder, a reference name, or "random"
    out: Path
    formats: tuple[str, ...] = FORMATS
    window: int | None = None  # None: the drafter's own (random: 128, or 256 for hidden >= 2048)
    max_context: int | None = None  # None: min(max_position_embeddings, 4096)
    prefill_chunk: int = 64
    verify_widths: tuple[int, ...] = VERIFY_WIDTHS  # the verify graphs: anchor + w - 1 drafts, 8 among them
    quantize: str = "none"  # the drafter: none | int8 | int4
    quantize_target: str = "none"  # none | int4 (forms that keep the rows of a block independent)
    target_compute: str = "fp32"  # fp32 | int8: an ONNX int4 target's arithmetic (int8: steps run 2 rows)
    quantize_embeddings: str = "none"  # none | int8 | int4: both models' vocabulary tables; drafter-int8 |
    # drafter-int4: only the drafter's graphs read quantized copies (ONNX), the target's keep theirs
    dtype: str = "fp32"  # fp32 | fp16: weights, graph I/O and the KV cache
    pte_kernels: str | None = None  # hyflash | executorch: the cache kernels the .pte is exact with (TargetPte);
    # None: the project's for fp32, ExecuTorch's for fp16 (the project's are float32 only)
    seed: int = 0
    force: bool = False

    @property
    def step_rows(self) -> int:
        """Rows a single-token step runs (the manifest's target.step_rows). 2 where onnxruntime's one-row call
        rounds unlike its several-row calls while every width of two rows or more gives a row the same bits, so
        that each verify row is the step at its position bit for bit: int8 compute (export.quantize.TARGET_COMPUTE)
        and fp16 (its one-row MatMul and attention round apart by up to 0.03 in SmolLM2-135M's logits; an fp16
        .pte steps the same way, ExecuTorch's rows agreeing as well: validate checks it on each backend)."""
        return 2 if self.target_compute == "int8" or self.dtype == "fp16" else 1

    def __post_init__(self):
        bad = set(self.formats) - set(FORMATS)
        if bad or not self.formats:
            raise ValueError(f"--format must be onnx, pte or both, got {sorted(bad) or 'nothing'}")
        if self.prefill_chunk < 1:
            raise ValueError(f"--prefill-chunk must be >= 1, got {self.prefill_chunk}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"--window must be >= 1, got {self.window}")
        try:
            object.__setattr__(self, "verify_widths", check_widths(self.verify_widths))
        except (ValueError, TypeError) as e:
            raise ValueError(f"--verify-widths: {e}") from None
        if self.quantize not in DRAFTER_MODES:
            raise ValueError(f"--quantize must be one of {', '.join(DRAFTER_MODES)}, got {self.quantize!r}")
        if self.quantize_target not in TARGET_MODES:
            raise ValueError(f"--quantize-target must be one of {', '.join(TARGET_MODES)}, got {self.quantize_target!r}")
        if self.target_compute not in TARGET_COMPUTE:
            raise ValueError(f"--target-compute must be fp32 or int8, got {self.target_compute!r}")
        if self.target_compute == "int8" and (self.quantize_target != "int4" or "pte" in self.formats):
            raise ValueError("--target-compute int8 is for an ONNX int4 target: add --quantize-target int4 "
                             "--format onnx (a .pte target is 8da4w already)")
        if self.step_rows == 2:  # single-token steps run the two-row verify graph: it must be exported
            object.__setattr__(self, "verify_widths", check_widths((*self.verify_widths, 2)))
        modes = (*EMBEDDING_MODES, *DRAFTER_EMBEDDING_MODES)
        if self.quantize_embeddings not in modes:
            raise ValueError(f"--quantize-embeddings must be one of {', '.join(modes)}, got {self.quantize_embeddings!r}")
        if self.quantize_embeddings in DRAFTER_EMBEDDING_MODES and "pte" in self.formats:
            raise ValueError(f"--quantize-embeddings {self.quantize_embeddings} is ONNX only (a .pte holds one copy of "
                             "the tables both models read); add --format onnx, or quantize both models' tables "
                             f"(--quantize-embeddings {self.embeddings('drafter')})")
        check_dtype(self.dtype, self.quantize, self.quantize_target, self.quantize_embeddings)
        if self.pte_kernels is None:
            object.__setattr__(self, "pte_kernels", "executorch" if self.dtype == "fp16" else "hyflash")
        if self.pte_kernels not in PTE_VERIFY_ATTENTION:
            raise ValueError(f"--pte-kernels must be hyflash or executorch, got {self.pte_kernels!r}")
        if self.pte_kernels == "hyflash" and self.dtype == "fp16" and "pte" in self.formats:
            raise ValueError("--pte-kernels hyflash is for float32 programs (the project's cache kernels are float32 "
                             "only); an fp16 .pte runs ExecuTorch's: drop --pte-kernels or pass executorch")

    def mode(self, model: str) -> str:
        return self.quantize if model == "drafter" else self.quantize_target

    def embeddings(self, model: str) -> str:
        """How `model`'s graphs hold the vocabulary tables: none | int8 | int4."""
        if self.quantize_embeddings in DRAFTER_EMBEDDING_MODES:
            return self.quantize_embeddings.removeprefix("drafter-") if model == "drafter" else "none"
        return self.quantize_embeddings


def load_models(target_dir: Path, drafter_src: str, window: int | None, seed: int) -> tuple[Target, Drafter]:
    if drafter_src == "random":
        target = load_target(target_dir)
        overrides = {"window": window} if window else {}
        torch.manual_seed(seed)
        drafter = Drafter.for_target(target, DrafterConfig.for_target(target, **overrides)).eval()
        return target, drafter
    folder = resolve(drafter_src, "drafter")
    taps = drafter_config_dict(folder)["hyflash_drafter"].get("taps")
    target = load_target(target_dir, tuple(taps) if taps else None)
    return target, load_drafter(folder, target, {"window": window} if window else None)


def vocabulary_tables(target: Target, drafter: Drafter) -> list:
    """The (V, D) vocabulary tables the graphs hold, as numpy: the target's embedding and LM head (one
    table when tied), the rows of it the drafter scores, the drafter's Markov tables."""
    tensors = [target.embed.weight, target.lm_head.weight, drafter.head_weight]
    if drafter.cfg.markov_rank:
        tensors += [drafter.markov_in.weight, drafter.markov_out.weight]
    return [t.detach().float().numpy() for t in tensors]


def _hybrid(drafter: str) -> dict:
    """The drafter folder's hybrid-drafting calibration (`hyflash calibrate`), if it has one."""
    if drafter == "random":
        return {}
    path = resolve(drafter, "drafter") / "hybrid.json"
    return {"hybrid": json.loads(path.read_text())} if path.is_file() else {}


def export(cfg: ExportConfig, progress: bool = True) -> dict:
    """Run the export; returns the manifest. Raises before writing anything on bad input."""
    out = Path(cfg.out)
    if out.exists() and not cfg.force:
        raise FileExistsError(f"{out} already exists; pass --force to replace it")
    target_dir = resolve(cfg.target, "target")
    target, drafter = load_models(target_dir, cfg.drafter, cfg.window, cfg.seed)
    max_context = _max_context(cfg, target)
    specs = graph_specs(target, drafter, max_context, cfg.prefill_chunk, FLOAT_DTYPES[cfg.dtype], cfg.verify_widths)
    pte_apart = "pte" in cfg.formats and sum(p.numel() for p in target.parameters()) >= PTE_OWN_PROCESS_PARAMS

    _remove_stale_partials(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    tmp.mkdir(parents=True)
    weights = None
    try:
        if pte_apart:
            target = drafter = None  # the models are loaded again once the .pte is written
            gc.collect()
            if progress:
                print(f"export: {PTE_FILE} in a process of its own (a large target)", file=sys.stderr)
            _pte_in_own_process(cfg, target_dir, max_context, tmp / PTE_FILE)
            target, drafter = load_models(target_dir, cfg.drafter, cfg.window, cfg.seed)
        bar = tqdm(_steps(cfg, specs, pte_apart), desc="export", disable=not progress, file=sys.stderr, dynamic_ncols=True)
        graphs = {name: {"model": s.model, "inputs": [t.to_json() for t in s.inputs],
                         "outputs": [t.to_json() for t in s.outputs]} for name, s in specs.items()}
        weights = OnnxWeights(tmp / "onnx") if "onnx" in cfg.formats else None
        vocab_weight = (target.lm_head.weight.detach().float().T.contiguous().numpy()  # int4 leaves it fp32
                        if any(cfg.mode(m) == "int4" and cfg.embeddings(m) == "none" for m in ("drafter", "target"))
                        else None)  # quantized tables are MatMulNBits before the int4 pass
        tables = vocabulary_tables(target, drafter) if cfg.quantize_embeddings != "none" else []
        for label, key in bar:
            bar.set_postfix_str(label)
            if label == "drafter weights":
                save_drafter(drafter, tmp / "drafter", target_info(target), dtype=torch.float32)
                if cfg.dtype == "fp16":  # from here on the graphs are traced in fp16; the eager reference stays fp32
                    to_fp16(target), to_fp16(drafter)
            elif label.startswith("onnx "):
                graphs[key]["onnx"] = _onnx(cfg, specs[key], target, drafter, max_context, weights, tables,
                                            vocab_weight)
            else:
                _pte(cfg, list(specs.values()), target, drafter, max_context, tmp / PTE_FILE)
        if "pte" in cfg.formats:
            for s in specs.values():
                graphs[s.name]["pte"] = {"file": PTE_FILE, "method": s.name}
        if weights is not None:
            weights.close()
        generation = _talk_files(target_dir, tmp)
        files = [p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()]
        manifest = _manifest(cfg, target_dir, target, drafter, graphs, file_hashes(tmp, files), max_context)
        manifest["generation"] = generation
        write_json_atomic(tmp / "manifest.json", seal(manifest))
        replace_folder(tmp, out)
    except BaseException:
        if weights is not None:
            weights.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _max_context(cfg: ExportConfig, target: Target) -> int:
    """The export's context, checked against the target's and the prefill chunk."""
    max_context = cfg.max_context or target.cfg.default_max_context()
    target.cfg.check_context(max_context)
    if cfg.prefill_chunk > max_context - VERIFY_ROWS:
        raise ValueError(f"--prefill-chunk {cfg.prefill_chunk} does not fit the context ({max_context} rows, "
                         f"{VERIFY_ROWS} kept for a verify block); use --prefill-chunk <= {max_context - VERIFY_ROWS}")
    return max_context


def _steps(cfg: ExportConfig, specs: dict, pte_apart: bool) -> list[tuple[str, str | None]]:
    """The export's steps in order, (label, graph name or "pte"), for its progress bar."""
    steps = [("drafter weights", None)]
    if "onnx" in cfg.formats:
        steps += [(f"onnx {name}", name) for name in specs]
    if "pte" in cfg.formats and not pte_apart:
        steps += [(PTE_FILE, "pte")]
    return steps


def _onnx(cfg: ExportConfig, spec, target: Target, drafter: Drafter, max_context: int, weights, tables,
          vocab_weight) -> str:
    """One ONNX graph, its quantization passes applied: the vocabulary tables first (the drafter's int8 pass
    would take its head as a MatMul of its own), then the weights."""
    model = spec.model
    mode = cfg.mode(model)
    accuracy = TARGET_COMPUTE[cfg.target_compute] if model == "target" else None
    return export_onnx_graph(
        spec, target, drafter, max_context, weights,
        lambda p: quantize_onnx(quantize_vocab_onnx(p, cfg.embeddings(model), tables, model, accuracy), mode, model,
                                vocab_weight=vocab_weight if cfg.embeddings(model) == "none" else None,
                                accuracy=accuracy))


def _pte(cfg: ExportConfig, specs: list, target: Target, drafter: Drafter, max_context: int, path: Path) -> None:
    """One program: the drafter's view of the target's tables is the same bytes, stored once. The target
    is quantized in place: the .pte is the last use of its fp32 weights."""
    export_pte(specs, target, drafter, path, max_context, cfg.pte_kernels,
               quantize=lambda m, model: quantize_module(m, cfg.mode(model), cfg.quantize_embeddings,
                                                         in_place=model == "target"),
               fuse_quantized=cfg.quantize_embeddings != "none")


def _pte_in_own_process(cfg: ExportConfig, target_dir: Path, max_context: int, path: Path) -> None:
    """`_pte` in a fresh process (spawned: nothing of this one's heap), which loads the models itself; an
    error there is raised here."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            pool.submit(_pte_from_sources, cfg, target_dir, max_context, path, torch.get_num_threads()).result()
        except BrokenProcessPool:
            raise MemoryError(f"the process lowering {PTE_FILE} was killed (out of memory?); export --format onnx "
                              "needs less, or free memory and run again") from None


def _pte_from_sources(cfg: ExportConfig, target_dir: Path, max_context: int, path: Path, threads: int) -> None:
    torch.set_num_threads(threads)
    target, drafter = load_models(target_dir, cfg.drafter, cfg.window, cfg.seed)
    if cfg.dtype == "fp16":
        to_fp16(target), to_fp16(drafter)
    specs = graph_specs(target, drafter, max_context, cfg.prefill_chunk, FLOAT_DTYPES[cfg.dtype], cfg.verify_widths)
    _pte(cfg, list(specs.values()), target, drafter, max_context, path)


def peak_rss_bytes() -> int:
    """The largest resident set of the export: this process's or the one that lowered the .pte."""
    return max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) * 1024


def _talk_files(target_dir: Path, tmp: Path) -> dict:
    """What an app needs to talk to the model, into the export folder: the tokenizer and chat template
    files the runtime reads, as the checkpoint has them (`talk_files`), and generation_config.json (the checkpoint's, else the one
    `transformers` derives from config.json). -> the manifest's `generation` entry."""
    for name in (*talk_files(target_dir), "generation_config.json"):
        if (target_dir / name).is_file():
            shutil.copy(target_dir / name, tmp / name)
    if not (tmp / "generation_config.json").is_file():
        generation_config(target_dir).save_pretrained(str(tmp))
    chat = ((tmp / "chat_template.jinja").is_file() or (tmp / "chat_template.json").is_file()
            or "chat_template" in (json.loads((tmp / "tokenizer_config.json").read_text())
                                   if (tmp / "tokenizer_config.json").is_file() else {}))
    try:  # the target's generation_config.json, else its config.json
        eos = end_of_text_ids(target_dir)
    except ValueError:  # a model with no end-of-text id: generation stops at the token limit
        eos = []
    return {"eos_token_ids": eos, "chat_template": chat, "config": "generation_config.json"}


def _remove_stale_partials(out: Path) -> None:
    """Partial folders of exports that were killed (their process is gone) are deleted."""
    for partial in out.parent.glob(f".{out.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def target_record(target_dir: Path) -> dict:
    names = ["config.json"] + sorted({p.name for p in weight_files(target_dir).values()})
    if (target_dir / "model.safetensors.index.json").is_file():
        names.append("model.safetensors.index.json")
    return {"path": str(target_dir.resolve()), "files": {n: sha256(target_dir / n) for n in names}}


def _manifest(cfg, target_dir, target, drafter, graphs, files, max_context) -> dict:
    import onnx
    import onnxruntime

    d = drafter.cfg
    width = np.dtype(FLOAT_DTYPES[cfg.dtype]).itemsize  # bytes per cached value
    return {
        "format_version": FORMAT_VERSION,
        "graphs": graphs,
        "files": files,
        "target": {**target_record(target_dir), "config": json.loads((target_dir / "config.json").read_text()),
                   "taps": list(target.taps), "step_rows": cfg.step_rows},
        "drafter": {"name": "random" if cfg.drafter == "random" else d.name, "source": str(cfg.drafter),
                    "config": d.to_dict(), **_hybrid(cfg.drafter)},
        "block": d.block, "window": d.window_size(max_context), "max_context": max_context,
        "prefill_chunk": cfg.prefill_chunk, "verify_widths": list(cfg.verify_widths), "dtype": cfg.dtype,
        "cache": cache_spec(target, max_context, FLOAT_DTYPES[cfg.dtype], cfg.pte_kernels),
        "quantization": {"drafter": cfg.quantize, "target": cfg.quantize_target,
                         "target_compute": cfg.target_compute, "embeddings": cfg.quantize_embeddings,
                         "pte_kernels": list(QUANTIZED_EMBEDDING_KERNELS[cfg.embeddings("target")]),
                         "onnx": {"int8": "dynamic int8 (MatMulInteger)",
                                  "int4": "MatMulNBits, int4 weights in groups of 32, asymmetric; the drafter's "
                                          "accuracy_level 4 (int8 activations per row and block), the target's 0 "
                                          "(fp32 compute) or with target_compute int8 4; vocabulary projection fp32",
                                  "none": "fp32",
                                  "embeddings": "GatherBlockQuantized / MatMulNBits (accuracy_level as int4), group 32, "
                                                "symmetric"},
                         "pte": {"int8": "8da8w (torchao, XNNPACK)",
                                 "int4": "8da4w, group 32 (torchao, XNNPACK); vocabulary projection fp32",
                                 "none": "fp32",
                                 "embeddings": "quantized_decomposed embedding_byte / embedding_4bit, group 32; "
                                               "projections 8da8w / 8da4w"}},
        "memory": {"kind": d.memory, **d.context_bytes(max_context, kv_bytes=width, state_bytes=width),
                   "target_kv_bytes": 2 * target.cfg.num_layers * target.cfg.num_kv_heads * max_context
                   * target.cfg.head_dim * width},
        "versions": {"hyflash": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
                     "onnxruntime": onnxruntime.__version__, "executorch": _version("executorch"),
                     "python": platform.python_version()},
    }


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"
