"""Which build of the target's cache kernels (llama::update_cache, llama::custom_sdpa) the Python runtime's
ExecuTorch programs run, so that desktop runs what the native runner runs (docs/design.md, "one export,
one answer").

- "hyflash" (the default): `libhyflash_kernels.so`, built by `make runner` from runtime_cpp/src/kernels.cc,
  the very library `hyflash-run` links. It registers the kernels for float32 contiguous tensors under a
  specialized kernel key, which a method prefers over the fallback that ExecuTorch's own build registers, so
  both can be loaded in one process (every in-process export loads ExecuTorch's). float16 programs, which
  the library does not cover, still run ExecuTorch's.
- "executorch": ExecuTorch's own build (the wheel's custom_ops library), as an app that links ExecuTorch's
  LLM kernels runs them (the Android AAR, the iOS kernels_llm product; `hyflash-run` built with
  HYFLASH_KERNELS=OFF).

The choice is per process: a loaded library stays registered until the process ends, so once the project's
kernels are loaded the other choice needs a new process.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

CHOICES = ("hyflash", "executorch")
LIBRARY = "libhyflash_kernels.so"
STAMP = re.compile(rb"hyflash-kernels executorch=([^\x00]+)\x00")

BUILD = Path(__file__).resolve().parent.parent / "build" / "runtime_cpp"  # where `make runner` builds

_choice = "hyflash"
_loaded: Path | None = None


def choose(kind: str) -> None:
    """Set the process's choice (the CLI's --pte-kernels)."""
    global _choice
    if kind not in CHOICES:
        raise ValueError(f"--pte-kernels must be one of {', '.join(CHOICES)}, got {kind!r}")
    if kind == "executorch" and _loaded is not None:
        raise ValueError("this process already loaded the project's kernels (they stay registered); run "
                         "--pte-kernels executorch in a new process")
    _choice = kind


def chosen() -> str:
    return _choice


def library_path() -> Path:
    """$HYFLASH_KERNELS_LIB, else the one `make runner` builds in this checkout."""
    if os.environ.get("HYFLASH_KERNELS_LIB"):
        return Path(os.environ["HYFLASH_KERNELS_LIB"])
    return BUILD / LIBRARY


def executorch_version() -> str:
    from executorch.version import __version__

    return __version__


def stamp(path: Path) -> str | None:
    """The ExecuTorch version the library was built against, read from the file (not loaded)."""
    found = STAMP.search(path.read_bytes())
    return found.group(1).decode() if found else None


def load() -> Path:
    """Load the project's kernels into this process once (they register themselves). One-line errors: no
    library, one built for another ExecuTorch, a second library at another path (it would register the
    same kernels twice, which aborts the process)."""
    global _loaded
    path = library_path()
    if _loaded is not None:
        if path.resolve() != _loaded:
            raise ValueError(f"{path}: this process already loaded the project's kernels from {_loaded}; one "
                             "library per process")
        return _loaded
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the project's ExecuTorch kernels are not built; run `make runner` (or "
                                "set HYFLASH_KERNELS_LIB, or pass --pte-kernels executorch)")
    built_for, have = stamp(path), executorch_version()
    if built_for != have:
        raise ValueError(f"{path} was built for ExecuTorch {built_for or '(no stamp)'}, this environment has "
                         f"{have}; rebuild it with `make runner`")
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    _loaded = path.resolve()
    return _loaded


def set_threads(threads: int | None) -> int:
    """ExecuTorch's thread pool (XNNPACK's and the kernels' parallel_for; one per process) at `threads` threads,
    or as it is; returns its size."""
    from executorch.extension.pybindings.portable_lib import _threadpool_get_thread_count, _unsafe_reset_threadpool

    if threads:
        _unsafe_reset_threadpool(threads)
    return int(_threadpool_get_thread_count())
