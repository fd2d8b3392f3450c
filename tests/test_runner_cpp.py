"""hyflash-run (runtime_cpp/): the loop in C++ over the .pte programs gives the Python runtime's tokens,
samples the target's distribution, and refuses bad input in one line."""

import json
import shutil
import subprocess

import numpy as np
import pytest
from test_runtime import _exact_second_token_distribution, _gof, generate
from tokenizers import Tokenizer

from hyflash.models.loading import load_target
from hyflash.models.widths import CostCurve
from hyflash.runtime_py.bench import BenchConfig, make_prompts, source_texts
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
from hyflash.runtime_py.manifest import verify_graph
from hyflash.runtime_py.native import run_conversation
from hyflash.runtime_py.sampling import Sampling
from hyflash.runtime_py.verifying import read_costs, write_costs


def run(runner, folder, prompt, *flags):
    """hyflash-run ... --json -> (exit code, [one dict per run], stderr)."""
    out = subprocess.run([str(runner), str(folder), "--prompt-ids", ",".join(map(str, prompt)), "--json", *flags],
                         capture_output=True, text=True)
    runs = [json.loads(line) for line in out.stdout.splitlines()] if out.returncode == 0 else []
    return out.returncode, runs, out.stderr


def python_stats(runtime, prompt, **kw):
    return generate(runtime, prompt, **kw)[1]


def _same_as_python(runner, folder, prompts, max_new_tokens):
    runtime = Runtime(folder, "executorch")
    for prompt in prompts:
        for draft in ("model", "none"):
            flags = ["--max-new-tokens", str(max_new_tokens), "--ignore-eos"] + (["--no-draft"] if draft == "none" else [])
            code, (c,), err = run(runner, folder, prompt, *flags)
            assert code == 0, err
            p = python_stats(runtime, prompt, max_new_tokens=max_new_tokens, ignore_eos=True, draft=draft)
            assert c["tokens"] == p.tokens
            assert (c["rounds"], c["accepted_per_slot"], c["stop_reason"]) == (p.rounds, p.accepted_per_slot,
                                                                               p.stop_reason)
            assert c["graph_calls"] == dict(p.graph_calls)  # the same calls in the same phases
            if draft == "model":
                assert c["drafter_context_bytes"] == p.drafter_context_bytes
    return runtime


