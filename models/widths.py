"""How many drafts to verify each round: what the drafts are expected to earn against what each verify
width costs (docs/design.md, "Verify widths").

A round at width w runs the target once on w rows, the anchor and the first w - 1 drafts (w = 1 is
`target_decode`, no drafts), and makes 1 + a tokens, a <= w - 1 the drafts accepted. With q_k the
probability that the first k drafts are all accepted (a drafter's confidence head at slot k, calibrated;
for prompt-lookup, measured by match length), E[1 + a] = 1 + q_1 + ... + q_{w-1}.

The loop wants the most tokens per millisecond over the whole generation, R. Each round, the width
maximising E[tokens] - R * ms makes the most of R: a round earning less than R per millisecond lowers it
(Dinkelbach's argument; R is the generation's own rate as it goes, started from plain decoding's).
Whether to run the drafter at all is decided before its confidences exist, so it is judged on the
rounds just drafted: their value net of draft_read against plain decoding's, averaged over the current
streak of drafted rounds (the last JUDGED_ROUNDS or so weigh most), so one block the drafter is unsure of
does not stop a streak that pays. While that average stays below zero, the runtime decodes without
drafting for a cool-down that doubles each time drafting still does not pay; the first round after a
rest is judged on its own.
Calibration tables come from training text, where a drafter does better than on text it has not seen;
`ChainCorrection` scales each source's chains by what this generation's verified drafts realised
against what they promised, so the rule follows the text at hand.
The rule changes only how many drafts are verified, never which tokens are accepted: output is exact.

numpy only: the runtime applies it every round.
"""

from __future__ import annotations

import dataclasses

import numpy as np

MAX_COOLDOWN = 64  # rounds of plain decoding before the drafter is tried again, at most
PRIOR_ROUNDS = 8  # the starting rate counts as this many rounds of the generation's own
PRIOR_DRAFTS = 4.0  # a chain correction starts at 1 as if this many expected drafts had all been realised
JUDGED_ROUNDS = 4  # a streak's average of what drafting earned weighs about this many recent rounds


@dataclasses.dataclass(frozen=True)
class Costs:
    """Milliseconds of one call at one committed length: `verify[w]` the target on w rows (w = 1:
    target_decode), `draft` draft_read, `commit` the drafter's commit (state_commit + window_shift)."""

    verify: dict[int, float]
    draft: float = 0.0
    commit: float = 0.0

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(sorted(self.verify))


@dataclasses.dataclass(frozen=True)
class CostCurve:
    """`Costs` measured at several committed lengths (`hyflash profile --write-costs`), read between them
    by linear interpolation and held flat beyond the ends."""

    lengths: tuple[int, ...]
    points: tuple[Costs, ...]

    def __post_init__(self):
        if not self.lengths or len(self.lengths) != len(self.points) or list(self.lengths) != sorted(set(self.lengths)):
            raise ValueError("a cost curve needs increasing committed lengths, one set of costs each")
        widths = {c.widths for c in self.points}
        if len(widths) != 1 or 1 not in next(iter(widths)):
            raise ValueError("every point of a cost curve must time the same widths, width 1 (target_decode) among them")

    def at(self, committed: int) -> Costs:
        i = int(np.searchsorted(self.lengths, committed))
        if i == 0 or i == len(self.lengths):
            return self.points[min(i, len(self.points) - 1)]
        (x0, x1), (a, b) = self.lengths[i - 1:i + 1], self.points[i - 1:i + 1]
        t = (committed - x0) / (x1 - x0)

        def mix(u: float, v: float) -> float:
            return (1 - t) * u + t * v

        return Costs({w: mix(a.verify[w], b.verify[w]) for w in a.verify}, mix(a.draft, b.draft), mix(a.commit, b.commit))

    def to_json(self) -> dict:
        return {"points": [{"committed": n, "verify_ms": {str(w): ms for w, ms in c.verify.items()},
                            "draft_read_ms": c.draft, "commit_ms": c.commit} for n, c in zip(self.lengths, self.points)]}

    @classmethod
    def from_json(cls, data: dict) -> CostCurve:
        points = sorted(data["points"], key=lambda p: p["committed"])
        return cls(tuple(int(p["committed"]) for p in points),
                   tuple(Costs({int(w): float(ms) for w, ms in p["verify_ms"].items()}, float(p["draft_read_ms"]),
                               float(p["commit_ms"])) for p in points))


