"""A drafter whose slots read the anchor's embedding directly (`--anchor-input`): exported, at parity with eager
PyTorch, and exact in the loop. Its training form equals its run-time form in tests/test_drafter.py; adding it to
a trained drafter in tests/test_train.py. The graphs' inputs do not change: draft_read already reads the anchor."""

import numpy as np
import pytest
from conftest import export_folder, random_drafter_folder, tokens_by_draft

from hyflash.export.validate import summarize, validate
from hyflash.runtime_py.loop import Runtime
from hyflash.runtime_py.manifest import load_manifest

# suite time: an export the shipped drafters' own tests do not make
pytestmark = pytest.mark.slow


def test_the_anchor_input_exports_and_stays_exact(qwen3_dir, tmp_path):
    folder = random_drafter_folder(qwen3_dir, tmp_path / "drafter", seed=11, scale=0.3, anchor_input=True)
    out = export_folder(qwen3_dir, folder, tmp_path / "onnx", "onnx")
    manifest = load_manifest(out)
    assert manifest["drafter"]["config"]["anchor_input"] is True
    assert {t["name"] for t in manifest["graphs"]["draft_read"]["inputs"]} >= {"anchor_token"}
    assert [r for r in summarize(validate(out)) if not r.ok] == []
    runtime = Runtime(out)
    prompt = np.random.default_rng(5).integers(3, 96, 20).tolist()
    tokens = tokens_by_draft(runtime, prompt, 24, ("model", "none"))
    assert tokens["model"] == tokens["none"]
