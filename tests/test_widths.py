"""Verify widths: the rule picks the width that pays, and every width and the rule are exact."""

import json
import shutil

import numpy as np
import pytest
import torch
from test_runtime import _exact_second_token_distribution, _gof, generate, record_commits

from hyflash.cli import main
from hyflash.export.validate import target_calls
from hyflash.models.hybrid import calibration, drafter_chain, lookup_chain
from hyflash.models.loading import load_target
from hyflash.models.widths import CostCurve, Costs, WidthRule, best_width, expected_tokens
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
from hyflash.runtime_py.manifest import ArtifactError, load_manifest, seal, verify_graph
from hyflash.runtime_py.sampling import Sampling
from hyflash.runtime_py.verifying import COSTS_FILE, write_costs

FP32_LIKE = Costs({1: 23.0, 2: 24.5, 4: 27.0, 8: 31.0}, draft=3.0, commit=0.6)  # verify 8 = 1.35 decodes
INT4_LIKE = Costs({1: 10.5, 2: 13.0, 4: 19.0, 8: 35.0}, draft=3.0, commit=0.6)  # verify 8 = 3.3 decodes


def policy_rate(chains: np.ndarray, costs: Costs, choose) -> float:
    """Expected tokens per ms over rounds whose true chain probabilities are `chains`, the width of each
    round chosen by choose(chain) (the drafter always run)."""
    tokens = ms = 0.0
    for chain in chains:
        w = choose(chain)
        tokens += expected_tokens(chain, (w,))[0]
        ms += costs.verify[w] + costs.draft + costs.commit
    return tokens / ms


def synthetic_chains(rng, n: int, easy: float) -> np.ndarray:
    """Chains q_k = prod of per-slot pass rates, a share `easy` of rounds confident, the rest not."""
    per_slot = np.where(rng.random((n, 1)) < easy, rng.uniform(0.8, 0.98, (n, 7)), rng.uniform(0.05, 0.4, (n, 7)))
    return np.cumprod(per_slot, axis=1)


@pytest.mark.parametrize("costs", [FP32_LIKE, INT4_LIKE], ids=["fp32-like", "int4-like"])
@pytest.mark.parametrize("easy", [0.1, 0.5, 0.9])
def test_the_rule_beats_every_fixed_width_on_synthetic_rounds(costs, easy):
    chains = synthetic_chains(np.random.default_rng(0), 4000, easy)
    fixed = {w: policy_rate(chains, costs, lambda c, w=w: w) for w in costs.widths}
    rule = WidthRule(costs)
    for _ in range(3):  # the rate the rule runs at settles on the policy's own
        rule.tokens, rule.ms = 1.0, 1.0 / policy_rate(chains, costs, lambda c: best_width(c, costs, rule.rate)[0])
    ruled = policy_rate(chains, costs, lambda c: best_width(c, costs, rule.rate)[0])
    assert ruled >= max(fixed.values()) - 1e-12
    picks = {best_width(c, costs, rule.rate)[0] for c in chains}
    assert len(picks) > 1  # it adapts round by round: mixed rounds, mixed widths


def test_the_rule_picks_what_the_arithmetic_says():
    sure, hopeless = np.full(7, 0.99), np.zeros(7)
    assert best_width(sure, FP32_LIKE, 1 / 23.0)[0] == 8  # cheap verify, sure drafts: verify them all
    assert best_width(hopeless, FP32_LIKE, 1 / 23.0)[0] == 1  # nothing to gain: a plain step
    half = np.cumprod(np.full(7, 0.5))
    assert best_width(half, INT4_LIKE, 1 / 10.5)[0] == 2  # dear verify: only the likeliest draft
    np.testing.assert_allclose(expected_tokens(np.array([0.5, 0.25, 0.1]), (1, 2, 3, 4)), [1, 1.5, 1.75, 1.85])


def test_the_drafter_rests_while_it_does_not_pay_and_is_tried_again():
    rule = WidthRule(FP32_LIKE)
    hopeless = np.zeros(7)
    rested = []
    for _ in range(40):
        if rule.drafts():
            assert rule.pick(hopeless, FP32_LIKE) == 1
            rested.append(False)
        else:
            rested.append(True)
    assert rested.count(False) >= 4  # tried again now and then
    gaps = [len(g) for g in "".join("r" if r else "." for r in rested).split(".")[:-1] if g]  # complete rests
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # resting longer each time drafting still does not pay
    while not rule.drafts():  # the rest under way ends
        pass
    rule.pick(np.full(7, 0.99), FP32_LIKE)
    assert rule.drafts() and rule.cooldown == 1  # a round that pays ends the cool-down


