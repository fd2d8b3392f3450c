"""One export, one answer: the Python runtime's ExecuTorch programs run the cache kernels hyflash-run links
(libhyflash_kernels.so), so the two give the same tokens also on quantized targets, where the last bits of
two builds of those kernels move argmaxes; the library coexists with ExecuTorch's own in one process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_runner_cpp import _same_as_python, run
from tokenizers import Tokenizer

from hyflash.cli import main
from hyflash.runtime_py import ptekernels
from hyflash.runtime_py.bench import BenchConfig, make_prompts, source_texts
from hyflash.runtime_py.loop import Runtime

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "build" / "runtime_cpp" / "libhyflash_kernels.so"


def hyflash(*args, env=None):
    return subprocess.run([sys.executable, "-m", "hyflash.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_library_is_stamped_and_needs_no_libtorch(runner):
    assert ptekernels.library_path() == LIBRARY and LIBRARY.is_file()  # built by `make runner`: missing fails
    assert ptekernels.stamp(LIBRARY) == ptekernels.executorch_version()
    for binary in (runner, LIBRARY):
        linked = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
        assert "libtorch" not in linked and "libc10" not in linked and "libpython" not in linked, linked
    assert "libhyflash_kernels.so" in subprocess.run(["ldd", str(runner)], capture_output=True, text=True).stdout


def test_python_runtime_runs_the_runners_kernels(runner, both_formats):
    runtime = Runtime(both_formats, "executorch")
    assert runtime.backend.kernels == "hyflash"
    code, (c,), err = run(runner, both_formats, [3, 4, 5], "--max-new-tokens", "4", "--threads", "1")
    assert code == 0 and c["pte_kernels"] == "hyflash" and c["threads"] == 1, err


def _run_in_a_new_process(script: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]  # an abort (a kernel registered twice) ends it non-zero
    return json.loads(out.stdout.splitlines()[-1])


GENERATE = """
runtime = Runtime({folder!r}, "executorch")
tokens = [t for new in runtime.generate([3, 4, 5], GenerationConfig(max_new_tokens=6, ignore_eos=True)) for t in new]
print(json.dumps({{"kernels": runtime.backend.kernels, "tokens": tokens}}))
"""


def test_both_builds_coexist_in_one_process(both_formats, runner):
    """ExecuTorch's build loaded first (as every in-process export loads it), then the project's: no abort, and
    the program runs the project's (the runner's tokens)."""
    got = _run_in_a_new_process("import json\nfrom executorch.extension.llm.custom_ops import custom_ops\n"
                                "from hyflash.runtime_py.loop import GenerationConfig, Runtime\n"
                                + GENERATE.format(folder=str(both_formats)))
    assert got["kernels"] == "hyflash"
    code, (c,), err = run(runner, both_formats, [3, 4, 5], "--max-new-tokens", "6", "--ignore-eos")
    assert code == 0 and c["tokens"] == got["tokens"], err


SGEMM_FROM = """
import ctypes, json
from hyflash.runtime_py import ptekernels
from hyflash.runtime_py.loop import Runtime
ptekernels.choose({kernels!r})
runtime = Runtime({folder!r}, "executorch")

