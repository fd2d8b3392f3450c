"""Export: static-shape graphs in both formats, the manifest, validation, and tampering."""

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import CONTEXT, random_drafter_folder
from conftest import export_folder as _export
from hf_models import save_hf_model

from hyflash.cli import main
from hyflash.export.validate import summarize, validate
from hyflash.models.loading import load_target
from hyflash.runtime_py.manifest import (
    DRAFTER_GRAPHS,
    PTE_FILE,
    TARGET_GRAPHS,
    ArtifactError,
    Contract,
    load_manifest,
    seal,
    sha256,
)


@pytest.fixture(scope="session")
def onnx_exports(qwen3_dir, tmp_path_factory):
    out = {}
    for memory in ("gated_deltanet", "off"):
        base = tmp_path_factory.mktemp(memory)
        drafter = random_drafter_folder(qwen3_dir, base / "drafter", memory=memory)
        out[memory] = _export(qwen3_dir, drafter, base / "export", "onnx")
    return out


def test_manifest_and_graph_contracts(both_formats):
    manifest = load_manifest(both_formats)
    assert manifest["format_version"] == 4 and manifest["drafter"]["name"] == "random"
    assert set(manifest["graphs"]) == {"draft_read", "state_commit", "window_shift", "target_prefill",
                                       "target_verify", "target_verify_2", "target_verify_4", "target_decode"}
    assert manifest["max_context"] == CONTEXT and manifest["window"] == 24 and manifest["block"] == 7
    contract = Contract(manifest)
    past, present = contract.onnx_cache_io()
    cache = manifest["cache"]
    assert len(past) == 2 * cache["layers"] and past[:2] == ["past_key.0", "past_value.0"]
    assert cache["pte"]["kernels"] == ["llama::update_cache", "llama::custom_sdpa"]
    for name, graph in manifest["graphs"].items():
        model = onnx.load(both_formats / graph["onnx"], load_external_data=False)
        for value in list(model.graph.input) + list(model.graph.output):
            dims = value.type.tensor_type.shape.dim
            assert all(d.HasField("dim_value") for d in dims), (name, value.name)
        inputs, outputs = [t["name"] for t in graph["inputs"]], [t["name"] for t in graph["outputs"]]
        if graph["model"] == "target":  # the cache as per-layer I/O, bound in place at run time
            assert inputs == ["tokens", "positions"] and outputs == ["logits", "features"]
            inputs, outputs = inputs + past, outputs + present
            shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
            assert shapes["past_key.0"] == cache["onnx"]["shape"] == [1, cache["kv_heads"], CONTEXT, cache["head_dim"]]
            assert [n.op_type for n in model.graph.node].count("GroupQueryAttention") == cache["layers"]
        assert [i.name for i in model.graph.input] == inputs
        assert [o.name for o in model.graph.output] == outputs
    commit = manifest["graphs"]["state_commit"]
    shapes = {t["name"]: t["shape"] for t in commit["inputs"] + commit["outputs"]}
    assert shapes["ssm_state"] == shapes["ssm_state_out"] and shapes["conv_state"] == shapes["conv_state_out"]
    read_outputs = [t["name"] for t in manifest["graphs"]["draft_read"]["outputs"]]
    assert read_outputs == ["draft_tokens", "draft_logits", "confidence"]
    # weights stored once: one external-data file for every graph; the drafter's view of the target's
    # embedding and LM head is the target's own bytes in it
    assert sorted(p.name for p in (both_formats / "onnx").glob("*.weights")) == ["model.weights"]
    embedding = load_target(manifest["target"]["path"]).embed.weight.detach().numpy()

    def vocab_tables(graph):  # (offset, length) of the initializers holding the embedding (or its transpose)
        out = set()
        for t in onnx.load(both_formats / "onnx" / f"{graph}.onnx", load_external_data=False).graph.initializer:
            d = {e.key: e.value for e in t.external_data}
            if d and tuple(t.dims) in (embedding.shape, embedding.shape[::-1]):
                value = np.fromfile(both_formats / "onnx" / d["location"], np.float32, int(d["length"]) // 4,
                                    offset=int(d["offset"])).reshape(t.dims)
                if np.array_equal(value, embedding) or np.array_equal(value, embedding.T):
                    out.add((d["offset"], d["length"]))
        return out
    drafter_tables = vocab_tables("draft_read")
    assert drafter_tables and drafter_tables <= vocab_tables("target_verify") | vocab_tables("target_decode")


