"""manifest.json: what an export holds and the graph contract, read by export, runtime and validate.

`docs/design.md` states the contract in prose; this module is it in code. Every loader goes
through `load_manifest`, which refuses an unknown format version, missing keys, paths that leave
the folder, and any file whose sha256 differs from the record. `Contract` reads graphs, their
I/O and the cache by name, so no caller digs a shape out of a list by index.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hyflash.models.config import read_json_object
from hyflash.models.files import sha256

FORMAT_VERSION = 4  # 2: target caches in place (per-layer ONNX past/present, .pte mutable buffers); 3: verify widths;
# 4: cache.pte.verify_attention (a .pte may verify a block in one call, exact with the project's kernels only)
READ_VERSIONS = (3, 4)  # a format 3 export's .pte attends its verify rows one by one
VERIFY_ROWS = 8  # anchor + 7 drafts: the widest verify (target_verify), and the commit width of the drafter
VERIFY_WIDTHS = (2, 4, 8)  # the verify graphs an export has by default: target_verify_{w}, target_verify for 8
DRAFTER_GRAPHS = ("draft_read", "state_commit", "window_shift")
TARGET_GRAPHS = ("target_prefill", "target_verify", "target_decode")  # every export has these
STATE_NAMES = ("win_k", "win_v", "win_pos", "ssm_state", "conv_state")  # the drafter's context, as I/O
PAST_KEY, PAST_VALUE = "past_key.{layer}", "past_value.{layer}"  # ONNX target graphs: cache inputs ...
PRESENT_KEY, PRESENT_VALUE = "present_key.{layer}", "present_value.{layer}"  # ... bound to the same buffers
PTE_FILE = "model.pte"  # the one ExecuTorch program: target and drafter methods, shared tables stored once
PTE_KERNELS = ("llama::update_cache", "llama::custom_sdpa")  # the target methods need these beyond stock XNNPACK
# how a .pte's verify blocks attend (cache.pte.verify_attention), by the build of those kernels the program is
# made exact with (export.graphs.TargetPte): one call per block, or one per row
PTE_VERIFY_ATTENTION = {"hyflash": "block", "executorch": "rows"}
# --quantize-embeddings: the program also needs ExecuTorch's quantized kernels library for these
QUANTIZED_EMBEDDING_KERNELS = {"none": (), "int8": ("quantized_decomposed::embedding_byte",),
                               "int4": ("quantized_decomposed::embedding_4bit",)}
REQUIRED = ("format_version", "graphs", "files", "target", "drafter", "block", "window", "max_context",
            "prefill_chunk", "verify_widths", "cache", "quantization", "memory", "versions")


def pte_verify_attention(cache: dict, path: Path | None = None) -> str:
    """"block" or "rows" (exports written before the field attend row by row)."""
    how = cache["pte"].get("verify_attention", "rows")
    if how not in PTE_VERIFY_ATTENTION.values():
        raise ArtifactError(f"{path}: cache.pte.verify_attention is {how!r}; expected block or rows: re-export")
    return how


def verify_graph(width: int) -> str:
    """The target graph that verifies `width` rows (the anchor and width - 1 drafts); width 1 is a decode step."""
    return "target_decode" if width == 1 else "target_verify" if width == VERIFY_ROWS else f"target_verify_{width}"


def check_widths(widths) -> tuple[int, ...]:
    """Verify widths as an export declares them: distinct, 2..VERIFY_ROWS, the full block among them."""
    if any(type(w) is not int for w in widths):
        raise ValueError(f"verify widths must be integers, got {list(widths)}")
    widths = tuple(sorted(set(widths)))
    if not widths or widths[0] < 2 or widths[-1] != VERIFY_ROWS:
        raise ValueError(f"verify widths must lie in 2..{VERIFY_ROWS} and include {VERIFY_ROWS} (the full block), "
                         f"got {list(widths)}")
    return widths


class ArtifactError(ValueError):
    """An export folder that is missing, damaged, or not what it claims."""


def cache_names(pattern_k: str, pattern_v: str, layers: int) -> list[str]:
    """['past_key.0', 'past_value.0', 'past_key.1', ...]: the ONNX cache I/O in graph order."""
    return [p.format(layer=i) for i in range(layers) for p in (pattern_k, pattern_v)]


class Contract:
    """The graphs of one export and their I/O, by name (from a manifest, or from the export's specs)."""

    def __init__(self, manifest: dict):
        self.manifest = manifest
        self.graphs = manifest["graphs"]
        self.cache = manifest["cache"]
        self.block, self.window = manifest["block"], manifest["window"]
        self.max_context, self.prefill_chunk = manifest["max_context"], manifest["prefill_chunk"]
        self.has_memory = "state_commit" in self.graphs
        self.reads_lookup = any(t["name"] == "lookup_tokens" for t in self.graphs["draft_read"]["inputs"])
        self.drafter_graphs = tuple(g for g in DRAFTER_GRAPHS if g in self.graphs)
        self.vocab = self.io("target_decode", "logits")["shape"][-1]
        self.verify_widths = check_widths(manifest["verify_widths"])  # 2..8, 8 among them
        self.target_graphs = (*TARGET_GRAPHS, *(verify_graph(w) for w in self.verify_widths if w != VERIFY_ROWS))
        # rows a single-token step runs: 1 (target_decode), or 2 where only the several-row kernels give a row
        # the bits a verify gives it (an int8-compute or fp16 target: ExportConfig.step_rows)
        self.step_rows = int(manifest["target"].get("step_rows", 1))
        self.step_graph = verify_graph(self.step_rows)

    def rows_graph(self, width: int) -> str:
        """The target graph that runs `width` real rows (an anchor and width - 1 drafts): the verify graph of
        that width; a single token, the step graph (its extra row a padding nobody reads)."""
        return self.step_graph if width == 1 else verify_graph(width)

    def graph(self, name: str) -> dict:
        return self.graphs[name]

    def io(self, graph: str, name: str) -> dict:
        """The input or output `name` of `graph`: {"name", "dtype", "shape"}."""
        g = self.graphs[graph]
        for t in (*g["inputs"], *g["outputs"]):
            if t["name"] == name:
                return t
        raise KeyError(f"graph {graph!r} has no input or output {name!r}")

    def width(self, graph: str) -> int:
        """Rows a target graph takes per call."""
        return self.io(graph, "tokens")["shape"][0]

    def onnx_cache_io(self) -> tuple[list[str], list[str]]:
        """(past names, present names) of the ONNX target graphs, layer by layer."""
        onnx = self.cache["onnx"]
        layers = self.cache["layers"]
        return (cache_names(onnx["past"][0], onnx["past"][1], layers),
                cache_names(onnx["present"][0], onnx["present"][1], layers))

    @property
    def usable_context(self) -> int:
        """The longest text (prompt + output) a run may reach: a verify block must still fit."""
        return self.max_context - VERIFY_ROWS


def inside(folder: Path, rel: str) -> Path:
    """folder/rel, refusing absolute paths and anything that resolves outside the folder."""
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute():
        raise ArtifactError(f"{folder / 'manifest.json'}: file path {rel!r} is not a relative path")
    path = (folder / rel).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise ArtifactError(f"{folder / 'manifest.json'}: file path {rel!r} points outside the export folder")
    return path


def file_hashes(folder: Path, rels: list[str]) -> dict[str, str]:
    return {rel: sha256(folder / rel) for rel in sorted(rels)}


def verify_files(folder: Path, files: dict[str, str]) -> None:
    for rel, expected in files.items():
        path = inside(folder, rel)
        if not path.is_file():
            raise ArtifactError(f"{path}: missing from the export (listed in manifest.json); re-export")
        actual = sha256(path)
        if actual != expected:
            raise ArtifactError(f"{path}: sha256 {actual[:16]}… does not match the manifest's {expected[:16]}…; "
                                "the file was changed after export: re-export")


def canonical_sha256(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON, its own checksum field left out."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _mismatch(path: Path, field: str, value, other: str, expected) -> ArtifactError:
    return ArtifactError(f"{path}: {field} is {value!r} but {other} is {expected!r}; the manifest does not "
                         "describe this export: re-export")


def declared_widths(path: Path, m: dict) -> tuple[int, ...]:
    """The export's verify widths (`check_widths`), listed sorted, each with its graph."""
    try:
        widths = check_widths(m["verify_widths"])
    except (ValueError, TypeError) as e:
        raise ArtifactError(f"{path}: verify_widths: {e}; re-export") from None
    if list(widths) != m["verify_widths"]:
        raise _mismatch(path, "verify_widths", m["verify_widths"], "sorted and distinct", list(widths))
    for w in widths:
        if verify_graph(w) not in m["graphs"]:
            raise ArtifactError(f"{path}: graph {verify_graph(w)!r} (verify width {w}) is missing; re-export")
    step = m["target"].get("step_rows", 1)
    if step != 1 and step not in widths:
        raise ArtifactError(f"{path}: target.step_rows is {step} but no verify graph has {step} rows; re-export")
    return widths


def check_consistency(path: Path, m: dict) -> None:
    """Every size the manifest states agrees with every other, and with the target and drafter configs
    it records: one line naming the field and both values for the first disagreement."""
    g, cache, target = m["graphs"], m["cache"], m["target"]["config"]

    def shape(graph: str, name: str) -> list:
        for t in (*g[graph]["inputs"], *g[graph]["outputs"]):
            if t["name"] == name:
                return t["shape"]
        raise ArtifactError(f"{path}: graph {graph!r} has no tensor {name!r}; re-export")

    def same(field: str, value, other: str, expected) -> None:
        if value != expected:
            raise _mismatch(path, field, value, other, expected)

    missing = [n for n in (*TARGET_GRAPHS, "draft_read", "window_shift") if n not in g]
    if missing:
        raise ArtifactError(f"{path}: graph {missing[0]!r} is missing; re-export")
    floats = cache.get("dtype")  # every float tensor of the export has the cache's dtype
    if floats not in ("float32", "float16"):
        raise ArtifactError(f"{path}: cache.dtype is {floats!r}; expected float32 or float16: re-export")
    for name, graph in g.items():
        for t in (*graph["inputs"], *graph["outputs"]):
            if t.get("dtype") not in (floats, "int64"):
                raise ArtifactError(f"{path}: graphs.{name} tensor {t.get('name')!r} has dtype {t.get('dtype')!r}; "
                                    f"expected {floats} or int64: re-export")
    t_max, vocab = m["max_context"], target.get("vocab_size")
    same("max_context", t_max, "cache.rows", cache["rows"])
    same("cache.onnx.shape", cache["onnx"]["shape"], "[1, kv_heads, rows, head_dim]",
         [1, cache["kv_heads"], cache["rows"], cache["head_dim"]])
    same("cache.pte.shape", cache["pte"]["shape"], "[1, rows, kv_heads, head_dim]",
         [1, cache["rows"], cache["kv_heads"], cache["head_dim"]])
    same("cache.layers", cache["layers"], "target.config.num_hidden_layers", target.get("num_hidden_layers"))
    same("block", m["block"], "drafter.config.block", m["drafter"]["config"].get("block"))
    same("block", m["block"], "draft_read.draft_tokens shape[0]", shape("draft_read", "draft_tokens")[0])
    same("block + 1", m["block"] + 1, "the verify width", VERIFY_ROWS)
    if any(t["name"] == "lookup_tokens" for t in g["draft_read"]["inputs"]):  # a lookup-input drafter
        same("draft_read.lookup_tokens shape", shape("draft_read", "lookup_tokens"), "[block]", [m["block"]])
        same("draft_read.lookup_match shape", shape("draft_read", "lookup_match"), "[1]", [1])
    same("window", m["window"], "window_shift.win_pos shape[0]", shape("window_shift", "win_pos")[0])
    same("window", m["window"], "draft_read.win_k shape[2]", shape("draft_read", "win_k")[2])
    window = m["drafter"]["config"].get("window")
    same("window", m["window"], "drafter.config.window (at max_context)",
         t_max if window == "full" else min(window, t_max) if isinstance(window, int) else window)
    same("prefill_chunk", m["prefill_chunk"], "target_prefill.tokens shape[0]", shape("target_prefill", "tokens")[0])
    for w in declared_widths(path, m):
        same(f"{verify_graph(w)}.tokens shape[0]", shape(verify_graph(w), "tokens")[0], "its verify width", w)
    same("target_decode.tokens shape[0]", shape("target_decode", "tokens")[0], "the decode width", 1)
    feature = len(m["target"]["taps"]) * target.get("hidden_size", 0)
    for name in (*TARGET_GRAPHS, *(verify_graph(w) for w in m["verify_widths"] if w != VERIFY_ROWS)):
        rows = shape(name, "tokens")[0]
        same(f"{name}.positions shape", shape(name, "positions"), "[tokens]", [rows])
        same(f"{name}.logits shape", shape(name, "logits"), "[tokens, target.config.vocab_size]", [rows, vocab])
        same(f"{name}.features shape", shape(name, "features"), "[tokens, taps x hidden_size]", [rows, feature])
    same("draft_read.draft_logits shape", shape("draft_read", "draft_logits"),
         "[block, drafter.config.draft_vocab or vocab_size]", [m["block"], m["drafter"]["config"].get("draft_vocab") or vocab])
    same("window_shift.features shape", shape("window_shift", "features"), "[8, taps x hidden_size]",
         [VERIFY_ROWS, feature])
    if m["max_context"] <= VERIFY_ROWS:
        raise ArtifactError(f"{path}: max_context {t_max} leaves no usable context (needs > {VERIFY_ROWS}); re-export")


def load_manifest(folder: str | Path) -> dict:
    folder = Path(folder)
    path = folder / "manifest.json"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a folder; pass an export folder written by `hyflash export`")
    if not path.is_file():
        raise ArtifactError(f"{folder}: no manifest.json; pass an export folder written by `hyflash export`")
    try:
        manifest = read_json_object(path)
    except ValueError as e:
        raise ArtifactError(str(e)) from None
    version = manifest.get("format_version")
    if version not in READ_VERSIONS or isinstance(version, bool):
        raise ArtifactError(f"{path}: format_version {version!r} is not supported (this hyflash reads 3 and 4); "
                            "re-export it with this version of hyflash")
    if manifest.get("manifest_sha256") != canonical_sha256(manifest):
        raise ArtifactError(f"{path}: the manifest's own checksum (manifest_sha256) does not match its contents; "
                            "it was edited after export: re-export")
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise ArtifactError(f"{path}: missing key {missing[0]!r}; re-export")
    if not isinstance(manifest["files"], dict) or not isinstance(manifest["graphs"], dict):
        raise ArtifactError(f"{path}: 'files' and 'graphs' must be objects; re-export")
    listed = set(manifest["files"])
    for name, graph in manifest["graphs"].items():
        if not isinstance(graph, dict) or not isinstance(graph.get("pte") or {}, dict):
            raise ArtifactError(f"{path}: graph {name!r} must be an object (its 'pte' too); re-export")
        refs = [graph.get("onnx")] + [(graph.get("pte") or {}).get("file")]
        for rel in filter(None, refs):
            inside(folder, rel)
            if rel not in listed:
                raise ArtifactError(f"{path}: graph {name!r} uses {rel!r}, which has no checksum; re-export")
    try:
        check_consistency(path, manifest)
        pte_verify_attention(manifest["cache"], path)
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise ArtifactError(f"{path}: malformed entry ({type(e).__name__}: {e}); re-export") from None
    verify_files(folder, manifest["files"])
    return manifest


def seal(manifest: dict) -> dict:
    """The manifest with its own checksum (written by the exporter, checked by every loader)."""
    return {**manifest, "manifest_sha256": canonical_sha256(manifest)}