class Info(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]
dl = ctypes.CDLL(None)
dl.dlsym.restype, dl.dlsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
info = Info()
dl.dladdr(ctypes.c_void_p(dl.dlsym(None, b"sgemm_")), ctypes.byref(info))
print(json.dumps({{"kernels": runtime.backend.kernels, "sgemm": info.fname.decode()}}))
"""


def test_executorch_kernels_multiply_with_executorchs_blas(both_formats):
    """ExecuTorch's custom_sdpa calls an external sgemm_: an app linking its LLM kernels gets ExecuTorch's BLAS
    (libexecutorch_kernels_optimized.so), and so does the Python runtime with --pte-kernels executorch (not the
    MKL in libtorch_cpu, whose last bits moved 13 of 13 greedy answers on SmolLM2's int4 .pte)."""
    got = _run_in_a_new_process(SGEMM_FROM.format(kernels="executorch", folder=str(both_formats)))
    assert got["kernels"] == "executorch" and got["sgemm"].endswith("libexecutorch_kernels_optimized.so"), got


@pytest.mark.slow  # lowering a program to .pte takes minutes
def test_export_then_run_in_one_process(qwen3_dir, tmp_path, runner):
    """Lowering loads ExecuTorch's build of the kernels; running then loads the project's: both registered in
    one process (the project's under a specialized key), no abort, and the program runs the project's."""
    got = _run_in_a_new_process(f"""
import json
from hyflash.cli import main
from hyflash.runtime_py.loop import GenerationConfig, Runtime
assert main(["export", "--target", {str(qwen3_dir)!r}, "--drafter", "random", "--out", {str(tmp_path / "x")!r},
             "--format", "pte", "--max-context", "96", "--prefill-chunk", "16", "--window", "24"]) == 0
""" + GENERATE.format(folder=str(tmp_path / "x")))
    assert got["kernels"] == "hyflash" and len(got["tokens"]) == 6
    code, (c,), err = run(runner, tmp_path / "x", [3, 4, 5], "--max-new-tokens", "6", "--ignore-eos")
    assert code == 0 and c["tokens"] == got["tokens"], err


def test_the_choice_is_named_in_the_json(both_formats, capsys):
    args = ["generate", both_formats, "--prompt-ids", "3,4,5", "--max-new-tokens", "4", "--backend", "executorch",
            "--threads", "1", "--json"]
    assert main([*map(str, args), "--pte-kernels", "hyflash"]) == 0  # this process's choice, as in every test
    reports = [json.loads(capsys.readouterr().out.splitlines()[-1])]
    out = hyflash(*args, "--pte-kernels", "executorch")  # its own process: a loaded library stays registered
    assert out.returncode == 0, out.stderr
    reports.append(json.loads(out.stdout.splitlines()[-1]))
    assert [(r["pte_kernels"], r["threads"]) for r in reports] == [("hyflash", 1), ("executorch", 1)]


def test_a_runner_refuses_the_kernels_it_was_not_built_with(runner, both_formats):
    code, _, err = run(runner, both_formats, [3, 4], "--pte-kernels", "executorch")
    assert code == 2 and "HYFLASH_KERNELS=OFF" in err.splitlines()[0]


def _stamped(tmp_path, version: bytes) -> Path:
    data = LIBRARY.read_bytes()
    found = ptekernels.STAMP.search(data)
    fake = found.group(0).replace(found.group(1), version.ljust(len(found.group(1)), b"x"))
    path = tmp_path / "libhyflash_kernels.so"
    path.write_bytes(data.replace(found.group(0), fake))
    return path


@pytest.mark.parametrize("case", [pytest.param("missing", marks=pytest.mark.slow), "other executorch"])  # suite time
def test_a_missing_or_stale_library_is_refused_in_one_line(both_formats, tmp_path, case):
    lib = tmp_path / "nowhere.so" if case == "missing" else _stamped(tmp_path, b"0.1")
    out = hyflash("generate", both_formats, "--prompt-ids", "3,4", "--backend", "executorch",
                  env={"HYFLASH_KERNELS_LIB": str(lib)})
    assert out.returncode == 2 and out.stdout == ""
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("hyflash generate: error:") and "make runner" in line, out.stderr
    assert ("not built" if case == "missing" else "built for ExecuTorch 0.1") in line


@pytest.mark.slow  # the reference target's 8da4w .pte takes minutes to lower
def test_quantized_pair_equals_the_python_runtime(runner, reference_int4_pte):
    """Where two builds of the cache kernels parted (int4 target: each row's activations quantized to int8
    before every linear layer), one build gives one answer: held-out prompts, with and without the drafter."""
    cfg = BenchConfig((reference_int4_pte,), buckets=(256, 1024, 2001), prompts_per_bucket=2, max_new_tokens=48)
    tokenizer = Tokenizer.from_file(str(reference_int4_pte / "tokenizer.json"))
    prompts = [p for group in make_prompts(tokenizer, source_texts(None), cfg, 2048).values() for p in group]
    runtime = _same_as_python(runner, reference_int4_pte, prompts, 48)
    assert runtime.backend.kernels == "hyflash"