def test_one_unsure_block_does_not_rest_a_streak_that_pays_but_a_streak_gone_bad_does():
    """The rest is judged on the streak's average gain: blocks the drafter is sure of, one in three of them
    hopeless, keep it drafting every round; once every block is hopeless, the average turns and it rests. A
    round after a rest starts a new streak: one that pays a little ends the rest, whatever came before it."""
    rule = WidthRule(FP32_LIKE)
    sure, hopeless = np.full(7, 0.9), np.zeros(7)
    for i in range(30):
        assert rule.drafts()  # never rested
        rule.pick(hopeless if i % 3 == 2 else sure, FP32_LIKE)
        rule.made(4, 31.0)
    assert rule.cooldown == 1
    bad = 0
    while rule.drafts() and bad < 40:
        rule.pick(hopeless, FP32_LIKE)
        rule.made(1, 26.6)
        bad += 1
    # a hopeless round costs only its draft_read, a sure one earned tokens: several of them outweigh the streak
    assert 1 < bad < 20 and rule.cooldown == 2  # a rest of one plain step was taken (the last drafts() call)
    assert rule.drafts()
    rule.pick(hopeless, FP32_LIKE)  # a round after a rest that does not pay rests it again,
    assert not rule.drafts() and not rule.drafts() and rule.drafts()  # twice as long

    def gain_alone(chain):  # what a round of `chain` gains over plain decoding, judged on its own
        return rule.round_gain(best_width(chain, FP32_LIKE, rule.rate)[1], FP32_LIKE)

    lost = gain_alone(hopeless)
    marginal = next(np.full(7, q) for q in np.linspace(0.05, 0.95, 91) if 0 < gain_alone(np.full(7, q)) < -lost)
    rule.pick(marginal, FP32_LIKE)  # a round after a rest that pays a little: judged on its own, not averaged
    assert rule.cooldown == 1 and rule.drafts()  # with the hopeless rounds before the rest, it would not pay


def test_the_rule_learns_what_an_overconfident_source_delivers():
    """Chains that promise 2.5x what passes (a drafter calibrated on its own training text), at a dear verify:
    the correction moves toward the realised share, and with it the rule rests the drafter, which the same
    rule taking the chains at their word never does."""
    from hyflash.models.widths import ChainCorrection
    from hyflash.runtime_py.drafting import Proposal
    from hyflash.runtime_py.verifying import RuleWidth

    claimed = np.cumprod(np.full(7, 0.8))

    def run(correct: bool):
        rng = np.random.default_rng(0)
        policy = RuleWidth(CostCurve((1,), (INT4_LIKE,)), 1, uses_drafter=True)
        if not correct:
            policy.corrections["drafter"].observe = lambda *a: None
        rests = 0
        for _ in range(400):
            if not policy.drafts(1):
                rests += 1
                policy.made(0, 1, None, 1)
                continue
            proposal = Proposal(np.zeros(7, np.int64), 5.0, claimed, read=True)
            w = policy.width(proposal, 1)
            policy.made(int(min((rng.random() < 0.4 * claimed).sum(), w - 1)), w, proposal, 1)
        return policy.corrections["drafter"], rests

    corrected, rests = run(True)
    trusting, never = run(False)
    assert corrected.scale < 0.7 and trusting.scale == ChainCorrection().scale == 1.0
    assert rests > 100 and never == 0


def test_cost_curve_interpolates_and_round_trips():
    a, b = Costs({1: 10.0, 8: 20.0}, 2.0, 1.0), Costs({1: 20.0, 8: 40.0}, 4.0, 3.0)
    curve = CostCurve((256, 1024), (a, b))
    mid = curve.at(640)
    assert mid.verify == {1: 15.0, 8: 30.0} and (mid.draft, mid.commit) == (3.0, 2.0)
    assert curve.at(10) == a and curve.at(5000) == b
    assert CostCurve.from_json(json.loads(json.dumps(curve.to_json()))) == curve
    with pytest.raises(ValueError, match="width 1"):
        CostCurve((256,), (Costs({8: 20.0}),))