def test_greedy_equals_the_python_runtime(runner, both_formats):
    """Token for token, round for round, with and without the drafter; prompts that end in every part
    of a prefill chunk, up to the usable context (the tail through target_verify)."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 96, n).tolist() for n in (1, 9, 16, 29, 70)]
    _same_as_python(runner, both_formats, prompts, 24)
    code, (c,), err = run(runner, both_formats, prompts[-1], "--max-new-tokens", "200", "--ignore-eos")
    assert c["stop_reason"].startswith("usable context reached") and c["prompt_tokens"] + len(c["tokens"]) == 96 - 8


def test_narrow_verify_widths_equal_the_python_runtime(runner, both_formats):
    """--width W verifies the anchor and W - 1 drafts through target_verify_W (the drafter's, or prompt-lookup's
    with --draft prompt-lookup): the Python runtime's rounds and tokens at that width, and target-only's tokens;
    a width the export lacks is refused in one line."""
    runtime = Runtime(both_formats, "executorch")
    prompt = np.random.default_rng(4).integers(0, 96, 21).tolist()
    plain = python_stats(runtime, prompt, max_new_tokens=24, ignore_eos=True, draft="none").tokens
    for width, draft in ((2, "model"), (4, "model"), (4, "prompt-lookup"), (8, "prompt-lookup")):
        code, (c,), err = run(runner, both_formats, prompt, "--max-new-tokens", "24", "--ignore-eos", "--width", str(width),
                              "--draft", draft)
        assert code == 0, err
        p = python_stats(runtime, prompt, max_new_tokens=24, ignore_eos=True, width=width, draft=draft)
        assert c["tokens"] == p.tokens == plain
        assert (c["rounds"], c["accepted_per_slot"], c["graph_calls"]) == (p.rounds, p.accepted_per_slot,
                                                                          dict(p.graph_calls))
        assert c["graph_calls"][verify_graph(width)] == c["rounds"]
    code, _, err = run(runner, both_formats, prompt, "--width", "3")
    assert code != 0 and len(err.strip().splitlines()) == 1 and "verify widths" in err


def test_a_conversation_keeps_its_context_as_the_python_runtime(runner, both_formats):
    """--conversation: each line of stdin is the conversation so far; the runner keeps its context between turns
    as Runtime.generate(reuse=True) does: the same tokens, rounds and calls, only the new rows prefilled. A turn
    that rewrites earlier text prefills from where it differs, or anew with the drafter (its memory cannot forget)."""
    rng = np.random.default_rng(5)
    first, more, rewrite = (rng.integers(0, 96, n).tolist() for n in (13, 5, 9))
    for draft in ("model", "prompt-lookup", "none"):
        runtime, cfg = Runtime(both_formats, "executorch"), GenerationConfig(max_new_tokens=10, ignore_eos=True,
                                                                              draft=draft)
        prompts, expected = [first], []
        for turn in range(3):
            stats = Stats()
            list(runtime.generate(prompts[-1], cfg, stats, reuse=True))
            expected.append(stats)
            prompts.append(prompts[-1] + stats.tokens + more if turn == 0 else first[:6] + rewrite)
        runs = run_conversation(both_formats, prompts[:3], 10, draft=draft, runner=runner, ignore_eos=True)
        assert [r["tokens"] for r in runs] == [s.tokens for s in expected]
        assert [(r["rounds"], r["graph_calls"], r["prefilled"]) for r in runs] == \
            [(s.rounds, dict(s.graph_calls), s.prefilled) for s in expected]
        kept = len(prompts[0]) + len(expected[0].tokens) - 1  # the reply's last token was never run
        assert [r["prefilled"] for r in runs] == [13, len(prompts[1]) - kept,
                                                  len(prompts[2]) - (0 if draft == "model" else 6)]
    out = subprocess.run([str(runner), str(both_formats), "--conversation", "--json"], input="1,2\n1,x\n",
                         capture_output=True, text=True)  # the first turn answered, the second refused
    assert out.returncode == 2 and out.stdout.count("\n") == 1 and len(out.stderr.splitlines()) == 1
    assert "turn 2 expects an integer, got 'x'" in out.stderr
    out = subprocess.run([str(runner), str(both_formats), "--conversation", "--prompt-ids", "1"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "drop --prompt-ids" in out.stderr.splitlines()[0]


def test_a_conversation_under_the_rule_decides_as_the_python_runtime(runner, both_formats, tmp_path):
    """--conversation --width rule: each turn's widths, rested rounds and calls are the Python runtime's in the same
    conversation (the context kept between turns, each turn's rule started afresh), and so its tokens."""
    import test_widths

    folder = test_widths._with_costs(both_formats, tmp_path, "executorch", test_widths.DEAR_DRAFTER)
    rng = np.random.default_rng(7)
    first, more, other = (rng.integers(3, 96, n).tolist() for n in (19, 4, 15))
    for draft in ("model", "prompt-lookup"):
        runtime = Runtime(folder, "executorch")
        cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, draft=draft, width="rule")
        prompts, expected = [first], []
        for turn in range(3):
            stats = Stats()
            list(runtime.generate(prompts[-1], cfg, stats, reuse=True))
            expected.append(stats)
            prompts.append(prompts[-1] + stats.tokens + more if turn == 0 else other)
        runs = run_conversation(folder, prompts[:3], 40, draft=draft, runner=runner, ignore_eos=True, width="rule")
        assert [(r["tokens"], r["rounds"], r["rested_rounds"], r["widths"], r["graph_calls"]) for r in runs] == \
            [(s.tokens, s.rounds, s.rested_rounds, {str(w): n for w, n in s.widths.items() if n}, dict(s.graph_calls))
             for s in expected]
        assert runs[1]["prefilled"] == len(more) + 1 and runs[2]["prefilled"] == len(other)


