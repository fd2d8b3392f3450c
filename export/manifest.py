"""manifest.json (DESIGN §4): what an export holds, checked before anything is used.

Every loader goes through `load_manifest`, which refuses an unknown format version, missing
keys, paths that leave the folder, and any file whose sha256 differs from the record.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..models.config import read_json_object

FORMAT_VERSION = 1
REQUIRED = ("format_version", "graphs", "files", "target", "drafter", "block", "window", "max_context",
            "prefill_chunk", "quantization", "memory", "versions")


class ArtifactError(ValueError):
    """An export folder that is missing, damaged, or not what it claims."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{path}: format_version {version!r} is not supported (this hyflash reads "
                            f"{FORMAT_VERSION}); re-export with this version")
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
    verify_files(folder, manifest["files"])
    return manifest


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
