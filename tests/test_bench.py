"""`hyflash bench`: every drafter side by side with target-only, outputs cross-checked."""

import json

import numpy as np

from hyflash.cli import main


def test_bench_reports_every_drafter_and_bucket(both_formats, tmp_path, capsys):
    text = tmp_path / "prompts.txt"
    rng = np.random.default_rng(0)
    text.write_text(" ".join(f"w{t}" for t in rng.integers(3, 96, 400)))
    png = tmp_path / "bench.png"
    assert main(["bench", str(both_formats), "--buckets", "8,24,48", "--prompts-from", str(text),
                 "--prompts-per-bucket", "2", "--max-new-tokens", "16", "--plot", str(png), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["results"]
    assert {(r["drafter"], r["bucket"]) for r in rows} == {
        (d, b) for d in ("target-only", "random", "prompt-lookup") for b in ("8-24", "24-48")}
    for r in rows:
        assert r["tokens_per_s"] > 0 and 1.0 <= r["acceptance_length"] <= 8.0
        if r["drafter"] == "target-only":
            assert r["speedup"] == 1.0
        else:
            assert set(r["graph_ms_per_round"]) >= {"draft_read", "target_verify"} or r["drafter"] == "prompt-lookup"
    assert report["graph_ms"]["random"]["state_commit"] > 0
    assert png.stat().st_size > 10_000


def test_bench_refuses_bad_buckets(both_formats, capsys):
    assert main(["bench", str(both_formats), "--buckets", "64,32"]) == 2
    assert "--buckets" in capsys.readouterr().err
