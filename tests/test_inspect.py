"""`hyflash inspect`, and every way a checkpoint folder can be wrong: one line, exit 2."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyflash.cli import main
from hyflash.models.config import TargetConfig, UnsupportedModelError


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_reports_geometry(hf_checkpoint, capsys):
    folder, hf = hf_checkpoint("qwen3")
    code, out, _ = run(capsys, "inspect", "--target", str(folder), "--json")
    assert code == 0
    r = json.loads(out)
    assert r["architecture"] == "Qwen3ForCausalLM" and r["supported"]
    assert r["parameters"] == sum(p.numel() for p in hf.parameters())
    assert r["head_dim"] == 24 and r["kv_heads"] == 2 and r["taps"] == [1, 2]
    assert r["kv_cache_bytes_per_token"]["bf16"] == 2 * 4 * 2 * 24 * 2


def _copy(folder, tmp_path):
    dest = tmp_path / "ckpt"
    shutil.copytree(folder, dest)
    return dest


def _edit_config(folder, **changes):
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    path.write_text(json.dumps(raw))


def _missing_config(f):
    (f / "config.json").unlink()


def _missing_weights(f):
    (f / "model.safetensors").unlink()


def _wrong_shape(f):
    sd = load_file(f / "model.safetensors")
    sd["model.layers.0.mlp.down_proj.weight"] = torch.zeros(64, 100)
    save_file(sd, f / "model.safetensors")


def _missing_tensor(f):
    sd = load_file(f / "model.safetensors")
    del sd["model.layers.1.self_attn.k_proj.weight"]
    save_file(sd, f / "model.safetensors")


def _garbage_weights(f):
    (f / "model.safetensors").write_bytes(b"not a safetensors file")


def _bad_json(f):
    (f / "config.json").write_text("{not json")


BAD_FOLDERS = {
    "missing config": (_missing_config, "no config.json"),
    "missing weights": (_missing_weights, "no model.safetensors"),
    "wrong shape": (_wrong_shape, "has shape"),
    "missing tensor": (_missing_tensor, "is missing"),
    "garbage weights": (_garbage_weights, "not a readable safetensors"),
    "bad json": (_bad_json, "not valid JSON"),
    "unknown architecture": (lambda f: _edit_config(f, architectures=["GPT2LMHeadModel"]), "unsupported architecture"),
    "moe architecture": (lambda f: _edit_config(f, architectures=["Qwen3MoeForCausalLM"]), "mixture-of-experts"),
    "dynamic rope": (lambda f: _edit_config(f, rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "dynamic NTK"),
    "yarn rope": (lambda f: _edit_config(f, rope_scaling={"rope_type": "yarn", "factor": 2.0}), "unsupported rope type"),
    "llama3 rope without keys": (lambda f: _edit_config(f, rope_scaling={"rope_type": "llama3"}), "rope_scaling"),
    "non-integer hidden size": (lambda f: _edit_config(f, hidden_size="64"), "hidden_size"),
    "heads not divisible": (lambda f: _edit_config(f, num_key_value_heads=3), "multiple"),
}


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_bad_folder_is_one_line_exit_2(case, hf_checkpoint, tmp_path, capsys):
    folder, _ = hf_checkpoint("qwen3")
    broken = _copy(folder, tmp_path)
    damage, message = BAD_FOLDERS[case]
    damage(broken)
    code, out, err = run(capsys, "inspect", "--target", str(broken))
    assert code == 2, (case, out, err)
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "Traceback" not in err


def test_not_a_folder(tmp_path, capsys):
    code, _, err = run(capsys, "inspect", "--target", str(tmp_path / "nope"))
    assert code == 2 and "not a folder" in err


def test_console_script_prints_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "hyflash.cli", "inspect", "--target", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr


def _cfg(**overrides):
    raw = {"architectures": ["MistralForCausalLM"], "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
           "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 4096, **overrides}
    return TargetConfig.from_hf(raw)


def test_sliding_window_refused_only_when_active_and_smaller():
    _cfg(sliding_window=None).check_context(4096)
    _cfg(sliding_window=4096).check_context(4096)
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        _cfg(sliding_window=1024).check_context(2048)
    qwen = dict(architectures=["Qwen2ForCausalLM"], sliding_window=128)
    _cfg(**qwen, use_sliding_window=False).check_context(4096)  # window present but inactive
    with pytest.raises(UnsupportedModelError):
        _cfg(**qwen, use_sliding_window=True).check_context(4096)


def test_longrope_refuses_context_past_original():
    cfg = _cfg(architectures=["Phi3ForCausalLM"], original_max_position_embeddings=1024,
               rope_scaling={"type": "longrope", "short_factor": [1.0] * 2, "long_factor": [2.0] * 2})
    cfg.check_context(1024)
    with pytest.raises(UnsupportedModelError, match="original_max_position_embeddings"):
        cfg.check_context(2048)
    assert cfg.default_max_context() == 1024


def test_unsupported_context_via_cli(hf_checkpoint, capsys):
    folder, _ = hf_checkpoint("phi3-longrope-partial")
    code, out, err = run(capsys, "inspect", "--target", str(folder), "--max-context", "512")
    assert code == 2 and "supported      no" in out
    code, out, _ = run(capsys, "inspect", "--target", str(folder))
    assert code == 0 and "context        256" in out


@pytest.mark.parametrize("fixture, flags", [
    ("both_formats", []),
    ("fp16_onnx", ["--dtype", "fp16"]),
    pytest.param("int4_embeddings_pte", ["--quantize-embeddings", "int4"], marks=pytest.mark.slow),  # lowering
])
def test_inspect_estimates_the_export_before_it_is_made(request, qwen3_dir, fixture, flags, capsys):
    """The sizes `inspect` prices from geometry and options are the files `export` writes with them:
    ONNX weights within 10%, the .pte within its program overhead: about 100 KiB per method at this size (each
    method's delegate blobs and plan; the weights are stored once for all of them)."""
    folder = request.getfixturevalue(fixture)
    capsys.readouterr()  # what the export printed, when the fixture was made here
    code, out, _ = run(capsys, "inspect", "--target", str(qwen3_dir), "--max-context", "96", *flags, "--json")
    assert code == 0
    est = json.loads(out)["export"]["bytes"]
    weights = (folder / "onnx" / "model.weights").stat().st_size
    assert abs(est["onnx"]["total"] - weights) <= 0.1 * weights, (est["onnx"], weights)
    if (folder / "model.pte").is_file():
        actual = (folder / "model.pte").stat().st_size
        methods = len(json.loads((folder / "manifest.json").read_text())["graphs"])
        assert est["pte"]["total"] <= actual <= est["pte"]["total"] * 1.1 + methods * 100 * 1024, (est["pte"], actual)
    code, out, _ = run(capsys, "inspect", "--target", str(qwen3_dir), *flags)
    assert "ONNX  files" in out and ".pte  files" in out


def test_inspect_refuses_fp16_with_quantization_as_export_does(qwen3_dir, capsys):
    code, out, err = run(capsys, "inspect", "--target", str(qwen3_dir), "--dtype", "fp16", "--quantize", "int4")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--dtype fp16 with --quantize" in err
