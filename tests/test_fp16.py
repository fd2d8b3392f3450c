"""fp16 exports (`export --dtype fp16`): weights, graph I/O and the KV cache in fp16, judged against the
fp32 eager models, and a speculative loop as exact against its own fp16 target as an fp32 one is."""

import numpy as np
import onnx
import pytest
from conftest import CHUNK, CONTEXT, tokens_by_draft  # fixtures fp16_onnx, fp16_both: conftest

from hyflash.cli import main
from hyflash.export.validate import step_rows_agree, summarize, validate
from hyflash.runtime_py.loop import Runtime
from hyflash.runtime_py.manifest import load_manifest, verify_graph


def _export(qwen3_dir, out, fmt, *extra):
    return main(["export", "--target", str(qwen3_dir), "--drafter", "random", "--out", str(out), "--format", fmt,
                 "--max-context", str(CONTEXT), "--prefill-chunk", str(CHUNK), "--window", "24", "--dtype", "fp16",
                 *extra])


def test_fp16_graphs_carry_fp16_weights_io_and_cache(fp16_onnx):
    manifest = load_manifest(fp16_onnx)
    assert manifest["dtype"] == "fp16" and manifest["cache"]["dtype"] == "float16"
    floats = {t["dtype"] for g in manifest["graphs"].values() for t in (*g["inputs"], *g["outputs"])} - {"int64"}
    assert floats == {"float16"}
    proto = onnx.load(fp16_onnx / "onnx" / "target_decode.onnx", load_external_data=False)
    big = [t for t in proto.graph.initializer if np.prod(t.dims) >= 256]
    assert big and all(t.data_type == onnx.TensorProto.FLOAT16 for t in big)
    cache_in = [i for i in proto.graph.input if i.name.startswith("past_key")]
    assert cache_in and all(i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for i in cache_in)


def _exact_loop(folder, backend):
    runtime = Runtime(folder, backend)
    prompt = np.random.default_rng(11).integers(3, 96, 23).tolist()
    out = tokens_by_draft(runtime, prompt, 40)
    assert out["model"] == out["none"] and len(out["none"]) == 40


def _validates(folder, backend):
    rows = summarize(validate(folder, backends=(backend,)))
    assert rows and all(r.ok for r in rows), [(r.graph, r.output, r.max_diff, r.tolerance) for r in rows if not r.ok]
    graphs = {r.graph for r in rows}
    assert {"target_prefill", "target_verify", "target_decode", "draft_read", "window_shift"} <= graphs


def test_fp16_onnx_validates_against_fp32_eager(fp16_onnx):
    _validates(fp16_onnx, "onnxruntime")


def test_fp16_onnx_speculative_equals_target_only(fp16_onnx):
    _exact_loop(fp16_onnx, "onnxruntime")


def test_fp16_onnx_verify_rows_are_its_steps_bit_for_bit(fp16_onnx):
    """Greedy output is target-only's only if a verify row is what the single-token step gives at its position.
    In fp16 onnxruntime's one-row call rounds unlike its several-row calls (SmolLM2-135M's logits 0.03 apart, and
    a held-out answer parted from target-only's), while every width of two rows or more gives a row the same
    bits: so an fp16 export's single-token steps run the two-row verify graph, and validate holds every width to
    it exactly."""
    manifest = load_manifest(fp16_onnx)
    assert manifest["target"]["step_rows"] == 2 and 2 in manifest["verify_widths"]
    runtime = Runtime(fp16_onnx, "onnxruntime")
    tokens = np.random.default_rng(5).integers(3, 96, 120).tolist()
    checks = step_rows_agree(runtime, tokens)
    assert {c.graph for c in checks} == {verify_graph(w) for w in manifest["verify_widths"]}
    assert all(c.count > 0 and c.max_diff == 0.0 for c in checks), [(c.graph, c.max_diff) for c in checks]


@pytest.mark.slow  # suite time: lowering to .pte
def test_fp16_pte_validates_and_is_exact(fp16_both):
    _validates(fp16_both, "executorch")
    _exact_loop(fp16_both, "executorch")


def test_fp16_with_quantization_is_refused(qwen3_dir, tmp_path, capsys):
    code = _export(qwen3_dir, tmp_path / "q", "onnx", "--quantize", "int4")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--dtype fp16 with --quantize" in err[0]
    assert not (tmp_path / "q").exists() and not list(tmp_path.glob(".q.partial-*"))


def test_bf16_is_refused_with_the_reason(qwen3_dir, tmp_path, capsys):
    code = main(["export", "--target", str(qwen3_dir), "--drafter", "random", "--out", str(tmp_path / "b"),
                 "--format", "onnx", "--dtype", "bf16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--dtype bf16" in err[0] and "use --dtype fp16" in err[0]
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.partial-*"))
