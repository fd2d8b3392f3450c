"""Every way of proposing a block behind one interface, so the loop never branches on the kind of drafter.

A drafting method proposes up to 7 tokens for positions pos+1.. from the text so far (which ends
with the anchor, at pos) and is told how many of them the target accepted. While the width rule rests
the drafter (`rest`), a method proposes only what needs no draft_read: nothing for the drafter alone
(the round is a plain step), lookup's block for hybrid.

- `DrafterDrafting`: the exported drafter (`draft_read`); its confidence head's expected accepted
  drafts come with the block where it has one;
- `LookupDrafting`: prompt-lookup, the longest earlier match of the text's end, continued;
- `HybridDrafting`: each round the block expected to go further (docs/design.md, "Hybrid drafting"),
  the drafter not run in rounds where lookup's match leaves it too little to add for its cost.

Only `uses_drafter` methods have the committed features folded into the drafter's context.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hyflash.models.hybrid import choose_lookup, drafter_chain, lookup_chain, skip_drafter, skipped_matches
from hyflash.models.lookup import lookup

RATE_PRIOR_ROUNDS = 8  # hybrid: the calibration's rate counts as this many rounds of the generation's own


@dataclasses.dataclass(frozen=True)
class Proposal:
    drafts: np.ndarray  # (block,) token ids for positions pos+1..
    expected: float | None = None  # the drafter's expected accepted drafts (its confidence head), if any
    chain: np.ndarray | None = None  # q_k: P(the first k drafts all pass), calibrated, for the width rule
    read: bool = False  # draft_read ran for this block
    source: str = "drafter"  # whose block: "drafter" | "lookup" (the width rule corrects each one's chains apart)


class DrafterDrafting:
    uses_drafter = True

    def __init__(self, runtime):
        self.runtime = runtime

    def propose(self, history: np.ndarray, anchor: int, pos: int, stats, rest: bool = False) -> Proposal | None:
        if rest:
            return None
        rt = self.runtime
        found = lookup(history[:pos + 1], rt.block) if rt.reads_lookup else None  # a lookup-input drafter's input
        drafts = rt.draft(anchor, pos, stats, found)
        conf = rt.confidence()
        if conf is None:
            return Proposal(drafts, read=True)
        return Proposal(drafts, float(conf.sum()), drafter_chain(rt.hybrid, conf), read=True)

    def accepted(self, proposal: Proposal, k: int) -> None:
        pass


class LookupDrafting:
    uses_drafter = False

    def __init__(self, runtime):
        self.block, self.cal = runtime.block, runtime.hybrid

    def propose(self, history: np.ndarray, anchor: int, pos: int, stats, rest: bool = False) -> Proposal:
        block, match = lookup(history[:pos + 1], self.block)
        return Proposal(block, chain=lookup_chain(self.cal, match, self.block), source="lookup")

    def accepted(self, proposal: Proposal, k: int) -> None:
        pass


class HybridDrafting:
    """Keeps the generation's tokens made and time spent (in units of a round without the drafter), which
    decide when the drafter's gain is worth its cost (`skip_drafter`)."""
    uses_drafter = True

    def __init__(self, runtime, draft_cost: float):
        self.runtime, self.cal, self.cost = runtime, runtime.hybrid, draft_cost
        rate = skipped_matches(self.cal, draft_cost)[1]
        self.made, self.spent = rate * RATE_PRIOR_ROUNDS, float(RATE_PRIOR_ROUNDS)
        self.skipped = False

    def propose(self, history: np.ndarray, anchor: int, pos: int, stats, rest: bool = False) -> Proposal:
        rt = self.runtime
        block, match = lookup(history[:pos + 1], rt.block)
        self.skipped = rest or skip_drafter(self.cal, match, self.cost, self.made / self.spent)
        if not self.skipped:
            drafts = rt.draft(anchor, pos, stats, (block, match) if rt.reads_lookup else None)
            conf = rt.confidence()
            expected = float(conf.sum())
            if not choose_lookup(self.cal, expected, match):
                return Proposal(drafts, expected, drafter_chain(self.cal, conf), read=True)
        stats.lookup_rounds += 1
        stats.skipped_reads += self.skipped
        return Proposal(block, chain=lookup_chain(self.cal, match, rt.block), read=not self.skipped, source="lookup")

    def accepted(self, proposal: Proposal, k: int) -> None:
        self.made += k + 1
        self.spent += 1 + (0 if self.skipped else self.cost)


def drafting_for(draft: str, runtime, draft_cost: float):
    """The drafting method of a GenerationConfig.draft, or None for target-only decoding."""
    if draft == "none":
        return None
    if draft == "model":
        return DrafterDrafting(runtime)
    if draft == "prompt-lookup":
        return LookupDrafting(runtime)
    return HybridDrafting(runtime, draft_cost)
