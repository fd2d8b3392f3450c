"""Files every layer writes and checks: sha256 of a file, JSON written whole or not at all."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json_atomic(path: Path, data: dict) -> None:
    """Write to a sibling, then rename: a reader sees the old file or the new one, never half."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def replace_folder(tmp: Path, dest: Path) -> None:
    """`tmp` (complete) takes `dest`'s place: renames only, so `dest` is never half written."""
    if dest.exists():
        old = dest.parent / f".{dest.name}.old-{os.getpid()}"
        dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(dest)


@contextlib.contextmanager
def building(dest: Path) -> Iterator[Path]:
    """A scratch sibling of `dest` to fill; on success it takes `dest`'s place in one rename, on any
    error it is removed: `dest` is whole or untouched."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        replace_folder(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def jsonl_objects(path: Path) -> Iterator[tuple[int, object]]:
    """(line number, parsed value) of each non-blank line; a line that is not JSON: ValueError naming it."""
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
