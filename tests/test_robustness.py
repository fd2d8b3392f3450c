"""Every entry point refuses bad input with one line and exit 2, writes nothing, never tracebacks;
exports survive being killed; concurrent readers; property tests over prompts and manifests."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import CONTEXT
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hyflash.cli import main
from hyflash.runtime_py.loop import GenerationConfig, Runtime
from hyflash.runtime_py.manifest import load_manifest, seal


def _snapshot(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def broken_exports(both_formats, tmp_path_factory):
    """Copies of the export with a damaged manifest, one per way of damaging it."""
    root = tmp_path_factory.mktemp("broken")
    manifest = json.loads((both_formats / "manifest.json").read_text())
    edits = {
        "version": lambda m: m.update(format_version=5),
        "old-version": lambda m: m.update(format_version=1),
        "missing-key": lambda m: m.pop("graphs"),
        "outside": lambda m: m["graphs"]["draft_read"].update(onnx="../../etc/passwd"),
        "absolute": lambda m: m["files"].update({"/etc/passwd": "0" * 64}),
        "hand-edited": lambda m: m.update(max_context=10**9),  # checksum left as it was
        "not-json": None,
    }
    out = {}
    for name, edit in edits.items():
        dest = root / name
        shutil.copytree(both_formats, dest)
        if edit is None:
            (dest / "manifest.json").write_text("{oops")
        else:
            m = json.loads(json.dumps(manifest))
            edit(m)
            if name != "hand-edited":  # the checksum recomputed, as a buggy exporter would write it
                m = seal(m)
            (dest / "manifest.json").write_text(json.dumps(m))
        out[name] = dest
    return out


def _mismatched_drafter(qwen3_dir, root):
    """A drafter made for a different (wider) target."""
    from hf_models import save_hf_model

    from hyflash.models.drafter import Drafter, DrafterConfig
    from hyflash.models.loading import load_target, save_drafter, target_info

    other = root / "other-target"
    save_hf_model("llama", other)
    raw = json.loads((other / "config.json").read_text())
    target = load_target(other)
    drafter = Drafter.for_target(target, DrafterConfig.for_target(target, ssm_heads=1, markov_rank=0))
    save_drafter(drafter, root / "other-drafter", {**target_info(target), "architecture": raw["architectures"][0]})
    return root / "other-drafter"


def cases(qwen3_dir, both_formats, broken, mismatched, tmp):
    bad_utf8 = tmp / "bad.txt"
    bad_utf8.write_bytes(b"def f():\xff\xfe\n")
    long_prompt = tmp / "long.txt"
    long_prompt.write_text(" ".join(["w7"] * (CONTEXT + 10)))
    exp = ["export", "--target", str(qwen3_dir), "--out", str(tmp / "new"), "--format", "onnx"]
    gen = ["generate", str(both_formats)]
    return {
        "inspect missing": (["inspect", "--target", str(tmp / "nope")], "not a folder"),
        "inspect export folder": (["inspect", "--target", str(both_formats)], "no config.json"),
        "export missing target": (["export", "--target", str(tmp / "nope"), "--drafter", "random",
                                   "--out", str(tmp / "new")], "not a folder"),
        "export drafter not a drafter": (exp + ["--drafter", str(qwen3_dir)], "hyflash drafter"),
        "export drafter missing": (exp + ["--drafter", str(tmp / "nope")], "not a drafter folder"),
        "export drafter for another target": (exp + ["--drafter", str(mismatched)], "trained for a target"),
        "export context too long": (exp + ["--drafter", "random", "--max-context", "100000"], "max_position"),
        "export negative window": (exp + ["--drafter", "random", "--window", "-4"], "positive"),
        "export chunk past the context": (exp + ["--drafter", "random", "--max-context", "64", "--prefill-chunk", "60"],
                                          "--prefill-chunk 60 does not fit the context (64 rows"),
        "validate missing": (["validate", str(tmp / "nope")], "not a folder"),
        "validate checkpoint": (["validate", str(qwen3_dir)], "no manifest.json"),
        "validate future version": (["validate", str(broken["version"])], "format_version"),
        "generate old format": (["generate", str(broken["old-version"]), "--prompt-ids", "5"],
                                "format_version 1 is not supported (this hyflash reads 3 and 4); re-export"),
        "validate missing key": (["validate", str(broken["missing-key"])], "missing key"),
        "validate path outside": (["validate", str(broken["outside"])], "outside the export folder"),
        "validate absolute path": (["validate", str(broken["absolute"])], "not a relative path"),
        "validate bad json": (["validate", str(broken["not-json"])], "not valid JSON"),
        "generate hand-edited manifest": (["generate", str(broken["hand-edited"]), "--prompt-ids", "5"],
                                          "manifest's own checksum (manifest_sha256) does not match"),
        "generate bad manifest": (["generate", str(broken["outside"]), "--prompt-ids", "5"], "outside"),
        "generate empty prompt": (gen + ["--prompt", ""], "empty"),
        "generate prompt too long": (gen + ["--prompt-file", str(long_prompt)], "usable context"),
        "generate prompt not utf-8": (gen + ["--prompt-file", str(bad_utf8)], "UTF-8"),
        "generate prompt file missing": (gen + ["--prompt-file", str(tmp / "nope.txt")], "no such file"),
        "generate id out of vocab": (gen + ["--prompt-ids", "3,4000"], "outside the vocabulary"),
        "generate ids not ints": (gen + ["--prompt-ids", "3,x"], "integers"),
        "generate ids stray comma": (gen + ["--prompt-ids", "1,2,,3"], "an empty item (a stray comma)"),
        "generate ids trailing comma": (gen + ["--prompt-ids", "1,2,"], "an empty item (a stray comma)"),
        "generate ids negative": (gen + ["--prompt-ids", "1,-2"], "'-2'"),
        "generate ids float": (gen + ["--prompt-ids", "1,2.5"], "'2.5'"),
        "generate negative tokens": (gen + ["--prompt-ids", "3", "--max-new-tokens", "-1"], "positive"),
        "generate temperature < 0": (gen + ["--prompt-ids", "3", "--temperature", "-0.5"], "temperature"),
        "generate top-p 0": (gen + ["--prompt-ids", "3", "--top-p", "0"], "top-p"),
        "generate top-p > 1": (gen + ["--prompt-ids", "3", "--top-p", "1.5"], "top-p"),
        "generate bad backend": (gen + ["--prompt-ids", "3", "--backend", "tflite"], "invalid choice"),
        "bench missing": (["bench", str(tmp / "nope")], "not a folder"),
        "bench bad buckets": (["bench", str(both_formats), "--buckets", "a,b"], "--buckets"),
        "memory no source": (["memory"], "exactly one"),
        "memory bad artifacts": (["memory", "--artifacts", str(qwen3_dir)], "no manifest.json"),
        "train-drafter missing target": (["train-drafter", "--target", str(tmp / "nope"), "--out", str(tmp / "r")],
                                         "not a folder"),
        "train-target negative steps": (["train-target", "--out", str(tmp / "r"), "--steps", "-5"], "positive"),
        "train-drafter before corpus": (["train-drafter", "--target", str(qwen3_dir), "--data", str(tmp / "nocorpus"),
                                         "--out", str(tmp / "r")], "no such file or folder; --data takes"),
        "train-target before corpus": (["train-target", "--corpus", str(tmp / "nocorpus"), "--out", str(tmp / "r")],
                                       "make it with `hyflash corpus --out"),
    }


def test_bad_input_table(qwen3_dir, both_formats, broken_exports, tmp_path, capsys):
    mismatched = _mismatched_drafter(qwen3_dir, tmp_path / "mm")
    work = tmp_path / "work"
    work.mkdir()
    table = cases(qwen3_dir, both_formats, broken_exports, mismatched, work)
    watched = [work, both_formats, qwen3_dir]
    before = [_snapshot(w) for w in watched]
    failures = []
    for name, (argv, message) in table.items():
        try:
            code = main(argv)
        except SystemExit as e:  # argparse usage errors
            code = e.code
        err = capsys.readouterr().err.strip()
        lines = err.splitlines()
        if code != 2 or len(lines) != 1 or message not in err or "Traceback" in err:
            failures.append(f"{name}: exit {code}, stderr {err!r}")
    assert not failures, "\n".join(failures)
    assert [_snapshot(w) for w in watched] == before  # nothing written or changed anywhere


@pytest.mark.slow  # suite time: an export killed, then a whole one
def test_killed_export_leaves_nothing_that_validates_and_a_rerun_works(qwen3_dir, tmp_path):
    out = tmp_path / "export"
    args = [sys.executable, "-m", "hyflash.cli", "export", "--target", str(qwen3_dir), "--drafter", "random",
            "--out", str(out), "--format", "onnx", "--max-context", "64", "--prefill-chunk", "8"]
    rng = np.random.default_rng()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(float(rng.uniform(2.0, 12.0)))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if out.exists():  # the kill came after the final rename: then it must be complete
        load_manifest(out)
    else:
        assert main(["validate", str(out)]) == 2
    assert main(["export", *args[4:], "--force"]) == 0
    assert load_manifest(out)["format_version"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # the killed run's partial folder is gone


def test_two_processes_generate_from_one_export(both_formats):
    cmd = [sys.executable, "-m", "hyflash.cli", "generate", str(both_formats), "--prompt-ids", "5,6,7,8",
           "--max-new-tokens", "24", "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    tokens = [json.loads(o.strip().splitlines()[-1])["tokens"] for o in outs]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 24


def test_bad_input_on_executorch_is_one_line(both_formats):
    """The console's stderr, file descriptor 2 included: the libraries' load-time notices (torchao's optional
    extensions, ExecuTorch's CPU probe) do not come before the one-line error."""
    out = subprocess.run([sys.executable, "-m", "hyflash.cli", "generate", str(both_formats), "--backend",
                          "executorch", "--prompt-ids", "1,2,999999"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["hyflash generate: error: token id 999999 is outside the vocabulary "
                                               "(0..95)"], out.stderr


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(0, 95), min_size=1, max_size=60), temperature=st.sampled_from([0.0, 0.7]),
       seed=st.integers(0, 2**16))
def test_property_random_prompts(both_formats, prompt, temperature, seed):
    """Random prompts: greedy speculative == target-only; sampled runs stay within the vocabulary
    and the context; never an exception."""
    runtime = _runtime(both_formats)
    cfg = dict(max_new_tokens=16, ignore_eos=True, seed=seed)
    from hyflash.runtime_py.sampling import Sampling

    spec = [t for n in runtime.generate(prompt, GenerationConfig(sampling=Sampling(temperature), **cfg)) for t in n]
    assert all(0 <= t < 96 for t in spec) and len(prompt) + len(spec) <= CONTEXT - 8
    if temperature == 0.0:
        plain = [t for n in runtime.generate(prompt, GenerationConfig(draft="none", **cfg)) for t in n]
        assert spec == plain


_RUNTIMES = {}


def _runtime(folder):
    if folder not in _RUNTIMES:
        _RUNTIMES[folder] = Runtime(folder)
    return _RUNTIMES[folder]


JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.lists(st.sampled_from(["graphs", "files", "target", "draft_read", "onnx", "pte", "file", "inputs",
                                      "format_version", "quantization", "max_context"]), min_size=1, max_size=3),
       value=JSON)
@example(path=["graphs"], value={"": None})  # found by a CI-like fresh run: a graph that is not an object
@example(path=["graphs", "draft_read", "pte"], value=[1])
def test_property_mutated_manifests(both_formats, tmp_path_factory, path, value):
    """Any mutation of the manifest is either still valid or refused with a one-line error: never a
    traceback from deeper down."""
    folder = tmp_path_factory.mktemp("mut")
    for f in ("manifest.json",):
        shutil.copy(both_formats / f, folder / f)
    for sub in ("onnx", "drafter"):
        os.symlink(both_formats / sub, folder / sub)
    for f in ("model.pte", "tokenizer.json"):
        os.symlink(both_formats / f, folder / f)
    m = json.loads((folder / "manifest.json").read_text())
    node = m
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node[path[-1]] = value
    (folder / "manifest.json").write_text(json.dumps(seal(m)))  # past the checksum: the other checks answer
    code = main(["generate", str(folder), "--prompt-ids", "5", "--max-new-tokens", "2"])
    assert code in (0, 2)
