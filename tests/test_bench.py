"""`hyflash bench`: every drafter side by side with target-only, outputs cross-checked."""

import json

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import DynamicCache

from hyflash.cli import main
from hyflash.models.config import TargetConfig
from hyflash.runtime_py.profile import target_macs


def test_bench_reports_every_drafter_and_bucket(both_formats, tmp_path, capsys):
    text = tmp_path / "prompts.txt"
    rng = np.random.default_rng(0)
    text.write_text(" ".join(f"w{t}" for t in rng.integers(3, 96, 400)))
    png = tmp_path / "bench.png"
    assert main(["bench", str(both_formats), "--buckets", "8,24,48", "--prompts-from", str(text),
                 "--prompts-per-bucket", "2", "--max-new-tokens", "16", "--plot", str(png), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["results"]
    # the optimum baseline: present where optimum-onnx is installed and handles the target (the tiny
    # test target's geometry it may not); its status says which
    assert report["optimum_ort"] == "ok" or report["optimum_ort"].startswith(("not installed", "failed:"))
    assert report["optimum_ort"] != "not installed" or not _has_optimum()
    labels = ("target-only", "random", "prompt-lookup") + (("optimum-ort",) if report["optimum_ort"] == "ok" else ())
    assert {(r["drafter"], r["bucket"]) for r in rows} == {(d, b) for d in labels for b in ("8-24", "24-48")}
    for r in rows:
        assert r["tokens_per_s"] > 0 and 1.0 <= r["acceptance_length"] <= 8.0
        if r["drafter"] == "target-only":
            assert r["speedup"] == 1.0
        elif r["drafter"] == "optimum-ort":  # its own export of the same target: greedy tokens agree
            assert r["same_tokens_as_target_only"] == 1.0 and r["speedup"] > 0
        else:
            assert set(r["graph_ms_per_round"]) >= {"draft_read", "target_verify"} or r["drafter"] == "prompt-lookup"
    assert report["graph_ms"]["random"]["state_commit"] > 0
    assert png.stat().st_size > 10_000


def _has_optimum():
    try:
        import optimum.onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def test_bench_on_executorch(both_formats, tmp_path, capsys):
    """The same bench on the .pte programs: every run (target-only too) on ExecuTorch, outputs cross-checked."""
    text = tmp_path / "prompts.txt"
    text.write_text(" ".join(f"w{t}" for t in np.random.default_rng(1).integers(3, 96, 200)))
    assert main(["bench", str(both_formats), "--backend", "executorch", "--buckets", "8,24", "--prompts-from",
                 str(text), "--prompts-per-bucket", "2", "--max-new-tokens", "12", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "executorch" and report["optimum_ort"].startswith("an onnxruntime baseline")
    assert {r["drafter"] for r in report["results"]} == {"target-only", "random", "prompt-lookup"}
    assert report["graph_ms"]["random"]["draft_read"] > 0


def test_bench_refuses_bad_buckets(both_formats, capsys):
    assert main(["bench", str(both_formats), "--buckets", "64,32"]) == 2
    assert "--buckets" in capsys.readouterr().err


def test_bench_samples_reproducibly(both_formats, tmp_path, capsys):
    """--temperature 1.0: every run samples (sampled outputs differ from target-only's, so the greedy
    cross-check must not apply; no greedy optimum baseline); the same seed gives the same figures."""
    text = tmp_path / "prompts.txt"
    text.write_text(" ".join(f"w{t}" for t in np.random.default_rng(2).integers(3, 96, 300)))
    args = ["bench", str(both_formats), "--buckets", "8,24,40", "--prompts-from", str(text), "--prompts-per-bucket",
            "2", "--max-new-tokens", "24", "--temperature", "1.0", "--top-p", "0.9", "--json"]
    taus = []
    for seed in ("5", "5"):
        assert main(args + ["--seed", seed]) == 0
        report = json.loads(capsys.readouterr().out)
        assert (report["temperature"], report["top_p"]) == (1.0, 0.9)
        assert report["optimum_ort"] == "a greedy baseline; this bench samples"
        assert {r["drafter"] for r in report["results"]} == {"target-only", "random", "prompt-lookup"}
        taus.append([(r["acceptance_length"], r.get("accepted_per_slot")) for r in report["results"]])
    assert taus[0] == taus[1]


@pytest.mark.parametrize("variant", ["qwen3", "llama"])
def test_target_macs_match_torchs_flop_count_of_the_reference(hf_checkpoint, variant):
    """profile's arithmetic against torch's FlopCounterMode over transformers' forward (eager attention: plain
    matmuls the counter sees) of `rows` new tokens after `committed` cached ones, less RoPE's angle table.
    transformers multiplies every row by every key (the mask drops the future ones afterwards);
    target_macs counts only the keys up to a row's own: the triangle apart, the same."""
    folder, model = hf_checkpoint(variant)
    shared = model.config._attn_implementation  # the session's model: restored for the other tests
    model.set_attn_implementation("eager")
    try:
        _check_macs(folder, model)
    finally:
        model.set_attn_implementation(shared)


def _check_macs(folder, model):
    cfg = TargetConfig.from_hf(json.loads((folder / "config.json").read_text()))
    q = cfg.num_heads * cfg.head_dim
    for committed, rows in ((0, 1), (37, 1), (37, 8), (90, 8)):
        cache = DynamicCache()
        with torch.no_grad():
            if committed:
                model(torch.arange(committed)[None] % cfg.vocab_size, past_key_values=cache, use_cache=True)
            counter = FlopCounterMode(display=False)
            with counter:
                model(torch.arange(rows)[None] + 3, past_key_values=cache, use_cache=True)
        angles = counter.get_flop_counts()[f"{type(model).__name__}.model.rotary_emb"]
        flops = counter.get_total_flops() - sum(angles.values())
        future = rows * (rows - 1) // 2  # (row, later row) pairs transformers multiplies and masks
        assert flops == 2 * (target_macs(cfg, rows, committed) + cfg.num_layers * 2 * q * future)


def test_profile_reports_every_graph_at_every_context(both_formats, tmp_path, capsys):
    """`hyflash profile` on both backends: each graph's median ms at each committed length, the ratios derived
    from them (verify/decode, the drafter's graphs per round, draft_read's share of a round), prefill and
    target-only figures; a context with no room for the decoded tokens is refused in one line."""
    out = tmp_path / "profile.json"
    cfg = TargetConfig.from_hf(json.loads((both_formats / "manifest.json").read_text())["target"]["config"])
    for backend in ("onnxruntime", "executorch"):
        assert main(["profile", str(both_formats), "--backend", backend, "--contexts", "16,48", "--repeats", "3",
                     "--new-tokens", "8", "--no-optimum", "--out", str(out), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report == json.loads(out.read_text()) and report["backend"] == backend
        assert [r["context"] for r in report["rows"]] == [16, 48]
        for r in report["rows"]:
            ms = r["graph_ms"]
            assert set(ms) == {"target_decode", "target_verify", "target_verify_2", "target_verify_4", "target_prefill",
                               "draft_read", "state_commit", "window_shift"} and min(ms.values()) > 0
            assert r["verify_over_decode"] == ms["target_verify"] / ms["target_decode"]
            assert r["verify_over_decode_by_width"] == {str(w): ms[g] / ms["target_decode"] for w, g in
                                                        ((2, "target_verify_2"), (4, "target_verify_4"),
                                                         (8, "target_verify"))}
            for g, rows in (("target_decode", 1), ("target_verify", 8)):  # the rate each ran at
                assert r["target_gflops"][g] == 2 * target_macs(cfg, rows, r["context"]) / (ms[g] * 1e6)
            assert r["drafter_ms_per_round"] == ms["draft_read"] + ms["state_commit"] + ms["window_shift"]
            rest = ms["target_verify"] + ms["state_commit"] + ms["window_shift"]
            assert abs(r["draft_read_share"] - ms["draft_read"] / rest) < 1e-12
            assert r["ttft_ms"] > 0 and r["prefill_tokens_per_s"] > 0 and r["target_only_tokens_per_s"] > 0
    assert main(["profile", str(both_formats), "--contexts", "90", "--no-optimum"]) == 2
    err = capsys.readouterr().err
    assert "leaves no room" in err and err.count("\n") == 1