def test_pte_program_holds_both_models_and_each_table_once(both_formats, qwen3_dir):
    """One program with all its methods (eight: three verify widths). The drafter's view of the target's
    (tied) embedding and LM head is the target's bytes, so the program stores the table twice in all (as the
    lookup's constant and as XNNPACK's projection weights), not twice per model."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.runtime import Runtime

    path = both_formats / PTE_FILE
    methods = Runtime.get().load_program(str(path)).method_names
    assert methods == {*TARGET_GRAPHS, "target_verify_2", "target_verify_4", *DRAFTER_GRAPHS}
    pte = deserialize_pte_binary(path.read_bytes())
    table = load_target(qwen3_dir).embed.weight.detach().float().numpy()
    forms = (table.tobytes(), table.T.copy().tobytes())
    stored = [bytes(b.storage) for b in pte.program.constant_buffer] + [bytes(b) for b in pte.named_data.buffers]
    assert sum(b in forms for b in stored) == 2


def test_pte_methods_leave_no_product_or_split_to_portable_kernels(both_formats):
    """Every product of every method runs in XNNPACK: RoPE's rotate-half matrix is one constant weight, not
    built from eye (arange, eq, a cast) and multiplied by ExecuTorch's portable `mm` in each layer of each call;
    and the fused projections' outputs are sliced, not split (`export.lower.splits_as_slices`), so no portable
    split cuts a layer's XNNPACK partition in two."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary((both_formats / PTE_FILE).read_bytes())
    for plan in pte.program.execution_plan:
        portable = {op.name for op in plan.operators}
        assert not portable & {"aten::mm", "aten::bmm", "aten::eq", "aten::split_with_sizes_copy"}, (plan.name,
                                                                                                portable)


def test_a_draft_vocabulary_head_is_a_constant_of_the_pte_drafter(qwen3_dir, tmp_path):
    """The .pte's draft_read scores a draft vocabulary with one constant weight (what XNNPACK takes as a static
    weight), not with rows gathered from the LM head on every call; the head's logits are unchanged."""
    from hyflash.export.graphs import example_inputs, graph_module, graph_specs
    from hyflash.export.lower import pte_drafter
    from hyflash.models.loading import load_drafter

    target = load_target(qwen3_dir)
    drafter = load_drafter(random_drafter_folder(qwen3_dir, tmp_path / "d", draft_vocab=48), target)
    spec = graph_specs(target, drafter, CONTEXT, 16)["draft_read"]
    hn = torch.randn(7, target.cfg.hidden_size)

    def gathers(module) -> list:
        program = torch.export.export(module, example_inputs(spec), strict=False)
        return [n for n in program.graph.nodes if n.op == "call_function" and "index" in str(n.target)
                and len(n.meta["val"].shape) == 2 and n.meta["val"].shape[0] == 48]

    with torch.no_grad():
        before = drafter.project(hn)
        assert gathers(graph_module(spec, target, drafter))  # the head's rows, gathered at run time
        module = graph_module(spec, target, pte_drafter(drafter, lambda m, _: m))
        assert not gathers(module)
        torch.testing.assert_close(drafter.project(hn), before, rtol=0, atol=0)
        # quantized vocabulary tables hold the head as their module: no second, fp32 copy beside it
        from hyflash.export.quantize import quantize_module

        quantized = pte_drafter(drafter, lambda m, _: quantize_module(m, "none", "int4"))
        assert "head_rows" not in dict(quantized.named_buffers()) and quantized.head_module is not None


def test_validate_both_backends(both_formats):
    rows = summarize(validate(both_formats))
    assert {r.backend for r in rows} == {"onnxruntime", "executorch"}
    bad = [r for r in rows if not r.ok]
    assert not bad, bad
    # every output of every graph (8 drafter, 10 target: prefill, decode and three verify widths), plus the
    # cache rows the ONNX graphs wrote in place (the .pte cache lives inside the program: its rows show in the
    # logits of every later call)
    outputs = {(r.graph, r.output) for r in rows}
    assert len(outputs) == 20 and ("target_verify", "present_key") in outputs
    assert {("target_verify_2", "logits"), ("target_verify_4", "features")} <= outputs
    assert len(rows) == 20 + 18


@pytest.mark.parametrize("memory", [pytest.param("gated_deltanet", marks=pytest.mark.slow), "off"])  # suite time
def test_validate_memory_variants(onnx_exports, memory):
    manifest = load_manifest(onnx_exports[memory])
    assert ("state_commit" in manifest["graphs"]) == (memory != "off")
    draft_inputs = [t["name"] for t in manifest["graphs"]["draft_read"]["inputs"]]
    assert ("ssm_state" in draft_inputs) == (memory != "off")
    rows = summarize(validate(onnx_exports[memory]))
    assert rows and all(r.ok for r in rows), [r for r in rows if not r.ok]


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["gated_deltanet", "off"])
def test_pte_parity_memory_variants(qwen3_dir, tmp_path, memory):
    """The `.pte` side of the fp32 parity bar for the other memory kinds (mamba2 runs in the fast suite)."""
    drafter = random_drafter_folder(qwen3_dir, tmp_path / "drafter", memory=memory)
    folder = _export(qwen3_dir, drafter, tmp_path / "export", "pte")
    rows = summarize(validate(folder))
    assert {r.backend for r in rows} == {"executorch"}
    assert {r.graph for r in rows} >= {"draft_read", "window_shift", "target_verify"}
    assert ("state_commit" in {r.graph for r in rows}) == (memory != "off")
    assert rows and all(r.ok for r in rows), [r for r in rows if not r.ok]


