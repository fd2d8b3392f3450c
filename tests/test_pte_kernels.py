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


def test_executorch_kernels_multiply_with_executorchs_blas(rows_pte):
    """ExecuTorch's custom_sdpa calls an external sgemm_: an app linking its LLM kernels gets ExecuTorch's BLAS
    (libexecutorch_kernels_optimized.so), and so does the Python runtime with --pte-kernels executorch (not the
    MKL in libtorch_cpu, whose last bits moved 13 of 13 greedy answers on SmolLM2's int4 .pte)."""
    got = _run_in_a_new_process(SGEMM_FROM.format(kernels="executorch", folder=str(rows_pte)))
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


def test_the_choice_is_named_in_the_json(rows_pte, capsys):
    args = ["generate", rows_pte, "--prompt-ids", "3,4,5", "--max-new-tokens", "4", "--backend", "executorch",
            "--threads", "1", "--json"]
    assert main([*map(str, args), "--pte-kernels", "hyflash"]) == 0  # this process's choice, as in every test
    reports = [json.loads(capsys.readouterr().out.splitlines()[-1])]
    out = hyflash(*args, "--pte-kernels", "executorch")  # its own process: a loaded library stays registered
    assert out.returncode == 0, out.stderr
    reports.append(json.loads(out.stdout.splitlines()[-1]))
    assert [(r["pte_kernels"], r["threads"]) for r in reports] == [("hyflash", 1), ("executorch", 1)]


VERIFY_ROWS_ARE_STEPS = """
import json
import numpy as np
from hyflash.runtime_py import ptekernels
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
from hyflash.runtime_py.manifest import pte_verify_attention

ptekernels.choose({kernels!r})
runtime, rng, pos, worst = Runtime({folder!r}, "executorch"), np.random.default_rng(0), 40, 0.0
runtime.prefill(rng.integers(3, runtime.vocab, pos).tolist(), False, Stats())
for b in range(4):  # each verify row against the decode step at its position
    block = rng.integers(3, runtime.vocab, 8).tolist()
    verify = runtime.run_target("target_verify", block, pos)[0].copy()
    for i, token in enumerate(block):
        decode = runtime.run_target("target_decode", [token], pos + i)[0][0]
        worst = max(worst, float(np.abs(decode - verify[i]).max()))
        runtime.commit_rows([token], pos + i)
    pos += 8
runtime = Runtime({folder!r}, "executorch")
tokens = {{d: [t for new in runtime.generate([3, 4, 5, 3, 4], GenerationConfig(max_new_tokens=24, ignore_eos=True, draft=d))
              for t in new] for d in ("model", "prompt-lookup", "none")}}
print(json.dumps({{"attention": pte_verify_attention(runtime.manifest["cache"]), "kernels": runtime.backend.kernels,
                  "worst": worst, "exact": tokens["model"] == tokens["none"] == tokens["prompt-lookup"]}}))
"""


@pytest.mark.parametrize("program, kernels, attention", [("both_formats", "hyflash", "block"),
                                                         ("rows_pte", "executorch", "rows"),
                                                         ("rows_pte", "hyflash", "rows")])
def test_verify_rows_are_decode_steps(request, runner, program, kernels, attention):
    """The default program (--pte-kernels hyflash) verifies a block in one custom_sdpa call, the other row by
    row; with the kernels each is made for (and the row by row one with either build) every verify row is the
    decode step at its position, bit for bit, and drafted output is target-only's."""
    got = _run_in_a_new_process(VERIFY_ROWS_ARE_STEPS.format(kernels=kernels, folder=str(request.getfixturevalue(program))))
    assert got == {"attention": attention, "kernels": kernels, "worst": 0.0, "exact": True}


def test_a_block_program_refuses_executorchs_kernels(both_formats, tmp_path):
    """ExecuTorch's kernel rounds a row of a block unlike the row alone: a program that verifies in one call is
    refused with ExecuTorch's kernels (one line naming both fixes), and an fp16 program (which runs ExecuTorch's
    kernels) cannot be made for the project's."""
    out = hyflash("generate", both_formats, "--prompt-ids", "3,4,5", "--max-new-tokens", "4", "--backend", "executorch",
                  "--pte-kernels", "executorch")
    assert out.returncode == 2 and out.stdout == "", out.stderr
    err = out.stderr.strip().splitlines()[-1]
    assert "--pte-kernels hyflash" in err and "re-export with --pte-kernels executorch" in err
    out = hyflash("export", "--target", "reference", "--drafter", "random", "--out", tmp_path / "x", "--format", "pte",
                  "--dtype", "fp16", "--pte-kernels", "hyflash")
    assert out.returncode == 2 and "float32 programs" in out.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "x").exists()


