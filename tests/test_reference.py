"""The embedded reference pair, exported as a user would: greedy output is the target's on both
backends, the text is Python, and a long run to the usable context stays exact."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from hyflash.demo import PROMPT
from hyflash.models.loading import resolve
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats

DEMO = [sys.executable, "-m", "hyflash.cli", "demo", "--pair", "reference", "--json"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """`hyflash demo --json` on a fresh cache: it exports the reference pair (ONNX), validates it,
    generates; its export is the one the other tests use."""
    cache = tmp_path_factory.mktemp("cache")
    out = subprocess.run(DEMO, capture_output=True, text=True,
                         env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    assert out.returncode == 0, out.stderr[-2000:]
    return cache, json.loads(out.stdout), out.stderr


@pytest.fixture(scope="module")
def reference_export(demo_run):
    return Path(demo_run[1]["export"])


def test_demo_exports_once_then_reuses(demo_run):
    cache, first, stderr = demo_run
    assert "exporting the reference pair" in stderr and PROMPT in stderr  # streamed to stderr under --json
    for key in ("tokens", "text", "rounds", "acceptance_length", "accepted_per_slot", "tokens_per_s", "graph_ms",
                "drafter_context_bytes", "speedup"):
        assert key in first
    # a calibrated embedded drafter adds hybrid drafting's figures (its tokens checked equal by the demo)
    assert ("hybrid" in first) == (resolve("reference", "drafter") / "hybrid.json").is_file()
    if "hybrid" in first:
        h = first["hybrid"]
        assert 1.0 <= h["acceptance_length"] <= 8.0 and h["speedup"] > 0 and 0 <= h["lookup_rounds"] <= h["rounds"]
    # prompt-lookup, the baseline a user would pick instead, beside the drafter (its tokens checked equal too)
    assert 1.0 <= first["prompt-lookup"]["acceptance_length"] <= 8.0 and first["prompt-lookup"]["rounds"] > 0
    manifest = Path(first["export"]) / "manifest.json"
    written = manifest.stat().st_mtime_ns
    again = subprocess.run(DEMO, capture_output=True, text=True,
                           env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    assert again.returncode == 0 and "exporting" not in again.stderr
    assert manifest.stat().st_mtime_ns == written  # reused, not rewritten
    second = json.loads(again.stdout)
    assert second["tokens"] == first["tokens"] and second["export"] == first["export"]
    assert [p.name for p in (cache / "hyflash").iterdir()] == [Path(first["export"]).name]


@pytest.fixture(scope="module")
def prompt(reference_export):
    return Tokenizer.from_file(str(reference_export / "tokenizer.json")).encode(PROMPT).ids


def _greedy_equals_target_only(folder, prompt, backend):
    runtime = Runtime(folder, backend)
    spec, base = Stats(), Stats()
    list(runtime.generate(prompt, GenerationConfig(max_new_tokens=48, ignore_eos=True), spec))
    list(runtime.generate(prompt, GenerationConfig(max_new_tokens=48, ignore_eos=True, draft="none"), base))
    assert spec.tokens == base.tokens and len(spec.tokens) == 48
    assert spec.acceptance_length > 1.5  # the trained drafter really drafts (a random one gives ~1.0)


def test_trained_drafter_greedy_equals_target_only_onnxruntime(reference_export, prompt):
    _greedy_equals_target_only(reference_export, prompt, "onnxruntime")


@pytest.mark.slow  # the reference target's .pte takes minutes to lower
def test_trained_drafter_greedy_equals_target_only_executorch(reference_pte, prompt):
    _greedy_equals_target_only(reference_pte, prompt, "executorch")


@pytest.mark.slow  # suite time: a generation to the end of the context
def test_long_run_to_the_usable_context(reference_export):
    # its own process: peak RSS is per process, and this one has exported models before
    out = subprocess.run([sys.executable, "-m", "hyflash.longrun", str(reference_export), "--json"],
                         capture_output=True, text=True)
    r = json.loads(out.stdout)
    assert out.returncode == 0, out.stderr[-2000:]
    assert r["final_context"] == r["usable_context"] >= 2048
    assert r["identical_to_target_only"], f"first difference at generated token {r['first_difference']}"
    assert r["nonfinite_buffers"] == []
    assert r["rounds_checked"] >= r["rounds"]  # the drafter context was checked after every round
    assert r["peak_rss_growth"] <= r["target_kv_bytes"] + 16 * 2**20  # the cache's pages, and little else


def test_walked_tau_counts_the_loops_rounds(reference_export, prompt, monkeypatch):
    """Training's walked held-out tau counts what the loop counts: on the target's own greedy continuation,
    the teacher-forced acceptance lengths walked round by round are the loop's rounds, one for one (the mean
    over every anchor, what `tau` estimates, is higher)."""
    import numpy as np

    from hyflash.models.loading import load_drafter, load_target
    from hyflash.train.batches import Rows
    from hyflash.train.drafter import Distill, acceptance_lengths, walk

    stats, n = Stats(), 96
    list(Runtime(reference_export, "eager").generate(prompt, GenerationConfig(max_new_tokens=n + 16, ignore_eos=True),
                                                     stats))
    s = len(prompt)
    tokens = np.array([prompt + stats.tokens[:n]], np.int64)
    anchorable = np.zeros(tokens.shape, bool)
    anchorable[0, s - 1:s + n - 7] = True  # the next 7 tokens are the target's: prompt's last token .. n - 8
    target = load_target(resolve("reference", "target"))
    drafter = load_drafter(resolve("reference", "drafter"), target).eval()
    (length,) = acceptance_lengths(Distill(drafter, target, anchors=48), Rows(tokens, anchorable))
    assert (length[s - 1:s + n - 7] >= 1).all() and not length[:s - 1].any() and not length[s + n - 7:].any()
    rounds = walk(length)
    loop = [k + 1 for k in stats.realised_accepted]
    assert len(rounds) >= 10 and rounds == loop[:len(rounds)]
    assert n - 7 <= sum(rounds) <= n  # every round whose anchor has its 7 labels, and no other
    assert np.mean(length[s:s + n - 7]) > sum(rounds) / len(rounds)
    capped = Stats()  # the loop stopped after m new tokens: the walk cut at the answer's m-th token
    m = 40
    list(Runtime(reference_export, "eager").generate(prompt, GenerationConfig(max_new_tokens=m, ignore_eos=True),
                                                     capped))
    assert walk(length, first=m) == [k + 1 for k in capped.realised_accepted] and sum(walk(length, first=m)) == m - 1
    from hyflash.train import drafter as training

    monkeypatch.setattr(training, "ANCHORS_AT_ONCE", 10)  # a row's anchors in many calls: the same lengths
    (chunked,) = acceptance_lengths(Distill(drafter, target, anchors=48), Rows(tokens, anchorable))
    np.testing.assert_array_equal(chunked, length)