def test_calibrated_chains_read_the_slot_tables():
    rng = np.random.default_rng(0)
    n = 4000
    conf = np.cumprod(rng.uniform(0.3, 1.0, (n, 7)), axis=1)
    accepted = np.minimum((rng.random((n, 1)) < 0.5 * conf).sum(1), 7)  # a head that claims twice what happens
    match = rng.integers(0, 4, n)
    lookup = np.where(match > 0, rng.integers(0, 8, n), 0)
    cal = calibration({"expected": conf.sum(1), "drafter": accepted, "match": match, "lookup": lookup,
                       "confidence": conf})
    chains = np.stack([drafter_chain(cal, c) for c in conf[:500]])
    assert np.all(np.diff(chains, axis=1) <= 0)
    # the head claims twice what passes; the tables take it back (to within their bins' width)
    assert abs(chains.sum() / (0.5 * conf[:500].sum()) - 1) < 0.1
    assert lookup_chain(cal, 0, 7).sum() == 0.0  # no match ever passed
    np.testing.assert_allclose(lookup_chain(cal, 2, 7)[0], (lookup[match == 2] > 0).mean())
    assert lookup_chain(None, 3, 7).tolist() == [1.0] * 7 and lookup_chain(None, 0, 7).sum() == 0


def test_validation_runs_every_verify_width():
    calls = target_calls(160, 16, (2, 4, 8))
    assert {g for g, _, _ in calls} == {"target_prefill", "target_verify", "target_verify_2", "target_verify_4",
                                        "target_decode"}
    assert all(n == int(g.rsplit("_", 1)[1]) for g, _, n in calls if g.startswith("target_verify_"))
    for chunk in (80, 88):  # a chunk that leaves no room before the end: the narrow widths run at the end
        late = target_calls(96, chunk, (2, 4, 8))
        assert {"target_verify_2", "target_verify_4"} <= {g for g, _, _ in late}
        assert all(p + n <= 96 for _, p, n in late)


def test_manifest_declares_its_widths(both_formats, tmp_path):
    m = load_manifest(both_formats)
    assert m["verify_widths"] == [2, 4, 8] and m["format_version"] == 4
    for w in (2, 4, 8):
        assert m["graphs"][verify_graph(w)]["inputs"][0]["shape"] == [w]
    folder = tmp_path / "x"
    shutil.copytree(both_formats, folder)
    bad = dict(m, verify_widths=[2, 4, 6, 8])
    (folder / "manifest.json").write_text(json.dumps(seal(bad)))
    with pytest.raises(ArtifactError, match="target_verify_6"):
        load_manifest(folder)


def _with_costs(folder, tmp_path, backend, costs: Costs):
    out = tmp_path / "export"
    shutil.copytree(folder, out)
    write_costs(out, backend, CostCurve((1,), (costs,)), {})
    return out


MIXED = Costs({1: 10.0, 2: 10.6, 4: 11.6, 8: 13.5}, draft=0.4, commit=0.05)  # cheap drafts, a cheap full verify
NARROW = Costs({1: 10.0, 2: 10.2, 4: 40.0, 8: 80.0}, draft=0.4, commit=0.05)  # only a one-draft verify pays
DEAR_DRAFTER = Costs({1: 10.0, 2: 10.6, 4: 11.6, 8: 13.5}, draft=200.0, commit=0.05)  # the drafter rests


@pytest.mark.parametrize("backend", ["onnxruntime", "executorch"])
def test_greedy_is_target_only_at_every_width_and_under_the_rule(both_formats, tmp_path, backend):
    folder = _with_costs(both_formats, tmp_path, backend, MIXED)
    runtime = Runtime(folder, backend)
    prompt = np.random.default_rng(1).integers(3, 96, 29).tolist()
    kw = dict(max_new_tokens=40, ignore_eos=True)
    plain, _ = generate(runtime, prompt, draft="none", **kw)
    for draft in ("model", "prompt-lookup"):
        for width in (2, 4, 8, "rule"):
            tokens, stats = generate(runtime, prompt, draft=draft, width=width, **kw)
            assert tokens == plain, (draft, width)
            if width != "rule":
                assert set(stats.widths) == {width}
    write_costs(folder, backend, CostCurve((1,), (NARROW,)), {})
    tokens, narrow = generate(Runtime(folder, backend), prompt, draft="model", width="rule", **kw)
    assert tokens == plain and set(narrow.widths) <= {1, 2} and narrow.widths[2] > 0  # the costs decide the width


