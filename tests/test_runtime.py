"""The speculative loop: lossless (greedy token for token, sampled in distribution), and its edges."""

import json

import numpy as np
import pytest
import torch
from conftest import CONTEXT
from scipy.stats import chisquare

from hyflash.cli import main
from hyflash.models.loading import load_target
from hyflash.runtime_py import loop as loop_module
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
from hyflash.runtime_py.sampling import Sampling


def generate(runtime, prompt, **kw):
    stats = Stats()
    tokens = [t for new in runtime.generate(prompt, GenerationConfig(**kw), stats) for t in new]
    assert tokens == stats.tokens
    return tokens, stats


@pytest.mark.parametrize("backend", ["eager", "onnxruntime", "executorch"])
def test_greedy_speculative_equals_target_only_equals_transformers(both_formats, hf_checkpoint, backend):
    _, hf = hf_checkpoint("qwen3")  # the same random weights the export was made from (seed 0)
    runtime = Runtime(both_formats, backend)
    prompt = np.random.default_rng(1).integers(3, 96, 29).tolist()
    spec, stats = generate(runtime, prompt, max_new_tokens=40, ignore_eos=True)
    plain, _ = generate(runtime, prompt, max_new_tokens=40, ignore_eos=True, draft="none")
    lookup, _ = generate(runtime, prompt, max_new_tokens=40, ignore_eos=True, draft="prompt-lookup")
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=40, min_new_tokens=40, do_sample=False,
                          pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    assert spec == plain == lookup == ref
    assert stats.rounds > 0 and 1.0 <= stats.acceptance_length <= 8.0


def test_rejected_drafts_never_reach_the_state(both_formats, qwen3_dir):
    runtime = Runtime(both_formats)
    committed = record_commits(runtime)
    prompt = np.random.default_rng(2).integers(3, 96, 21).tolist()
    tokens, stats = generate(runtime, prompt, max_new_tokens=30, ignore_eos=True, draft="model")
    rows = np.concatenate(committed)
    sequence = prompt + tokens
    # committed: every prompt token and every emitted token except the last anchor, in order
    assert rows.shape[0] == len(sequence) - 1
    target = load_target(qwen3_dir)
    with torch.no_grad():
        _, feats = target(torch.tensor([sequence[:-1]]))
    np.testing.assert_allclose(rows, feats[0].numpy(), atol=1e-4)
    assert stats.rounds > sum(stats.accepted_per_slot[:1])  # there were rejections to leave out


def record_commits(runtime) -> list:
    """The feature rows every state_commit call of `runtime` folds in, in order (both context copies' calls)."""
    committed = []
    for i in (0, 1):
        call = runtime.calls["state_commit", i]

        def record(call=call, run=call.run):
            committed.append(call.inputs["features"][:int(call.inputs["n_valid"][0])].copy())
            run()

        call.run = record
    return committed


def _exact_second_token_distribution(target, prompt, sampling):
    """p(t2) = sum_t1 p(t1 | prompt) p(t2 | prompt, t1), by eager forward passes."""
    with torch.no_grad():
        p1 = sampling.probs(target(torch.tensor([prompt]))[0][0, -1].numpy())
        v = p1.shape[0]
        batch = torch.tensor([prompt + [t] for t in range(v)])
        p2 = sampling.probs(target(batch)[0][:, -1].numpy())
    return p1 @ p2


def _second_tokens(runtime, prompt, sampling, n, draft):
    out = []
    for seed in range(n):
        tokens, _ = generate(runtime, prompt, max_new_tokens=2, ignore_eos=True, draft=draft, sampling=sampling,
                             seed=seed)
        out.append(tokens[1])
    return np.bincount(out, minlength=96)


def _gof(counts, p):
    mask = p * counts.sum() >= 5  # pool rare tokens into one bin
    obs = np.append(counts[mask], counts[~mask].sum())
    exp = np.append(p[mask], p[~mask].sum()) * counts.sum()
    return chisquare(obs[exp > 0], exp[exp > 0]).pvalue


def test_sampled_loop_has_the_target_distribution(both_formats, qwen3_dir, monkeypatch):
    """Seeded runs end to end: the token after the first verify round follows the target's exact
    distribution (chi-square), drafted or not; a loop that accepts every draft fails the test."""
    runtime = Runtime(both_formats)
    prompt = [5, 17, 33, 8, 61, 2, 40, 40, 12]
    sampling = Sampling(temperature=1.0, top_p=0.95)
    exact = _exact_second_token_distribution(load_target(qwen3_dir), prompt, sampling)
    n = 600
    assert _gof(_second_tokens(runtime, prompt, sampling, n, "model"), exact) > 1e-3
    assert _gof(_second_tokens(runtime, prompt, sampling, n, "none"), exact) > 1e-3
    monkeypatch.setattr(loop_module, "accept", lambda drafts, logits, sampling, rng: (7, 0))
    assert _gof(_second_tokens(runtime, prompt, sampling, n, "model"), exact) < 1e-6


