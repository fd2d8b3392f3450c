"""`hyflash memory`: the budget table follows from geometry alone."""

import json

from hyflash.cli import main

MIB, GIB = 2**20, 2**30


def run_json(capsys, *args):
    assert main(["memory", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_phi4_reasoning_matches_the_paper(capsys):
    b = run_json(capsys, "--preset", "phi-4-reasoning")
    assert b["context"] == 32768
    assert b["target_kv_bytes"] == 6.25 * GIB  # 40 layers x 10 KV heads x 128 x K,V x 2 bytes x 32K
    assert b["drafter_window_bytes"] == 2.5 * MIB  # 2 layers x 256 x 10 x 128 x K,V x 2 bytes
    assert b["drafter_ssm_state_bytes"] == 2.5 * MIB  # 2 layers x 80 heads x 64 x 64 x 4 bytes
    assert b["drafter_context_bytes"] < 5.2 * MIB
    assert 14.6e9 < b["target_parameters"] < 14.7e9


def test_context_changes_the_target_kv_not_the_drafter(capsys):
    short = run_json(capsys, "--preset", "qwen3-4b", "--context", "4096")
    long = run_json(capsys, "--preset", "qwen3-4b", "--context", "32768")
    assert long["target_kv_bytes"] == 8 * short["target_kv_bytes"]
    assert long["drafter_context_bytes"] == short["drafter_context_bytes"]
    assert 4.0e9 < short["target_parameters"] < 4.05e9  # tied embeddings counted once


def test_dtypes_and_window(capsys):
    a = run_json(capsys, "--preset", "qwen3-4b", "--kv-dtype", "fp32", "--state-dtype", "bf16", "--window", "512")
    b = run_json(capsys, "--preset", "qwen3-4b")
    assert a["drafter_window_bytes"] == 4 * b["drafter_window_bytes"]  # twice the rows, twice the bytes
    assert a["drafter_ssm_state_bytes"] * 2 == b["drafter_ssm_state_bytes"]


def test_artifacts_and_bad_sources(both_formats, capsys):
    b = run_json(capsys, "--artifacts", str(both_formats))
    assert b["context"] == 96 and b["drafter"]["window"] == 24
    assert main(["memory"]) == 2
    assert main(["memory", "--preset", "qwen3-4b", "--artifacts", str(both_formats)]) == 2
    assert "exactly one" in capsys.readouterr().err