def test_a_resting_drafter_still_folds_every_committed_row_once(both_formats, qwen3_dir, tmp_path):
    folder = _with_costs(both_formats, tmp_path, "onnxruntime", DEAR_DRAFTER)
    runtime = Runtime(folder)
    committed = record_commits(runtime)
    prompt = np.random.default_rng(2).integers(3, 96, 21).tolist()
    tokens, stats = generate(runtime, prompt, max_new_tokens=40, ignore_eos=True, draft="model", width="rule")
    plain, _ = generate(Runtime(folder), prompt, max_new_tokens=40, ignore_eos=True, draft="none")
    assert tokens == plain
    assert stats.rested_rounds > 0 and stats.widths[1] >= stats.rested_rounds
    sequence = prompt + tokens
    rows = np.concatenate(committed)
    assert rows.shape[0] == len(sequence) - 1  # every committed row, once, in order: rested ones in batches
    with torch.no_grad():
        _, feats = load_target(qwen3_dir)(torch.tensor([sequence[:-1]]))
    np.testing.assert_allclose(rows, feats[0].numpy(), atol=1e-4)


def test_each_turn_of_a_conversation_starts_the_rule_afresh(both_formats, tmp_path):
    """A conversation's next turn keeps the context (only its new rows prefilled) but not the rule's account: it
    decides as a runtime that never ran the turn before would (keeping the account was measured and did not pay:
    docs/results-smollm2.md, "The width rule across a conversation's turns"). Tokens stay target-only's."""
    folder = _with_costs(both_formats, tmp_path, "onnxruntime", DEAR_DRAFTER)
    rng = np.random.default_rng(3)
    first = rng.integers(3, 96, 21).tolist()

    def turn(runtime, prompt):
        stats = Stats()
        cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, width="rule", draft="model")
        list(runtime.generate(prompt, cfg, stats, reuse=True))
        return stats

    kept = Runtime(folder)
    one = turn(kept, first)
    assert one.rested_rounds > 0  # the drafter rested: the account a next turn could have kept
    second = first + one.tokens + rng.integers(3, 96, 4).tolist()
    two, afresh = turn(kept, second), turn(Runtime(folder), second)
    plain, _ = generate(Runtime(folder), second, max_new_tokens=40, ignore_eos=True, draft="none")
    assert two.tokens == afresh.tokens == plain
    assert two.prefilled == 5 and afresh.prefilled == len(second)

    def decoding(s):  # the rounds and their calls (prefill's differ: one kept the context)
        return s.rounds, s.rested_rounds, s.widths, {g: n for g, n in s.graph_calls.items() if "/" not in g}

    assert decoding(two) == decoding(afresh)


def test_sampled_loop_keeps_the_target_distribution_at_a_narrow_width(both_formats, qwen3_dir):
    """The chi-square test of the full block, each round verifying one draft (the second token comes from the
    first round's accepted draft or its bonus)."""
    runtime = Runtime(both_formats)
    prompt = [5, 17, 33, 8, 61, 2, 40, 40, 12]
    sampling = Sampling(temperature=1.0, top_p=0.95)
    exact = _exact_second_token_distribution(load_target(qwen3_dir), prompt, sampling)
    second = [generate(runtime, prompt, max_new_tokens=2, ignore_eos=True, draft="model", sampling=sampling,
                       seed=seed, width=2)[0][1] for seed in range(600)]
    assert _gof(np.bincount(second, minlength=96), exact) > 1e-3


def test_the_rule_without_costs_is_one_clear_line(both_formats, capsys):
    code = main(["generate", str(both_formats), "--prompt-ids", "4,5,6", "--max-new-tokens", "4", "--width", "rule"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--write-costs" in err


def test_profile_writes_the_costs_the_rule_reads(both_formats, tmp_path):
    folder = tmp_path / "export"
    shutil.copytree(both_formats, folder)
    assert main(["profile", str(folder), "--contexts", "16,48", "--repeats", "2", "--new-tokens", "4",
                 "--no-optimum", "--write-costs", "--json"]) == 0
    curve = Runtime(folder).cost_curve()
    assert curve.lengths == (16, 48) and set(curve.points[0].verify) == {1, 2, 4, 8}
    assert json.loads((folder / COSTS_FILE.format(backend="onnxruntime")).read_text())["backend"] == "onnxruntime"


def test_bench_runs_each_drafting_mode_under_each_width_policy(both_formats):
    from hyflash.runtime_py.chatbench import modes

    assert modes(Runtime(both_formats), ("full", 2, "rule")) == ["none", "prompt-lookup", "prompt-lookup@2",
                                                                  "prompt-lookup@rule"]

