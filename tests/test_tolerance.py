"""Validation bars that mean the same at any scale: |got - expected| <= atol + rtol * max|expected|.

Correct exports of models with large activations (every weight matrix x3, x10: logits in the tens
and hundreds, as a real checkpoint's) pass on both backends; an export whose graphs hold one
weight row scaled by 1.01 (a broken exporter, its manifest otherwise right) fails, naming the output.
"""

import json

import pytest
from conftest import CHUNK, CONTEXT, word_tokenizer
from hf_models import save_hf_model
from safetensors.torch import load_file, save_file

from hyflash.cli import main
from hyflash.export.graphs import TOLERANCES
from hyflash.export.validate import summarize, validate
from hyflash.runtime_py.manifest import seal, sha256


def _export(target, out, fmt):
    assert main(["export", "--target", str(target), "--drafter", "random", "--out", str(out), "--format", fmt,
                 "--max-context", str(CONTEXT), "--prefill-chunk", str(CHUNK), "--window", "24"]) == 0
    return out


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """scale -> a tiny random Qwen3 checkpoint with its weight matrices multiplied by it."""
    out = {}
    for scale in (3.0, 10.0):
        folder = tmp_path_factory.mktemp(f"qwen3-x{scale:g}")
        save_hf_model("qwen3", folder, scale=scale)
        word_tokenizer(96).save(str(folder / "tokenizer.json"))
        out[scale] = folder
    return out


@pytest.mark.slow  # suite time: an export per case
@pytest.mark.parametrize("scale,fmt", [(10.0, "onnx"), (3.0, "onnx"),
                                       (10.0, "both")])
def test_large_activations_validate(scaled, tmp_path, scale, fmt):
    rows = summarize(validate(_export(scaled[scale], tmp_path / "export", fmt)))
    assert {r.backend for r in rows} == ({"onnxruntime", "executorch"} if fmt == "both" else {"onnxruntime"})
    assert all(r.ok for r in rows), [r for r in rows if not r.ok]
    # the point of the test: the bar follows the values' scale (its relative part dominates), where a
    # fixed absolute bar would fail correct graphs of large models or pass broken ones of small models
    logits = [r for r in rows if r.output in ("logits", "draft_logits")]
    assert all(r.tolerance > 2 * TOLERANCES["values"].atol for r in logits), logits


@pytest.mark.parametrize("fmt", ["onnx", pytest.param("both", marks=pytest.mark.slow)])  # .pte lowering: minutes
def test_perturbed_weight_row_fails_naming_the_output(scaled, tmp_path, capsys, fmt):
    """Export from a copy of the x10 target with one row of one layer's MLP weight x1.01, then record the
    unperturbed target in the manifest (as an exporter that wrote the wrong weights would)."""
    good = scaled[10.0]
    bad = tmp_path / "perturbed-target"
    bad.mkdir()
    for f in good.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    weights = load_file(bad / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    weights[name][3] *= 1.01
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    out = _export(bad, tmp_path / "export", fmt)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["target"]["path"] = str(good)
    manifest["target"]["files"] = {n: sha256(good / n) for n in manifest["target"]["files"]}
    (out / "manifest.json").write_text(json.dumps(seal(manifest)))
    rows = summarize(validate(out))
    failed = {(r.backend, r.graph, r.output) for r in rows if not r.ok}
    for backend in ("onnxruntime", "executorch") if fmt == "both" else ("onnxruntime",):
        assert (backend, "target_verify", "logits") in failed
    assert main(["validate", str(out)]) == 1
    err = capsys.readouterr().err
    assert "out of tolerance" in err and "logits" in err and "atol + rtol" in err
