"""A drafter that reads prompt-lookup's block (`--lookup-input`): exported in both formats, fed by name,
at parity with eager PyTorch, and exact in the loop. Its training form equals its run-time form in
tests/test_drafter.py; the native runner's lookup equals Python's in tests/test_runner_cpp.py."""

import numpy as np
import pytest
from conftest import tokens_by_draft

from hyflash.export.validate import summarize, validate
from hyflash.models.lookup import lookup
from hyflash.runtime_py.loop import Runtime, Stats
from hyflash.runtime_py.manifest import load_manifest

# suite time: its exports cost the fast suite 40 s and more; the shipped SmolLM2 drafter reads the block, and
# the fast suite checks its run-time form (as exported too) against its training form in tests/test_drafter.py
pytestmark = pytest.mark.slow


def test_graph_contract_names_the_lookup_inputs(lookup_input_onnx):
    manifest = load_manifest(lookup_input_onnx)
    inputs = {t["name"]: t for t in manifest["graphs"]["draft_read"]["inputs"]}
    assert inputs["lookup_tokens"]["shape"] == [7] and inputs["lookup_match"]["shape"] == [1]
    assert manifest["drafter"]["config"]["lookup_input"] is True


@pytest.mark.parametrize("fmt", ["onnx", pytest.param("pte", marks=pytest.mark.slow)])
def test_validate(request, fmt):
    rows = summarize(validate(request.getfixturevalue(f"lookup_input_{fmt}")))
    assert {r.backend for r in rows} == {"onnx": {"onnxruntime"}, "pte": {"executorch"}}[fmt]
    assert "draft_read" in {r.graph for r in rows}
    assert [r for r in rows if not r.ok] == []


@pytest.mark.parametrize("backend", ["eager", "onnxruntime", pytest.param("executorch", marks=pytest.mark.slow)])
def test_greedy_is_exact_and_the_drafts_read_the_block(request, backend):
    runtime = Runtime(request.getfixturevalue("lookup_input_pte" if backend == "executorch" else "lookup_input_onnx"),
                      backend)
    rng = np.random.default_rng(3)
    phrase = rng.integers(3, 96, 9).tolist()
    prompt = rng.integers(3, 96, 12).tolist() + phrase + rng.integers(3, 96, 6).tolist() + phrase[:4]
    out = tokens_by_draft(runtime, prompt, 24, ("model", "prompt-lookup", "none"))
    assert len(set(map(tuple, out.values()))) == 1, out
    # the same anchor and context with two different lookup blocks: the drafts differ (the input is wired)
    runtime.prefill(prompt, True, Stats())
    found = lookup(prompt, runtime.block)
    assert found[1] == 3  # the phrase's first four tokens end the prompt: a trigram match
    logits = []
    for f in (found, (np.full(runtime.block, prompt[-1]), 0)):
        runtime.draft(prompt[-1], len(prompt) - 1, found=f)
        logits.append(runtime.calls["draft_read", runtime.ctx.index].outputs["draft_logits"].copy())
    assert np.abs(logits[0] - logits[1]).max() > 0.1
    with pytest.raises(ValueError, match="reads prompt-lookup's block"):
        runtime.draft(prompt[-1], len(prompt) - 1)


@pytest.mark.slow  # suite time: a training run and an export
def test_a_draft_vocabulary_with_the_lookup_input_exports_and_stays_exact(qwen3_dir, tmp_path):
    """--draft-vocab with --lookup-input (the shipped SmolLM2 drafter's options): a lookup token outside the
    draft vocabulary keeps its input embedding and gets no copy logit (it cannot be drafted); exported in both
    formats, validated and exact in the loop on both backends."""
    from conftest import export_folder, random_drafter_folder

    folder = random_drafter_folder(qwen3_dir, tmp_path / "drafter", seed=7, scale=0.3, lookup_input=True,
                                   draft_vocab=48)
    out = export_folder(qwen3_dir, folder, tmp_path / "both", "both")
    rows = summarize(validate(out))
    assert {r.backend for r in rows} == {"onnxruntime", "executorch"} and [r for r in rows if not r.ok] == []
    rng = np.random.default_rng(5)
    phrase = rng.integers(3, 96, 9).tolist()
    prompt = rng.integers(3, 96, 12).tolist() + phrase + rng.integers(3, 96, 6).tolist() + phrase[:4]
    assert any(t >= 48 for t in phrase) and any(t < 48 for t in phrase)  # lookup proposes tokens both sides
    for backend in ("onnxruntime", "executorch"):
        out_tokens = tokens_by_draft(Runtime(out, backend=backend), prompt, 24, ("model", "none"))
        assert out_tokens["model"] == out_tokens["none"], backend
