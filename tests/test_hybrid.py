"""Hybrid drafting's rule: constants from measured rounds, the larger expectation wins."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hyflash.models.hybrid import (
    BIN_EDGES,
    bin_index,
    calibration,
    choose_lookup,
    drafter_expected,
    held_out_hybrid,
    hybrid_rounds,
    reliability,
    skip_drafter,
    skipped_matches,
    tables,
)
from hyflash.models.lookup import lookup


def rounds(n=400, seed=0):
    """A drafter whose head says 2x what it realises, and a lookup that is right for n = 3 only."""
    rng = np.random.default_rng(seed)
    expected = rng.uniform(0, 7, n)
    match = rng.integers(0, 4, n)
    return {"expected": expected, "drafter": np.floor(expected / 2), "match": match.astype(float),
            "lookup": np.where(match == 3, 6.0, 0.0)}


def test_calibration_tables_hold_what_was_measured():
    r = rounds()
    cal = calibration(r)
    assert [row["match"] for row in cal["lookup"]] == [0, 1, 2, 3]
    assert cal["lookup"][3]["mean_accepted"] == 6.0 and cal["lookup"][1]["mean_accepted"] == 0.0
    assert sum(row["rounds"] for row in cal["lookup"]) == 400 == sum(b["rounds"] for b in cal["drafter_bins"])
    for b in cal["drafter_bins"]:  # the head is overconfident by 2x: realised ~ predicted / 2
        if b["rounds"]:
            assert b["from"] <= b["predicted"] <= b["to"] and b["predicted"] / 2 - 1 <= b["realised"] <= b["predicted"] / 2
    assert cal["mean_accepted"]["better_of_two"] >= max(cal["mean_accepted"]["drafter"], cal["mean_accepted"]["lookup"])
    # the joint cells partition the rounds as the two marginal tables do
    joint = np.asarray([[c["rounds"] for c in row] for row in cal["joint"]])
    assert joint.sum(0).tolist() == [b["rounds"] for b in cal["drafter_bins"]]
    assert joint.sum(1).tolist() == [row["rounds"] for row in cal["lookup"]]


def test_by_agreement_counts_where_the_blocks_part_and_who_went_further():
    r = {"expected": np.full(7, 3.0), "match": np.full(7, 2.0),
         "drafter": np.asarray([7.0, 2, 6, 5, 1, 1, 3]), "lookup": np.asarray([7.0, 6, 2, 2, 1, 4, 1]),
         "agree": np.asarray([7, 2, 2, 2, 1, 1, 1])}
    rows = calibration(r)["by_agreement"]
    assert [row["agree"] for row in rows] == list(range(8)) and sum(row["rounds"] for row in rows) == 7
    assert rows[2] == {"agree": 2, "rounds": 3, "drafter": 13 / 3, "lookup": 10 / 3, "lookup_further": 1 / 3,
                       "drafter_further": 2 / 3}
    assert rows[1] == {"agree": 1, "rounds": 3, "drafter": 5 / 3, "lookup": 2.0, "lookup_further": 1 / 3,
                       "drafter_further": 1 / 3}
    assert rows[7]["lookup_further"] == rows[7]["drafter_further"] == 0.0 and rows[0]["rounds"] == 0
    assert "by_agreement" not in calibration({k: v for k, v in r.items() if k != "agree"})


def test_held_out_hybrid_judges_each_half_by_the_other():
    """The rule fitted on one half of the rounds, scored on the other: where the two halves disagree (noise
    a per-cell pick would fit), the in-sample figure flatters, the held-out one does not."""
    rng = np.random.default_rng(3)
    n = 4000  # lookup and drafter equally good on average; which wins a cell is noise
    r = {"expected": rng.uniform(0, 7, n), "drafter": rng.integers(0, 8, n).astype(float),
         "match": rng.integers(0, 4, n).astype(float), "lookup": rng.integers(0, 8, n).astype(float)}
    first = {k: v[:n // 2] for k, v in r.items()}
    assert (held_out_hybrid(r)[:n // 2] == hybrid_rounds(tables({k: v[n // 2:] for k, v in r.items()}), first)).all()
    in_sample = hybrid_rounds(tables(r), r).mean()
    assert in_sample > held_out_hybrid(r).mean() + 0.1 and in_sample > max(r["drafter"].mean(), r["lookup"].mean()) + 0.1


def test_rule_uses_the_realised_means_not_the_heads_word():
    cal = calibration(rounds())
    # the head says 6.5 (realised ~3): a 3-gram lookup match (realised 6) wins, a 1-gram one (0) does not
    assert choose_lookup(cal, 6.5, 3) and not choose_lookup(cal, 6.5, 1)
    assert drafter_expected(cal, 6.5) < 4
    # a thin bin keeps the head's own figure
    thin = {**cal, "drafter_bins": [{**b, "rounds": 1} for b in cal["drafter_bins"]]}
    assert drafter_expected(thin, 6.5) == 6.5
    r = rounds(seed=1)
    assert hybrid_rounds(cal, r).mean() > max(r["drafter"].mean(), r["lookup"].mean())


def test_rule_compares_both_blocks_within_the_rounds_own_cell():
    """Lookup right only where the drafter is confident (text both find easy; a drafter that reads lookup's
    block knows when it is right): lookup's mean over all 3-gram rounds (~1.7) beats the drafter's where the
    head doubts itself, yet lookup is wrong exactly there. The joint table sees it; the marginal rule (a
    calibration without `joint`) picks lookup there and falls below the drafter alone."""
    rng = np.random.default_rng(0)
    expected = rng.uniform(0, 7, 2000)
    r = {"expected": expected, "drafter": np.floor(expected), "match": np.full(2000, 3.0),
         "lookup": np.where(expected >= 5, 6.0, 0.0)}
    cal = calibration(r)
    assert cal["joint"][3][bin_index(5.5)]["lookup"] == 6.0 and cal["joint"][3][bin_index(1.5)]["lookup"] == 0.0
    assert not choose_lookup(cal, 1.5, 3) and choose_lookup(cal, 5.5, 3)
    joint = hybrid_rounds(cal, r).mean()
    marginal = hybrid_rounds({k: v for k, v in cal.items() if k != "joint"}, r).mean()
    assert joint >= max(r["drafter"].mean(), r["lookup"].mean()) > marginal
    # a thin cell falls back to the marginal tables
    thin = {**cal, "joint": [[{**c, "rounds": 1} for c in row] for row in cal["joint"]]}
    assert choose_lookup(thin, 1.5, 3) == choose_lookup({k: v for k, v in cal.items() if k != "joint"}, 1.5, 3)


def test_drafter_gain_per_match_is_measured_on_the_calibration_rounds():
    r = rounds()
    cal = calibration(r)
    gain = held_out_hybrid(r) - r["lookup"]
    for row in cal["lookup"]:  # what the rule's choice adds over lookup alone, by lookup's match length
        assert row["drafter_gain"] == gain[r["match"] == row["match"]].mean()
    assert cal["mean_accepted"]["hybrid"] == held_out_hybrid(r).mean()
    # a 3-gram match (lookup realises 6, the head's best realised is ~3): the drafter adds nothing there
    assert cal["lookup"][3]["drafter_gain"] == 0.0 and cal["lookup"][1]["drafter_gain"] > 1.0
    assert skipped_matches(cal, 0.01)[0] == {3} and skipped_matches(cal, 0.0)[0] == frozenset()


def _table(*rows, min_rounds=20):
    """A calibration's lookup table from (rounds, lookup's mean accepted, drafter_gain) per match length."""
    return {"min_rounds": min_rounds, "lookup": [{"match": n, "rounds": w, "mean_accepted": lk, "drafter_gain": g}
                                                 for n, (w, lk, g) in enumerate(rows)]}


def test_skipped_matches_make_the_most_tokens_per_unit_of_time():
    """Half the rounds find no match (lookup 0, drafter adds 0.5), half a long one (lookup 6, drafter adds
    1.2); draft_read costs 0.2 of a round. Judged round by round (0.5 > 0.2 x 1 but 1.2 < 0.2 x 7) the drafter
    would run on the first kind only: 4.25 tokens in 1.1 = 3.86 a unit of time. Running it on the second
    kind only makes 4.6 in 1.1 = 4.18, the best of the four policies (both: 4.04, neither: 4.0)."""
    cal = _table((100, 0.0, 0.5), (100, 6.0, 1.2))

    def rate(skip):
        tokens = sum(100 * (1 + lk + (g if n not in skip else 0)) for n, (lk, g) in enumerate([(0, 0.5), (6, 1.2)]))
        return tokens / sum(100 * (1 + (0.2 if n not in skip else 0)) for n in range(2))
    policies = [frozenset(s) for s in ((), (0,), (1,), (0, 1))]
    best, r = skipped_matches(cal, 0.2)
    assert max(policies, key=rate) == {0} == best and abs(r - rate(best)) < 1e-12
    assert skipped_matches(cal, 0.0)[0] == frozenset() and skipped_matches(cal, 10.0)[0] == {0, 1}
    # the runtime's per-round rule at the policy's own rate makes the same choice
    assert [skip_drafter(cal, n, 0.2, r) for n in range(2)] == [True, False]
    # at a lower rate (a generation where lookup does worse than in calibration) the drafter pays at both
    assert not any(skip_drafter(cal, n, 0.2, 2.0) for n in range(2))
    # a row with too few calibration rounds always runs the drafter; so do a table without gains and cost 0
    thin = _table((100, 0.0, 0.5), (5, 6.0, 0.0))
    assert skipped_matches(thin, 0.2)[0] == frozenset() and not skip_drafter(thin, 1, 0.2, 100.0)
    old = {**cal, "lookup": [{k: v for k, v in row.items() if k != "drafter_gain"} for row in cal["lookup"]]}
    assert not any(skip_drafter(old, n, 10.0, 100.0) for n in range(2))
    assert not any(skip_drafter(cal, n, 0.0, 100.0) for n in range(2))


def test_reliability_bins_cover_every_round():
    e = np.linspace(0, 7, 50)
    bins = reliability(e, e)
    assert len(bins) == len(BIN_EDGES) - 1 and sum(b["rounds"] for b in bins) == 50
    assert all(b["predicted"] == b["realised"] for b in bins if b["rounds"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 8), st.integers(1, 4))
def test_lookup_is_the_latest_occurrence_of_the_longest_suffix(history, block, max_ngram):
    """Against the definition, by brute force: for n = max_ngram..1, the latest earlier occurrence of the
    history's last n tokens (it must end before the anchor), and the tokens after it, padded with the last."""
    want, want_n = [history[-1]] * block, 0
    for n in range(min(max_ngram, len(history) - 1), 0, -1):
        starts = [i for i in range(len(history) - n) if history[i:i + n] == history[-n:]]
        if starts:
            follow = history[starts[-1] + n:starts[-1] + n + block]
            want, want_n = follow + [follow[-1]] * (block - len(follow)), n
            break
    got, n = lookup(history, block, max_ngram)
    assert (got.tolist(), n) == (want, want_n) and got.dtype == np.int64


def test_lookup_reports_its_match_length():
    block, n = lookup([5, 6, 7, 8, 9, 5, 6, 7], 4)
    assert n == 3 and block.tolist() == [8, 9, 5, 6]
    block, n = lookup([1, 2, 3, 4], 3)
    assert n == 0 and block.tolist() == [4, 4, 4]
