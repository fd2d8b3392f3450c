"""The embedded reference pair, exported as a user would: greedy output is the target's on both
backends, the text is Python, and a long run to the usable context stays exact (issues 5, 6, 8)."""

import pytest
from tokenizers import Tokenizer

from hyflash.demo import PROMPT
from hyflash.export.pipeline import ExportConfig, export
from hyflash.reference import resolve
from hyflash.runtime_py.longrun import long_run
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats


def _export(tmp_path_factory, fmt):
    out = tmp_path_factory.mktemp("reference") / fmt
    export(ExportConfig(target=resolve("reference", "target"), drafter=str(resolve("reference", "drafter")), out=out,
                        formats=(fmt,)), progress=False)
    return out


@pytest.fixture(scope="module")
def reference_export(tmp_path_factory):
    return _export(tmp_path_factory, "onnx")


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
def test_trained_drafter_greedy_equals_target_only_executorch(tmp_path_factory, prompt):
    _greedy_equals_target_only(_export(tmp_path_factory, "pte"), prompt, "executorch")


def test_long_run_to_the_usable_context(reference_export, prompt):
    r = long_run(reference_export, prompt)
    assert r["final_context"] == r["usable_context"] >= 2048
    assert r["identical_to_target_only"], f"first difference at generated token {r['first_difference']}"
    assert r["nonfinite_buffers"] == []
    assert r["rounds_checked"] >= r["rounds"]  # the drafter context was checked after every round
    assert r["peak_rss_growth"] <= r["target_kv_bytes"] + 16 * 2**20  # the cache's pages, and little else