def test_validate_fails_loudly_on_a_wrong_graph(onnx_exports, tmp_path, capsys):
    """Swap in a graph that computes something else (checksums updated): validation must fail, exit 1."""
    broken = tmp_path / "broken"
    shutil.copytree(onnx_exports["off"], broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    model = onnx.load(broken / "onnx" / "target_decode.onnx", load_external_data=False)
    for init in model.graph.initializer:
        if init.name.endswith("norm.weight") and init.raw_data:
            init.raw_data = bytes(len(init.raw_data))  # zero a norm: the logits change
            break
    onnx.save(model, broken / "onnx" / "target_decode.onnx")
    manifest["files"]["onnx/target_decode.onnx"] = sha256(broken / "onnx" / "target_decode.onnx")
    (broken / "manifest.json").write_text(json.dumps(seal(manifest)))  # every checksum right: only parity can tell
    assert main(["validate", str(broken)]) == 1
    assert "out of tolerance" in capsys.readouterr().err
    # the broken decode fails, and so do the calls after it: they read the cache rows it wrote
    failed = {r.graph for r in summarize(validate(broken)) if not r.ok}
    assert "target_decode" in failed and not failed & {"draft_read", "state_commit", "window_shift"}


@pytest.mark.parametrize("rel", ["onnx/draft_read.onnx", "onnx/model.weights", "model.pte",
                                 "drafter/model.safetensors", "tokenizer.json"])
def test_flipped_byte_is_refused(both_formats, tmp_path, rel, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(both_formats, copy)
    path = copy / rel
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        load_manifest(copy)
    assert main(["validate", str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and rel.split("/")[-1] in err and "sha256" in err


def _existing_out(qwen3_dir, tmp_path) -> tuple[Path, list[str]]:
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    return out, ["export", "--target", str(qwen3_dir), "--drafter", "random", "--out", str(out), "--format", "onnx",
                 "--max-context", "32", "--prefill-chunk", "8"]


def test_existing_out_needs_force(qwen3_dir, tmp_path, capsys):
    out, args = _existing_out(qwen3_dir, tmp_path)
    assert main(args) == 2
    assert "--force" in capsys.readouterr().err and (out / "keep.txt").read_text() == "user data"


@pytest.mark.slow  # suite time: a whole export
def test_force_replaces_the_folder_whole(qwen3_dir, tmp_path):
    out, args = _existing_out(qwen3_dir, tmp_path)
    assert main(args + ["--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "manifest.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["exists"]  # no partial or old folders left


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["llama", "mistral", "qwen2", "phi3", "phi3-longrope-partial"])
def test_other_architectures_both_formats(variant, tmp_path):
    """Each architecture: export, validate on both backends, and greedy speculative output equal to
    target-only output and to transformers' own greedy continuation, on both backends."""
    from hyflash.runtime_py.loop import GenerationConfig, Runtime

    hf = save_hf_model(variant, tmp_path / "target")
    out = _export(tmp_path / "target", "random", tmp_path / "export", "both")
    rows = summarize(validate(out))
    assert all(r.ok for r in rows), [r for r in rows if not r.ok]
    prompt = list(range(3, 30))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                          pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    for backend in ("onnxruntime", "executorch"):
        runtime = Runtime(out, backend)
        for draft in ("model", "none"):
            cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True, draft=draft)
            assert [t for new in runtime.generate(prompt, cfg) for t in new] == ref, (backend, draft)


@pytest.mark.slow  # a second lowering (the fast suite's .pte, `both_formats`, comes from the spawned process)
def test_pte_lowered_in_its_own_process_is_the_same_program(qwen3_dir, both_formats, tmp_path):
    """A large target's .pte is lowered in a spawned process that loads the models itself: its program
    is byte for byte the one lowered in process (same target, same seeded random drafter)."""
    here = _export(qwen3_dir, "random", tmp_path / "here", "pte")  # the tiny target: lowered in this process
    assert (here / PTE_FILE).read_bytes() == (both_formats / PTE_FILE).read_bytes()
    ours, theirs = (json.loads((f / "manifest.json").read_text()) for f in (here, both_formats))
    assert {g: v["pte"] for g, v in ours["graphs"].items()} == {g: v["pte"] for g, v in theirs["graphs"].items()}