@pytest.mark.parametrize("costs", ["MIXED", "NARROW", "DEAR_DRAFTER"])
def test_the_width_rule_picks_the_python_runtimes_widths(runner, both_formats, tmp_path, costs):
    """--width rule, on the same programs and costs: the Python runtime's rule round for round (the same widths,
    rested rounds and graph calls: a resting drafter's rows folded in the same batches), target-only's tokens,
    with the drafter's blocks and with prompt-lookup's. The costs make the rule mix widths, keep to one draft,
    or rest the drafter."""
    import test_widths

    folder = test_widths._with_costs(both_formats, tmp_path, "executorch", getattr(test_widths, costs))
    runtime = Runtime(folder, "executorch")
    cases = [(prompt, draft) for prompt in (np.random.default_rng(5).integers(3, 96, 29).tolist(),
                                            [5, 17, 33, 8, 5, 17, 33, 8, 5]) for draft in ("prompt-lookup", "model")]
    for prompt, draft in cases:
        plain = python_stats(runtime, prompt, max_new_tokens=40, ignore_eos=True, draft="none").tokens
        code, (c,), err = run(runner, folder, prompt, "--max-new-tokens", "40", "--ignore-eos", "--width", "rule",
                              "--draft", draft)
        assert code == 0, err
        p = python_stats(runtime, prompt, max_new_tokens=40, ignore_eos=True, width="rule", draft=draft)
        assert c["tokens"] == p.tokens == plain
        assert c["widths"] == {str(w): n for w, n in p.widths.items() if n}
        assert (c["rounds"], c["rested_rounds"], c["accepted_per_slot"], c["graph_calls"]) == (
            p.rounds, p.rested_rounds, p.accepted_per_slot, dict(p.graph_calls))
    if costs == "NARROW":
        assert set(c["widths"]) <= {"1", "2"} and c["widths"]["2"] > 0  # the costs decide the width
    if costs == "DEAR_DRAFTER":
        assert c["rested_rounds"] > 0
    code, _, err = run(runner, both_formats, [4, 5, 6], "--width", "rule")  # no costs-executorch.json
    assert code != 0 and len(err.strip().splitlines()) == 1 and "--write-costs" in err


