"""The embedded reference models, addressable by name wherever a folder is taken.

`--target reference`; `--drafter reference` (HyFlash), `reference-swa`, `reference-full`,
`reference-gdn`. They ship as package data next to this file.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
NAMES = {
    "target": {"reference": "target"},
    "drafter": {"reference": "drafter-hyflash", "reference-swa": "drafter-swa",
                "reference-full": "drafter-full", "reference-gdn": "drafter-gdn"},
}


def resolve(path_or_name: str | Path, kind: str) -> Path:
    """A folder path, or the embedded model of that name (`kind` is "target" or "drafter")."""
    name = str(path_or_name)
    if name in NAMES[kind]:
        folder = HERE / NAMES[kind][name]
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"the embedded model {name!r} is not in this installation ({folder})")
        return folder
    return Path(path_or_name)
