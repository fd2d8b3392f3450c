"""The interpreter's standard library as text: the corpus every machine has (the reference pair's training
data, the default prompts of `bench`, the chat data's code and passage tasks).

The split is by file, on a stable hash of the path relative to the stdlib root, so every machine with
the same Python puts the same files on the same side.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

HELDOUT_PERCENT = 5
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel_path: str) -> bool:
    digest = hashlib.sha256(rel_path.encode()).digest()
    return int.from_bytes(digest[:4], "little") % 100 < HELDOUT_PERCENT


def stdlib_files(root: Path | None = None) -> list[str]:
    """Relative paths of the stdlib's .py files, tests excluded, sorted."""
    root = root or stdlib_root()
    out = []
    for f in root.rglob("*.py"):
        rel = f.relative_to(root)
        if not SKIP_DIRS.intersection(rel.parts[:-1]):
            out.append(rel.as_posix())
    return sorted(out)
