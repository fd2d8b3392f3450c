"""A drafter that reads prompt-lookup's block (`--lookup-input`): exported in both formats, fed by name,
at parity with eager PyTorch, and exact in the loop. Its training form equals its run-time form in
tests/test_drafter.py."""

import numpy as np
import pytest

from hyflash.export.validate import summarize, validate
from hyflash.models.lookup import lookup
from hyflash.runtime_py.loop import Runtime, Stats
from hyflash.runtime_py.manifest import load_manifest

from conftest import tokens_by_draft


def test_graph_contract_names_the_lookup_inputs(lookup_input_export):
    manifest = load_manifest(lookup_input_export)
    inputs = {t["name"]: t for t in manifest["graphs"]["draft_read"]["inputs"]}
    assert inputs["lookup_tokens"]["shape"] == [7] and inputs["lookup_match"]["shape"] == [1]
    assert manifest["drafter"]["config"]["lookup_input"] is True


def test_validate_both_backends(lookup_input_export):
    rows = summarize(validate(lookup_input_export))
    assert {r.backend for r in rows} == {"onnxruntime", "executorch"}
    assert [r for r in rows if not r.ok] == []


@pytest.mark.parametrize("backend", ["eager", "onnxruntime", "executorch"])
def test_greedy_is_exact_and_the_drafts_read_the_block(lookup_input_export, backend):
    runtime = Runtime(lookup_input_export, backend)
    rng = np.random.default_rng(3)
    phrase = rng.integers(3, 96, 9).tolist()
    prompt = rng.integers(3, 96, 12).tolist() + phrase + rng.integers(3, 96, 6).tolist() + phrase[:4]
    out = tokens_by_draft(runtime, prompt, 40, ("model", "hybrid" if runtime.hybrid else "prompt-lookup", "none"))
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