@pytest.mark.parametrize("broken", [False, True])
def test_acceptance_rule_emits_the_target_distribution(broken):
    """The rule itself, many draws: the first two emitted tokens follow p_0 then p_1 exactly. The
    classic bug (resampling from p_0 instead of the residual after a rejection) is caught."""
    from hyflash.runtime_py import sampling as sampling_module

    rng = np.random.default_rng(0)
    v = 6
    logits = rng.normal(0, 1.5, (8, v))
    sampling = Sampling(temperature=1.0)
    p = sampling.probs(logits)
    drafts = np.array([int(np.argmax(p[0]))] + [int(np.argmax(p[i])) for i in range(1, 7)])
    counts = np.zeros(v)
    for _ in range(20000):
        k, bonus = sampling_module.accept(drafts, logits, sampling, rng)
        if broken and k == 0:
            bonus = int(rng.choice(v, p=p[0]))  # the bug: ignores that d_1 was just rejected
        counts[drafts[0] if k >= 1 else bonus] += 1
    pvalue = chisquare(counts, p[0] * counts.sum()).pvalue
    assert (pvalue < 1e-6) if broken else (pvalue > 1e-3)


def test_sampling_is_reproducible(both_formats):
    runtime = Runtime(both_formats)
    kw = dict(max_new_tokens=20, ignore_eos=True, sampling=Sampling(0.8, 0.9), seed=7)
    assert generate(runtime, [4, 5, 6], **kw)[0] == generate(runtime, [4, 5, 6], **kw)[0]


def test_eos_inside_an_accepted_block_stops_there(both_formats):
    runtime = Runtime(both_formats)
    prompt = np.random.default_rng(3).integers(3, 96, 12).tolist()
    free, _ = generate(runtime, prompt, max_new_tokens=50, ignore_eos=True, draft="prompt-lookup")
    eos = free[10]
    runtime.eos = {eos}
    for draft in ("prompt-lookup", "model", "none"):
        tokens, stats = generate(runtime, prompt, max_new_tokens=50, draft=draft)
        assert tokens == free[:free.index(eos) + 1] and stats.stop_reason == "eos"
    tokens, _ = generate(runtime, prompt, max_new_tokens=50, ignore_eos=True, draft="prompt-lookup")
    assert tokens == free


def test_usable_context_stops_both_modes_at_the_same_token(both_formats):
    runtime = Runtime(both_formats)
    prompt = np.random.default_rng(4).integers(3, 96, 40).tolist()
    a, sa = generate(runtime, prompt, max_new_tokens=500, ignore_eos=True)
    b, sb = generate(runtime, prompt, max_new_tokens=500, ignore_eos=True, draft="none")
    assert a == b and len(prompt) + len(a) == CONTEXT - 8
    assert "usable context" in sa.stop_reason and sa.stop_reason == sb.stop_reason


@pytest.mark.parametrize("ids,message", [("", "empty"), ("5,96", "outside the vocabulary"), ("5,-1", "non-negative integers"),
                                         (",".join(["7"] * (CONTEXT - 8)), "usable context")])
def test_bad_prompts_are_refused(both_formats, ids, message, capsys):
    assert main(["generate", str(both_formats), "--prompt-ids", ids]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_generate_json_and_text(both_formats, capsys):
    assert main(["generate", str(both_formats), "--prompt", "w5 w6 w7", "--max-new-tokens", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("tokens", "text", "rounds", "acceptance_length", "accepted_per_slot", "tokens_per_s", "graph_ms",
                "drafter_context_bytes"):
        assert key in out
    assert len(out["tokens"]) == 12 and out["text"].split() == [f"w{t}" for t in out["tokens"]]


def test_onnxruntime_binds_every_buffer_once_and_in_place(both_formats):
    """No per-call copies: every OrtValue the calls hold is a view of the runtime's own array (the
    same address), the target's present_* outputs are the very past_* buffers, and those stay put
    across a whole generation."""
    runtime = Runtime(both_formats)
    verify = runtime.calls["target_verify"]
    arrays = [*verify.inputs.values(), *verify.outputs.values()]
    layers = [b for i in range(runtime.cache.layers) for b in runtime.cache.layer(i)]
    addresses = {v.data_ptr() for v in verify.held}
    assert addresses == {a.ctypes.data for a in arrays + layers}
    assert len(verify.held) == len(arrays) + len(layers)  # one OrtValue per cache buffer: past and present
    before = runtime.cache.data.ctypes.data, {k: v.ctypes.data for k, v in verify.outputs.items()}
    prompt = np.random.default_rng(4).integers(3, 96, 20).tolist()
    generate(runtime, prompt, max_new_tokens=24, ignore_eos=True)
    assert (runtime.cache.data.ctypes.data, {k: v.ctypes.data for k, v in verify.outputs.items()}) == before
    assert np.abs(runtime.cache.data[:, :, :, :, :len(prompt)]).sum() > 0  # the graphs wrote the rows


def test_cache_and_context_rules(both_formats):
    runtime = Runtime(both_formats, "eager")
    cache, ctx = runtime.cache, runtime.ctx
    cache.commit(0, 10)
    cache.check_room(10, 8)  # the next block: fine
    cache.check_room(4, 8)  # a block behind the committed end (stale rows ahead of it): fine
    with pytest.raises(ValueError, match="does not fit the cache"):
        cache.check_room(11, 8)  # would skip an unwritten row
    with pytest.raises(ValueError, match="does not fit the cache"):
        cache.commit(0, CONTEXT - 4)
        cache.check_room(CONTEXT - 4, 8)  # past the last row
    first, second = ctx.current, ctx.other
    feats = np.ones((8, runtime.contract.io("window_shift", "features")["shape"][1]), np.float32)
    runtime.fold(feats, 0, 3)
    assert ctx.current is second and ctx.other is first  # written into the other copy, which is now current
    assert ctx.current["win_pos"][-3:].tolist() == [0, 1, 2] and (ctx.current["win_pos"][:-3] == -1).all()