def expected_tokens(chain: np.ndarray, widths: tuple[int, ...]) -> np.ndarray:
    """E[tokens] of a round at each width: 1 + q_1 + ... + q_{w-1}, chain = (q_1, q_2, ...)."""
    cum = np.concatenate([[1.0], 1.0 + np.cumsum(np.asarray(chain, np.float64))])
    return cum[[min(w - 1, len(cum) - 1) for w in widths]]


def best_width(chain: np.ndarray, costs: Costs, rate: float) -> tuple[int, float]:
    """The width maximising E[tokens] - rate * ms of the round (the drafter's commit included, draft_read
    already spent), and that value."""
    widths = costs.widths
    value = expected_tokens(chain, widths) - rate * (np.asarray([costs.verify[w] for w in widths]) + costs.commit)
    i = int(np.argmax(value))
    return widths[i], float(value[i])


class ChainCorrection:
    """One source's chains (the drafter's, or lookup's), scaled by realised / expected accepted drafts over the
    generation's verified rounds, both counted from a prior of PRIOR_DRAFTS (so it starts at 1)."""

    def __init__(self):
        self.expected = self.realised = PRIOR_DRAFTS

    @property
    def scale(self) -> float:
        return self.realised / self.expected

    def apply(self, chain: np.ndarray) -> np.ndarray:
        return np.clip(np.asarray(chain, np.float64) * self.scale, 0.0, 1.0)

    def observe(self, chain: np.ndarray, width: int, accepted: int) -> None:
        """A verified round at `width` of a block with (uncorrected) `chain` accepted `accepted` drafts."""
        self.expected += float(np.sum(chain[:width - 1]))
        self.realised += accepted


class WidthRule:
    """The rule as a generation runs it: the rate so far, and the drafter's cool-down.

    `pick(chain, costs, read)` once the block is known: the width to verify (read: draft_read ran for it; only
    such rounds judge the drafter). `drafts()` before: whether this round runs the drafter at all.
    `made(tokens, ms)` after each round. `rest_commit_rows`: how many plain steps of the rest under way share
    one commit (their rows are folded together, 8 at most)."""

    def __init__(self, start: Costs):
        self.tokens, self.ms = float(PRIOR_ROUNDS), PRIOR_ROUNDS * start.verify[1]
        self.cooldown, self.wait = 1, 0
        self.rest_commit_rows = 1
        self.streak, self.gain = 0, 0.0  # drafted rounds since the last rest; their average gain over plain

    @property
    def rate(self) -> float:
        return self.tokens / self.ms

    @property
    def fold_rows(self) -> int:
        """A rest of the current cool-down folds its rows this many at a time into one commit."""
        return min(self.cooldown, 8)

    def round_gain(self, value: float, costs: Costs) -> float:
        """What a drafted round of this value (best_width's) gains over a plain step, net of draft_read."""
        plain = 1.0 - self.rate * (costs.verify[1] + costs.commit / self.fold_rows)
        return value - self.rate * costs.draft - plain

    def pick(self, chain: np.ndarray, costs: Costs, read: bool = True) -> int:
        width, value = best_width(chain, costs, self.rate)
        if not read:
            return width
        self.streak += 1
        self.gain += (self.round_gain(value, costs) - self.gain) / min(self.streak, JUDGED_ROUNDS)
        if self.gain >= 0.0:
            self.cooldown = 1
        else:  # drafting does not pay on these rounds: rest the drafter, longer each time it still does not pay
            self.wait, self.rest_commit_rows = self.cooldown, self.fold_rows
            self.cooldown = min(2 * self.cooldown, MAX_COOLDOWN)
            self.streak, self.gain = 0, 0.0
        return width

    def drafts(self) -> bool:
        if self.wait:
            self.wait -= 1
            return False
        return True

    def made(self, tokens: int, ms: float) -> None:
        self.tokens += tokens
        self.ms += ms
