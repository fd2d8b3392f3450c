"""A manifest cannot mislead: every field an export states is checked against the others and against
the graphs' own I/O at every load, and the manifest carries a checksum of itself.

Each edit below is written with the manifest's checksum recomputed (as a buggy exporter would write
it), so what refuses it is the consistency check: one line naming the field and both values, exit 2.
"""

import json
import shutil

import pytest

from hyflash.cli import main
from hyflash.runtime_py.manifest import seal


def _tensor(m, graph, name):
    return next(t for t in m["graphs"][graph]["inputs"] + m["graphs"][graph]["outputs"] if t["name"] == name)


EDITS = {  # name: (edit, words the one-line error must hold: the field and both values)
    "max_context": (lambda m: m.update(max_context=10**9), ["max_context is 1000000000", "cache.rows is 96"]),
    "block": (lambda m: m.update(block=5), ["block is 5", "drafter.config.block is 7"]),
    "window": (lambda m: m.update(window=48), ["window is 48", "win_pos shape[0] is 24"]),
    "prefill_chunk": (lambda m: m.update(prefill_chunk=32), ["prefill_chunk is 32", "tokens shape[0] is 16"]),
    "cache rows": (lambda m: m["cache"].update(rows=200), ["max_context is 96", "cache.rows is 200"]),
    "cache heads": (lambda m: m["cache"].update(kv_heads=4), ["cache.onnx.shape is [1, 2, 96, 24]",
                                                               "[1, 4, 96, 24]"]),
    "verify width": (lambda m: _tensor(m, "target_verify", "tokens").update(shape=[4]),
                     ["target_verify.tokens shape[0] is 4", "verify width is 8"]),
    "drafter vocab": (lambda m: _tensor(m, "draft_read", "draft_logits").update(shape=[7, 100]),
                      ["draft_read.draft_logits shape is [7, 100]", "[7, 96]"]),
    "target vocab": (lambda m: m["target"]["config"].update(vocab_size=128),
                     ["target_prefill.logits shape is [16, 96]", "[16, 128]"]),
    "taps": (lambda m: m["target"].update(taps=[1]), ["target_prefill.features shape is [16, 128]",
                                                       "[tokens, taps x hidden_size] is [16, 64]"]),
    "dtype": (lambda m: _tensor(m, "window_shift", "features").update(dtype="float16"),
              ["'features' has dtype 'float16'", "float32 or int64"]),
    "state shape": (lambda m: _tensor(m, "state_commit", "ssm_state").update(shape=[2, 1, 64, 32]),
                    ["(ssm_state) has shape [2, 1, 64, 32] in the manifest", "in the graph"]),
    "name": (lambda m: _tensor(m, "draft_read", "anchor_token").update(name="anchor"),
             ["(anchor) has name 'anchor' in the manifest but 'anchor_token' in the graph"]),
    "path": (lambda m: m["graphs"]["draft_read"].update(onnx="onnx/window_shift.onnx"),
             ["window_shift.onnx", "'anchor_token' in the manifest but 'features' in the graph"]),
    "verify attention": (lambda m: m["cache"]["pte"].update(verify_attention="columns"),
                         ["cache.pte.verify_attention is 'columns'", "block or rows"]),
}


@pytest.fixture(scope="module")
def manifest(both_formats):
    return json.loads((both_formats / "manifest.json").read_text())


@pytest.mark.parametrize("name", list(EDITS))
def test_a_consistent_looking_edit_is_refused_naming_the_field(both_formats, manifest, tmp_path, name, capsys):
    edit, words = EDITS[name]
    folder = tmp_path / "edited"
    shutil.copytree(both_formats, folder)
    m = json.loads(json.dumps(manifest))
    edit(m)
    (folder / "manifest.json").write_text(json.dumps(seal(m)))
    assert main(["generate", str(folder), "--prompt-ids", "5", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def test_a_plain_edit_is_refused_by_the_checksum(both_formats, manifest, tmp_path, capsys):
    folder = tmp_path / "edited"
    shutil.copytree(both_formats, folder)
    m = json.loads(json.dumps(manifest))
    m["window"] = 12  # the checksum left as the exporter wrote it
    (folder / "manifest.json").write_text(json.dumps(m))
    assert main(["generate", str(folder), "--prompt-ids", "5"]) == 2
    assert "checksum (manifest_sha256) does not match" in capsys.readouterr().err
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=4))  # layout is not content
    assert main(["generate", str(folder), "--prompt-ids", "5", "--max-new-tokens", "2"]) == 0


def test_a_format_3_export_reads_as_row_by_row(both_formats, manifest, tmp_path):
    """Exports from before cache.pte.verify_attention (format 3) still load, their .pte read as attending its
    verify rows one by one; this hyflash writes format 4 with the field."""
    from hyflash.runtime_py.manifest import load_manifest, pte_verify_attention

    assert manifest["format_version"] == 4 and pte_verify_attention(manifest["cache"]) == "block"
    folder = tmp_path / "format3"
    shutil.copytree(both_formats, folder)
    m = json.loads(json.dumps(manifest))
    m["format_version"] = 3
    del m["cache"]["pte"]["verify_attention"]
    (folder / "manifest.json").write_text(json.dumps(seal(m)))
    assert pte_verify_attention(load_manifest(folder)["cache"]) == "rows"