def test_a_runner_refuses_the_kernels_it_was_not_built_with(runner, both_formats):
    code, _, err = run(runner, both_formats, [3, 4], "--pte-kernels", "executorch")
    assert code == 2 and "HYFLASH_KERNELS=OFF" in err.splitlines()[0]


@pytest.mark.slow  # suite time: a second build of the runner
def test_a_runner_built_without_the_kernels_names_what_it_lacks(runner, both_formats, rows_pte, tmp_path):
    """hyflash-run built with HYFLASH_KERNELS=OFF (for apps linking ExecuTorch's LLM kernels instead) refuses a
    program that verifies a block in one call before opening it, and, with nothing linked that registers the
    cache kernels, says so rather than blaming the export."""
    import executorch

    build = tmp_path / "off"
    subprocess.run(["cmake", "-S", ROOT / "runtime_cpp", "-B", build, f"-DEXECUTORCH_ROOT={executorch.__path__[0]}",
                    "-DHYFLASH_KERNELS=OFF"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", build, "-j2", "--target", "hyflash-run"], check=True, capture_output=True)
    off = build / "hyflash-run"
    assert "libhyflash_kernels" not in subprocess.run(["ldd", off], capture_output=True, text=True).stdout
    code, runs, err = run(off, both_formats, [3, 4], "--pte-kernels", "executorch")
    assert code == 2 and runs == [] and len(err.strip().splitlines()) == 1, err
    assert "verify blocks attend in one call" in err and "HYFLASH_KERNELS=ON" in err and "--pte-kernels executorch" in err
    code, runs, err = run(off, rows_pte, [3, 4], "--pte-kernels", "executorch")
    line = err.strip().splitlines()[-1]
    assert code == 2 and runs == [] and line.startswith("hyflash-run: error:"), err
    assert "not registered" in line and "built with HYFLASH_KERNELS=OFF" in line and "re-export" not in line


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


# a one-op program of the project's custom_sdpa: program(rows, heads, kv_heads, d, t) -> its loaded method
ATTEND_OP = """
import json
import sys
import numpy as np
import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (torch.ops.llama.custom_sdpa)

from hyflash.runtime_py import ptekernels

ptekernels.load()
ptekernels.set_threads(2)
from executorch.runtime import Runtime


class Attend(torch.nn.Module):
    def forward(self, q, k, v, start):
        s = start.item()
        torch._check_is_size(s)
        torch._check(s + q.shape[1] <= k.shape[1])
        return torch.ops.llama.custom_sdpa(q, k, v, s, None, 0, True)


programs = []


def program(rows, heads, kv_heads, d, t):
    args = (torch.zeros(1, rows, heads, d), torch.zeros(1, t, kv_heads, d), torch.zeros(1, t, kv_heads, d),
            torch.tensor(0))
    buffer = to_edge_transform_and_lower(torch.export.export(Attend(), args)).to_executorch().buffer
    programs.append(Runtime.get().load_program(buffer))  # a method needs its program alive
    return programs[-1].load_method("forward")
"""

ATTEND = ATTEND_OP + """

def reference(q, k, v, start):  # float64, row i over keys 0..start+i
    q, k, v = (torch.from_numpy(x).double() for x in (q, k, v))
    group, out = q.shape[2] // k.shape[2], torch.empty(q.shape, dtype=torch.float64)
    for i in range(q.shape[1]):
        keys = start + i + 1
        kk, vv = (x[0, :keys].repeat_interleave(group, 1) for x in (k, v))  # (keys, heads, d)
        w = torch.softmax(torch.einsum("hd,khd->hk", q[0, i], kk) / q.shape[-1] ** 0.5, -1)
        out[0, i] = torch.einsum("hk,khd->hd", w, vv)
    return out.numpy()


rng, t, found = np.random.default_rng(0), 77, []
for heads, kv_heads, d in {shapes}:
    block, row = program(8, heads, kv_heads, d, t), program(1, heads, kv_heads, d, t)
    k, v = (rng.standard_normal((1, t, kv_heads, d)).astype(np.float32) for _ in range(2))
    for start, spread in ((0, 1.0), (37, 3.0), (69, 6.0)):  # the last block ends at key 77: not a multiple of 8
        q = (spread * rng.standard_normal((1, 8, heads, d))).astype(np.float32)
        got = block.execute([torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), torch.tensor(start)])[0].numpy()
        rows = np.concatenate([row.execute([torch.from_numpy(q[:, i:i + 1]), torch.from_numpy(k), torch.from_numpy(v),
                                            torch.tensor(start + i)])[0].numpy() for i in range(8)], axis=1)
        found.append({{"shape": [heads, kv_heads, d], "start": start, "rows_equal": bool(np.array_equal(got, rows)),
                      "error": float(np.abs(got - reference(q, k, v, start)).max())}})
print(json.dumps(found))
"""


def test_custom_sdpa_rows_are_one_row_calls_and_attention(runner):
    """The project's custom_sdpa on its own, in a one-op program: each row of an 8-row call is bit for bit the
    one-row call at that row's position (one arithmetic per query, whatever the call's size), and both are
    attention within 2e-6 of float64. Shapes: SmolLM2's (9 query heads over 3 KV heads, head size 64), head
    size 128, a head size the vector path sums in blocks (40) and one it cannot take (20); causal ends that
    are and are not multiples of 8; scores of standard deviation 1 to 6. The build before this one passed neither
    check (its blocks summed in another order; its error reached 4.5e-6)."""
    shapes = [(9, 3, 64), (4, 2, 128), (4, 4, 40), (2, 1, 20)]
    out = subprocess.run([sys.executable, "-c", ATTEND.format(shapes=shapes)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.splitlines()[-1])
    assert len(found) == 3 * len(shapes)
    for case in found:
        assert case["rows_equal"] and case["error"] <= 2e-6, case


OUTPUTS = ATTEND_OP + """
rng, t, found = np.random.default_rng(1), 150, []
for heads, kv_heads, d in {shapes}:
    for rows in (1, 2, 8):
        method = program(rows, heads, kv_heads, d, t)
        k, v = (torch.from_numpy(rng.standard_normal((1, t, kv_heads, d)).astype(np.float32)) for _ in range(2))
        for start in (0, 61, t - rows):
            q = torch.from_numpy((3 * rng.standard_normal((1, rows, heads, d))).astype(np.float32))
            found.append(method.execute([q, k, v, torch.tensor(start)])[0].numpy().copy())
np.savez(sys.argv[1], *found)
"""


@pytest.mark.skipif(not (sys.platform == "linux" and os.uname().machine == "x86_64"), reason="x86-64 builds")
def test_custom_sdpa_bits_do_not_depend_on_the_isa_or_the_bunching(runner, tmp_path):
    """The kernels library picks its machine code when it loads (AVX-512 with a row's query heads three at a
    time, AVX2 one at a time, ...). A second build fixed to AVX2 + FMA and one query at a time gives the very bits
    of the library the runner links, at SmolLM2's shapes, a head size of 128 and one of 40, 1 to 8 rows: so an
    export answers the same on either kind of x86-64 machine. (Where this CPU lacks AVX-512 both run AVX2.)"""
    import executorch
    import numpy as np

    flags = Path("/proc/cpuinfo").read_text()
    if not all(f" {flag}" in flags for flag in ("avx2", "fma")):
        pytest.skip("this CPU has no AVX2 + FMA")
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(ROOT / "runtime_cpp"), "-B", str(build),
                    f"-DEXECUTORCH_ROOT={list(executorch.__path__)[0]}", "-DHYFLASH_ARCH=x86-64-v3",
                    "-DCMAKE_CXX_FLAGS=-DHYFLASH_NO_CLONES -DHYFLASH_BUNCH=1"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "hyflash_kernels", "-j2"], check=True,
                   capture_output=True)
    script = OUTPUTS.format(shapes=[(9, 3, 64), (4, 2, 128), (4, 4, 40)])
    found = {}
    for name, library in (("linked", LIBRARY), ("avx2", build / "libhyflash_kernels.so")):
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path / f"{name}.npz")], capture_output=True,
                             text=True, env={**os.environ, "HYFLASH_KERNELS_LIB": str(library)})
        assert out.returncode == 0, out.stderr[-2000:]
        found[name] = np.load(tmp_path / f"{name}.npz")
    assert len(found["linked"].files) == 27
    for key in found["linked"].files:
        assert np.array_equal(found["linked"][key], found["avx2"][key]), key
