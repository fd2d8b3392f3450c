"""How many drafts a round verifies (docs/design.md, "Verify widths"): a fixed width, or the width rule.

A policy answers three questions the loop asks each round: whether to run the drafter at all
(`drafts`), how many rows to verify once the block is known (`width`: the anchor and width - 1
drafts, 1 being a plain decode step), and, after the round, what it made (`made`). The rule reads
the export's cost curve for its backend (`costs-<backend>.json`, written beside the export by
`hyflash profile --write-costs` on the device that runs it) and each block's chain probabilities (`Proposal.chain`), and keeps its
own account in modelled milliseconds, so a run is reproducible: the same costs and text give the
same rounds. Every policy is exact: it changes how many drafts are verified, not which are accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

from hyflash.models.widths import ChainCorrection, CostCurve, Costs, WidthRule
from hyflash.runtime_py.manifest import VERIFY_ROWS

COSTS_FILE = "costs-{backend}.json"  # beside the export: device-specific, so not among its checksummed files
POLICIES = ("full", "rule")  # or a verify width, as a number


def write_costs(folder: Path, backend: str, curve: CostCurve, about: dict) -> Path:
    path = Path(folder) / COSTS_FILE.format(backend=backend)
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps({"backend": backend, **about, **curve.to_json()}, indent=1) + "\n")
    tmp.replace(path)
    return path


def read_costs(folder: Path, backend: str, widths: tuple[int, ...]) -> CostCurve:
    """The export's cost curve on `backend`; it must time every verify width the export has."""
    path = Path(folder) / COSTS_FILE.format(backend=backend)
    if not path.is_file():
        raise ValueError(f"{folder}: no {path.name}; the width rule needs this device's costs: run "
                         f"`hyflash profile {folder} --backend {backend} --write-costs` first (or a fixed --width)")
    try:
        curve = CostCurve.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a cost curve ({e}); write it again with `hyflash profile --write-costs`") from None
    missing = sorted({1, *widths} - set(curve.points[0].verify))
    if missing:
        raise ValueError(f"{path}: no cost for verify width {missing[0]}; write it again with `hyflash profile "
                         "--write-costs` (the export changed since)")
    keep = {1, *widths}  # a width the export lacks is never chosen
    return CostCurve(curve.lengths, tuple(Costs({w: ms for w, ms in p.verify.items() if w in keep}, p.draft, p.commit)
                                          for p in curve.points))


def check_policy(width: str | int, widths: tuple[int, ...]) -> None:
    if width in POLICIES:
        return
    if not isinstance(width, int) or width not in widths:
        raise ValueError(f"--width must be full, rule or one of this export's verify widths "
                         f"({', '.join(map(str, widths))}), got {width!r}")


class FixedWidth:
    """Every round verifies `width` rows (the full block: 8)."""

    def __init__(self, width: int):
        self.fixed = width

    def drafts(self, pos: int) -> bool:
        return True

    def width(self, proposal, pos: int) -> int:
        return self.fixed

    def made(self, accepted: int, width: int, proposal, pos: int) -> None:
        pass


class RuleWidth:
    """The width rule (`hyflash.models.widths`) on the export's cost curve, for one generation."""

    def __init__(self, curve: CostCurve, start: int, uses_drafter: bool):
        """uses_drafter: the drafting method keeps the drafter's context (its commits cost); prompt-lookup alone
        does not, and proposes for free."""
        self.curve, self.uses_drafter = curve, uses_drafter
        self.rule = WidthRule(self.costs(start))
        self.corrections = {"drafter": ChainCorrection(), "lookup": ChainCorrection()}

    def costs(self, pos: int) -> Costs:
        c = self.curve.at(pos)
        return c if self.uses_drafter else Costs(c.verify)

    def drafts(self, pos: int) -> bool:
        return self.rule.drafts()

    def width(self, proposal, pos: int) -> int:
        if proposal.chain is None:  # a block that comes with no estimate: verified whole
            return VERIFY_ROWS
        chain = self.corrections[proposal.source].apply(proposal.chain)
        return self.rule.pick(chain, self.costs(pos), proposal.read)

    def made(self, accepted: int, width: int, proposal, pos: int) -> None:
        """proposal None: a plain step while the drafter rests (its commits go several rows at a time)."""
        c = self.costs(pos)
        if proposal is None:
            self.rule.made(1, c.verify[1] + c.commit / self.rule.rest_commit_rows)
            return
        if proposal.chain is not None and width > 1:
            self.corrections[proposal.source].observe(proposal.chain, width, accepted)
        self.rule.made(accepted + 1, c.verify[width] + c.draft * proposal.read + c.commit)


def policy_for(width: str | int, runtime, drafting, start: int):
    """The policy of a GenerationConfig.width for one generation starting at committed length `start`."""
    if width == "rule":
        return RuleWidth(runtime.cost_curve(), start, drafting.uses_drafter)
    return FixedWidth(VERIFY_ROWS if width == "full" else int(width))