def test_profile_writes_the_runners_own_costs_and_the_rule_reads_them(runner, both_formats, tmp_path):
    """--profile times every call the loop makes at each committed length and prints the width rule's costs;
    --write-costs writes them beside the export (costs-hyflash-run.json, the schema of `hyflash profile
    --write-costs`), and --width rule then reads them before the Python runtime's costs-executorch.json: with
    its own costs making the drafter dear it rests the drafter, as the Python runtime's rule does on those costs.
    Bad input: one line, exit 2, nothing written."""
    import test_widths

    folder = test_widths._with_costs(both_formats, tmp_path, "executorch", test_widths.MIXED)
    own = folder / "costs-hyflash-run.json"
    out = subprocess.run([str(runner), str(folder), "--profile", "--contexts", "40,9", "--repeat", "3"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert not own.exists()  # printed only
    curve = CostCurve.from_json(printed)
    assert curve.lengths == (9, 40) and printed["backend"] == "hyflash-run" and printed["repeats"] == 3
    for costs in curve.points:
        assert set(costs.verify) == {1, 2, 4, 8} and min(costs.verify.values()) > 0
        assert costs.draft > 0 and costs.commit > 0
    out = subprocess.run([str(runner), str(folder), "--profile", "--contexts", "9", "--repeat", "2", "--write-costs"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "wrote" in out.stderr
    assert read_costs(folder, "hyflash-run", (2, 4, 8)).lengths == (9,)
    assert json.loads(own.read_text())["points"] == json.loads(out.stdout)["points"]

    prompt = np.random.default_rng(5).integers(3, 96, 29).tolist()
    write_costs(folder, "hyflash-run", CostCurve((1,), (test_widths.DEAR_DRAFTER,)), {})
    dear = Runtime(test_widths._with_costs(both_formats, tmp_path / "dear", "executorch", test_widths.DEAR_DRAFTER),
                   "executorch")
    p = python_stats(dear, prompt, max_new_tokens=40, ignore_eos=True, width="rule", draft="model")
    code, (c,), err = run(runner, folder, prompt, "--max-new-tokens", "40", "--ignore-eos", "--width", "rule")
    assert code == 0, err
    assert c["costs"] == "costs-hyflash-run.json" and c["rested_rounds"] == p.rested_rounds > 0
    assert (c["tokens"], c["widths"]) == (p.tokens, {str(w): n for w, n in p.widths.items() if n})
    own.unlink()  # then the Python runtime's costs (MIXED: drafts cheap), and its widths
    mixed = python_stats(Runtime(folder, "executorch"), prompt, max_new_tokens=40, ignore_eos=True, width="rule",
                         draft="model")
    code, (c,), err = run(runner, folder, prompt, "--max-new-tokens", "40", "--ignore-eos", "--width", "rule")
    assert c["costs"] == "costs-executorch.json" and c["rested_rounds"] == mixed.rested_rounds < p.rested_rounds
    assert c["widths"] == {str(w): n for w, n in mixed.widths.items() if n}

    for flags in (["--contexts", "0"], ["--contexts", "88"], ["--contexts", "9,x"], ["--repeat", "0"], []):
        bad = flags + (["--profile", "--write-costs"] if flags else ["--write-costs", "--prompt-ids", "1"])
        out = subprocess.run([str(runner), str(folder), *bad], capture_output=True, text=True)
        first = out.stderr.strip().splitlines()
        assert out.returncode == 2 and first[0].startswith("hyflash-run: error:"), (bad, out.stderr)
        assert not own.exists() and not list(folder.glob("*.partial"))


@pytest.mark.slow  # suite time: lowering a second program to .pte
def test_lookup_input_drafter_equals_the_python_runtime(runner, lookup_input_pte):
    """A drafter that reads prompt-lookup's block: the runner's lookup finds what Python's does (the same
    drafts, so the same rounds), on prompts with repeats and without."""
    rng = np.random.default_rng(4)
    phrase = rng.integers(3, 96, 9).tolist()
    prompts = [phrase + rng.integers(3, 96, 5).tolist() + phrase[:3], rng.integers(3, 96, 20).tolist(), [7]]
    _same_as_python(runner, lookup_input_pte, prompts, 30)


@pytest.mark.slow  # suite time: lowering the quantized tables to .pte
def test_quantized_embeddings_equal_the_python_runtime(runner, int4_embeddings_pte):
    """Programs calling ExecuTorch's quantized embedding kernels (--quantize-embeddings) run as in Python."""
    _same_as_python(runner, int4_embeddings_pte, [[5, 9, 14, 3, 77, 21, 40]], 24)


def test_stops_at_eos_as_the_python_runtime(runner, both_formats):
    runtime = Runtime(both_formats, "executorch")
    prompt = [5, 17, 33, 8, 61, 2, 40, 40, 12]
    free = python_stats(runtime, prompt, max_new_tokens=12, ignore_eos=True).tokens
    eos = sorted(runtime.eos)
    code, (c,), _ = run(runner, both_formats, prompt, "--max-new-tokens", "12")
    p = python_stats(runtime, prompt, max_new_tokens=12)
    assert c["tokens"] == p.tokens and c["stop_reason"] == p.stop_reason
    assert (c["stop_reason"] == "eos") == any(t in eos for t in free)


def test_sampled_runs_have_the_target_distribution(runner, both_formats, qwen3_dir):
    """T = 1.0, top-p 0.95: the token after the first verify round (the one the acceptance rule decides)
    follows the target's exact distribution, by the chi-square check of the Python loop's test."""
    prompt = [5, 17, 33, 8, 61, 2, 40, 40, 12]
    sampling = Sampling(temperature=1.0, top_p=0.95)
    exact = _exact_second_token_distribution(load_target(qwen3_dir), prompt, sampling)
    for flags in ([], ["--no-draft"]):
        code, runs, err = run(runner, both_formats, prompt, "--max-new-tokens", "2", "--ignore-eos", "--temperature",
                              "1.0", "--top-p", "0.95", "--repeat", "600", *flags)
        assert code == 0, err
        counts = np.bincount([r["tokens"][1] for r in runs], minlength=96)
        assert _gof(counts, exact) > 1e-3
        assert all(r["rounds"] == (0 if flags else 1) for r in runs)
    sampled = ("--max-new-tokens", "6", "--ignore-eos", "--temperature", "1.0")
    _, three, _ = run(runner, both_formats, prompt, *sampled, "--repeat", "3")
    _, again, _ = run(runner, both_formats, prompt, *sampled, "--repeat", "3")
    _, second, _ = run(runner, both_formats, prompt, *sampled, "--seed", "1")
    tokens = [r["tokens"] for r in three]
    assert tokens == [r["tokens"] for r in again] and second[0]["tokens"] == tokens[1]  # run i: seed + i


# what `hyflash generate --json` reports and the runner does not do: prompt-lookup and hybrid drafting
RUNNER_LEAVES_OUT = {"lookup_rounds", "skipped_reads"}


def test_json_has_the_keys_of_hyflash_generate(runner, both_formats):
    from hyflash.runtime_py.loop import Stats

    code, (c,), _ = run(runner, both_formats, [3, 4, 5], "--max-new-tokens", "9")
    assert set(c) == (set(Stats().to_json()) - RUNNER_LEAVES_OUT) | {"pte_kernels", "threads"}
    assert c["acceptance_length"] == (len(c["tokens"]) - 1) / c["rounds"]
    assert set(c["graph_ms"]) == {"prefill/target_prefill", "prefill/state_commit", "prefill/window_shift",
                                  "draft_read", "target_verify", "state_commit", "window_shift"}


def _tampered(folder, tmp_path, edit):
    copy = tmp_path / "export"
    shutil.copytree(folder, copy)
    edit(copy)
    return copy


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def _edit_manifest(folder):
    m = json.loads((folder / "manifest.json").read_text())
    m["window"] = m["window"] + 1
    (folder / "manifest.json").write_text(json.dumps(m))


def _undeclared_width(folder):
    from hyflash.runtime_py.manifest import seal

    m = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(seal({**m, "verify_widths": [2, 4, 6, 8]})))


def _unknown_verify_attention(folder):
    from hyflash.runtime_py.manifest import seal

    m = json.loads((folder / "manifest.json").read_text())
    m["cache"]["pte"]["verify_attention"] = "columns"
    (folder / "manifest.json").write_text(json.dumps(seal(m)))


BAD = {
    "no folder": (lambda f, t: t / "nowhere", [1, 2], "not a folder"),
    "model.pte changed": (lambda f, t: _tampered(f, t, lambda c: _flip_byte(c / "model.pte")), [1, 2],
                          "does not match the manifest"),
    "model.pte missing": (lambda f, t: _tampered(f, t, lambda c: (c / "model.pte").unlink()), [1, 2],
                          "missing from the export"),
    "manifest edited": (lambda f, t: _tampered(f, t, _edit_manifest), [1, 2], "manifest_sha256"),
    "a verify width without its graph": (lambda f, t: _tampered(f, t, _undeclared_width), [1, 2], "target_verify_6"),
    "an unknown verify attention": (lambda f, t: _tampered(f, t, _unknown_verify_attention), [1, 2],
                                    "cache.pte.verify_attention is not block or rows"),
    "id outside the vocabulary": (lambda f, t: f, [5, 96], "outside the vocabulary (0..95)"),
    "prompt too long": (lambda f, t: f, list(range(88)), "usable context is 88"),
    "empty prompt": (lambda f, t: f, [], "expects an integer"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_refused_in_one_line(runner, both_formats, tmp_path, case):
    make, prompt, message = BAD[case]
    folder = make(both_formats, tmp_path)
    out = subprocess.run([str(runner), str(folder), "--prompt-ids", ",".join(map(str, prompt))], capture_output=True,
                         text=True)
    assert out.returncode == 2 and out.stdout == ""
    first = out.stderr.splitlines()[0]
    assert first.startswith("hyflash-run: error: ") and message in first, out.stderr


def test_fp16_export_is_refused_in_one_line(runner, fp16_onnx):
    out = subprocess.run([str(runner), str(fp16_onnx), "--prompt-ids", "1,2"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1
    assert "runs fp32 exports only" in out.stderr and "--dtype fp32" in out.stderr, out.stderr


def test_unknown_option_is_refused(runner, both_formats):
    out = subprocess.run([str(runner), str(both_formats), "--prompt-ids", "1", "--temprature", "1"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "unknown option --temprature" in out.stderr


@pytest.mark.slow  # the reference target's .pte takes minutes to lower
def test_embedded_pair_greedy_equals_the_python_runtime(runner, reference_pte):
    """Held-out prompts of 256-2,000 tokens, with and without the trained drafter."""
    cfg = BenchConfig((reference_pte,), buckets=(256, 1024, 2001), prompts_per_bucket=1, max_new_tokens=48)
    tokenizer = Tokenizer.from_file(str(reference_pte / "tokenizer.json"))
    prompts = [p for group in make_prompts(tokenizer, source_texts(None), cfg, 2048).values() for p in group]
    runtime = _same_as_python(runner, reference_pte, prompts, 48)
    assert python_stats(runtime, prompts[0], max_new_tokens=48, ignore_eos=True).acceptance_length > 1.5


def test_manifest_checksum_matches_python_on_any_text(runner, both_formats, tmp_path):
    """The runner recomputes the manifest's checksum over Python's canonical JSON: non-ASCII text (written
    raw or escaped), control characters, astral-plane characters and floats in every form must agree."""
    from hyflash.runtime_py.manifest import seal

    for ensure_ascii in (True, False):
        folder = tmp_path / f"ascii-{ensure_ascii}"
        shutil.copytree(both_formats, folder)
        m = json.loads((folder / "manifest.json").read_text())
        m["notes"] = {"text": "héllo ✓ \U0001d11e \x7f\t\"\\/ end", "numbers": [1e-06, 10000.0, -0.0, 2.5e+20, 7]}
        (folder / "manifest.json").write_text(json.dumps(seal(m), indent=1, ensure_ascii=ensure_ascii),
                                              encoding="utf-8")
        code, runs, err = run(runner, folder, [1, 2, 3], "--max-new-tokens", "2")
        assert code == 0, err


def test_bench_chat_answers_with_the_runner_beside_the_python_runtime(runner, both_formats, tmp_path):
    """`bench --chat --runner`: hyflash-run answers every turn, one runner a conversation keeping its context, as
    the Python runtime does on the same programs, judged; against the ONNX graphs, reported for information."""
    from hyflash.cli import main
    from hyflash.runtime_py.chatbench import ChatBenchConfig, bench_chat, pooled

    folder = tmp_path / "chat"
    shutil.copytree(both_formats, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({  # the template's words: ids 1-3
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "w0",
        "chat_template": "{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
                         "{% if add_generation_prompt %}w3 {% endif %}"}))
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"turns": ["w5 w6 w7"], "category": "a"}) + "\n"
                     + json.dumps({"turns": ["w9 w8", "w7 w7 w7"], "category": "b"}) + "\n")
    report = bench_chat(ChatBenchConfig(artifacts=(folder,), chat=chats, max_new_tokens=6, backend="executorch",
                                        runner=runner, threads=1), progress=False)
    rows = pooled(report)
    native = rows["chat/hyflash-run/none"]
    assert report["exact"] and report["runner"] == str(runner) and report["pte_kernels"] == "hyflash"
    assert native["answers"] == 3 and native["same_as_target_only"] == 1.0 and native["speedup"] == 1.0
    assert native["same_compared_with"] == "chat/none" and native["tau"] == 1.0
    assert [c["answer_tokens"] for c in report["per_conversation"]["chat/hyflash-run/none"]] == \
        [c["answer_tokens"] for c in report["per_conversation"]["chat/none"]]
    lookup = rows["chat/hyflash-run/prompt-lookup"]  # the runner's prompt-lookup: Python's rounds on its prompts
    assert lookup["same_as_target_only"] == 1.0 and lookup["same_compared_with"] == "chat/hyflash-run/none"
    assert lookup["tau"] == rows["chat/prompt-lookup"]["tau"]
    onnx = bench_chat(ChatBenchConfig(artifacts=(folder,), chat=chats, max_new_tokens=6, runner=runner, limit=1),
                      progress=False)
    assert "chat/hyflash-run/none" in pooled(onnx) and onnx["exact"]  # compared, not judged
    assert main(["bench", str(folder), "--runner", str(runner)]) == 2  # --runner goes with --chat
    assert main(["bench", str(folder), "--chat", str(chats), "--runner", str(tmp_path / "nowhere")]) == 2
