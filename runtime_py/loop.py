"""The speculative loop an on-device app runs (docs/design.md, "The loop"), on any backend.

The runtime owns every buffer, allocated once and bound to the graphs once (`backends.py`):
the target's cache (`TargetCache`, rows written in place by the graphs at their positions),
the drafter's window and state (`DrafterContext`), and the small inputs and outputs of every
call. Rejected drafts cost no rollback: their cache rows are overwritten by the next round,
and they never reach the drafter's state (only the anchor and the accepted drafts are committed).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterator

import numpy as np

from hyflash.runtime_py.backends import Call, open_backend
from hyflash.runtime_py.drafting import drafting_for
from hyflash.runtime_py.manifest import VERIFY_ROWS, Contract, load_manifest
from hyflash.runtime_py.sampling import Sampling, accept, choose
from hyflash.runtime_py.state import DrafterContext, TargetCache
from hyflash.runtime_py.verifying import POLICIES, check_policy, policy_for, read_costs

DRAFTS = ("model", "prompt-lookup", "hybrid", "none")
# hybrid: draft_read's time as a share of the rest of a round (verify and commit), which decides when a round
# skips the drafter (`skip_drafter`); `hyflash profile` prints it for an export as `draft_read_share`: on the
# reference pair 0.27 / 0.21 / 0.16 at 256 / 1,024 / 2,048 committed tokens (onnxruntime, 2 threads)
DRAFT_COST = 0.2


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: Sampling = Sampling()
    seed: int = 0
    ignore_eos: bool = False
    draft: str = "model"  # "model" | "prompt-lookup" | "hybrid" (the better of the two each round, docs/design.md)
    #                       | "none" (target-only through target_decode)
    draft_cost: float = DRAFT_COST  # hybrid: draft_read's share of a round's time (0: always run the drafter)
    width: str | int = "full"  # drafts verified a round: "full" (all 7), a verify width of the export (w - 1
    #                            drafts), or "rule" (chosen each round from the export's costs: verifying.py)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.draft not in DRAFTS:
            raise ValueError(f"--draft must be one of {', '.join(DRAFTS)}, got {self.draft!r}")
        if not self.draft_cost >= 0:
            raise ValueError(f"--draft-cost must be >= 0 (draft_read's share of a round's time), got {self.draft_cost}")
        if self.width not in POLICIES and not (isinstance(self.width, int) and 2 <= self.width <= VERIFY_ROWS):
            raise ValueError(f"--width must be full, rule or a verify width 2..{VERIFY_ROWS}, got {self.width!r}")


@dataclasses.dataclass
class Stats:
    prompt_tokens: int = 0
    tokens: list[int] = dataclasses.field(default_factory=list)
    rounds: int = 0
    accepted_per_slot: list[int] = dataclasses.field(default_factory=list)
    graph_ms: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    graph_calls: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    prefill_s: float = 0.0
    prefilled: int = 0  # prompt tokens run through the target (fewer than prompt_tokens when a prefix was reused)
    decode_s: float = 0.0
    stop_reason: str = ""
    drafter_context_bytes: dict = dataclasses.field(default_factory=dict)
    lookup_rounds: int = 0  # hybrid: rounds that verified prompt-lookup's block
    skipped_reads: int = 0  # hybrid: rounds of those that did not run draft_read (its gain not worth its cost)
    expected_accepted: list[float] = dataclasses.field(default_factory=list)  # per round, when the drafter has
    realised_accepted: list[int] = dataclasses.field(default_factory=list)    # a confidence head: its calibration
    widths: dict[int, int] = dataclasses.field(default_factory=lambda: defaultdict(int))  # rounds by rows verified
    rested_rounds: int = 0  # the width rule: plain steps while the drafter rests (in `rounds`, width 1)

    def record_round(self, k: int, block: int, expected: float | None) -> None:
        """A verify round that accepted k drafts; `expected`: what the drafter's confidence head expected."""
        self.rounds += 1
        self.accepted_per_slot += [0] * (block - len(self.accepted_per_slot))
        for i in range(k):
            self.accepted_per_slot[i] += 1
        if expected is not None:
            self.expected_accepted.append(expected)
            self.realised_accepted.append(k)

    @property
    def acceptance_length(self) -> float:
        """Tokens per verify round, bonus included (1..8); the first token comes from prefill."""
        return (len(self.tokens) - 1) / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens after the first (which prefill gives) per second of decoding."""
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s else 0.0

    def to_json(self) -> dict:
        return {"tokens": self.tokens, "prompt_tokens": self.prompt_tokens, "rounds": self.rounds,
                "acceptance_length": self.acceptance_length, "accepted_per_slot": self.accepted_per_slot,
                "tokens_per_s": self.tokens_per_s, "prefill_s": self.prefill_s, "prefilled": self.prefilled,
                "decode_s": self.decode_s,
                "graph_ms": {g: self.graph_ms[g] / self.graph_calls[g] for g in self.graph_ms},
                "graph_calls": dict(self.graph_calls), "stop_reason": self.stop_reason,
                "drafter_context_bytes": self.drafter_context_bytes, "lookup_rounds": self.lookup_rounds,
                "skipped_reads": self.skipped_reads, "widths": {str(w): n for w, n in sorted(self.widths.items())},
                "rested_rounds": self.rested_rounds}


class Runtime:
    def __init__(self, folder: str | Path, backend: str = "onnxruntime", threads: int | None = None,
                 target: str | Path | None = None, memory_history: int | None = None):
        """`target`: the eager backend's target folder, if it moved since export. `memory_history`: the
        eager backend's ablation, the drafter's memory limited to the last M committed features."""
        self.folder = Path(folder)
        self.manifest = load_manifest(self.folder)
        self.contract = c = Contract(self.manifest)
        self.backend = open_backend(backend, self.folder, c, threads, target, memory_history)
        self.max_context, self.chunk, self.block, self.vocab = c.max_context, c.prefill_chunk, c.block, c.vocab
        generation = self.manifest.get("generation")  # exports before it: config.json's EOS only
        eos = generation["eos_token_ids"] if generation else self.manifest["target"]["config"].get("eos_token_id")
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.has_memory = c.has_memory
        self.reads_lookup = c.reads_lookup  # draft_read takes prompt-lookup's block (a --lookup-input drafter)
        self.hybrid = self.manifest["drafter"].get("hybrid")  # hybrid drafting's calibration, if any
        self.cache = TargetCache(c, host=self.backend.host_cache)
        self.ctx = DrafterContext(c)
        self.calls = self._bind_all()
        self._busy = threading.Lock()
        self._phase = ""  # "prefill/" while a generation prefills: the key prefix of its graph times
        self._verified = None  # the last verify's features (an output array, reused by the next call)
        self._pending: list[np.ndarray] = []  # features of plain steps not yet folded (the drafter resting)
        self._pending_pos = 0
        self._rested = False  # the last round was a plain step with the drafter resting
        self._costs = None  # the cost curve (costs.json), read when the width rule first needs it

    def _bind(self, graph: str, pool_in: dict, pool_out: dict, cache: TargetCache | None = None) -> Call:
        """Bind a graph's inputs and outputs, by name, to arrays of the pools (allocated once)."""
        g = self.contract.graph(graph)
        return self.backend.bind(graph, {t["name"]: pool_in[t["name"]] for t in g["inputs"]},
                                 {t["name"]: pool_out[t["name"]] for t in g["outputs"]}, cache)

    def _bind_all(self) -> dict:
        """Every call the loop makes, bound once: target graphs by name, drafter graphs by the
        context copy they read (`ctx.index`); a drafter graph writes the other copy."""
        c = self.contract

        def arrays(graph, kind):
            return {t["name"]: np.zeros(t["shape"], np.dtype(t["dtype"])) for t in c.graph(graph)[kind]}

        calls = {}
        for g in c.target_graphs:
            calls[g] = self._bind(g, arrays(g, "inputs"), arrays(g, "outputs"), self.cache)
        small = {**arrays("window_shift", "inputs"), **arrays("draft_read", "inputs")}  # features, n_valid, ...
        read_out = arrays("draft_read", "outputs")  # the drafts: both copies' reads land here
        for i, (mine, theirs) in enumerate(zip(self.ctx.copies, self.ctx.copies[::-1])):
            pool_in = {**small, **mine}
            pool_out = {**read_out, **{f"{name}_out": buf for name, buf in theirs.items()}}
            calls["draft_read", i] = self._bind("draft_read", pool_in, pool_out)
            calls["window_shift", i] = self._bind("window_shift", pool_in, pool_out)
            if self.has_memory:
                calls["state_commit", i] = self._bind("state_commit", pool_in, pool_out)
        return calls

    @property
    def usable_context(self) -> int:
        return self.contract.usable_context

    def context_bytes(self, committed: int) -> dict:
        return {**self.ctx.context_bytes(committed), "target_kv_allocated": self.manifest["memory"]["target_kv_bytes"]}

    def _run(self, graph: str, call: Call, stats: Stats | None) -> None:
        if stats is None:
            call.run()
            return
        t = time.perf_counter()
        call.run()
        key = self._phase + graph  # graph times are keyed "prefill/<graph>" during prefill, "<graph>" after
        stats.graph_ms[key] += (time.perf_counter() - t) * 1e3
        stats.graph_calls[key] += 1

    def run_target(self, graph: str, tokens, pos: int, stats: Stats | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Run a target graph on `tokens` at positions pos.. (padded to its width); the graph writes
        all its rows into the cache. -> (logits, features), arrays reused by the next call."""
        call = self.calls[graph]
        ids, positions = call.inputs["tokens"], call.inputs["positions"]
        self.cache.check_room(pos, len(ids))
        n = len(tokens)
        ids[:n] = tokens
        ids[n:] = 0
        positions[:] = np.arange(pos, pos + len(positions))
        self._run(graph, call, stats)
        return call.outputs["logits"], call.outputs["features"]

    def cost_curve(self):
        """This export's costs on this device (`costs.json`), for the width rule."""
        if self._costs is None:
            self._costs = read_costs(self.folder, self.backend.name, self.contract.verify_widths)
        return self._costs

    def draft(self, anchor: int, pos: int, stats: Stats | None = None,
              found: tuple[np.ndarray, int] | None = None) -> np.ndarray:
        """draft_read on the current context: the drafts for positions pos+1..pos+7. found: prompt-lookup's
        block and match length on the text up to the anchor (`lookup`), which a lookup-input drafter reads."""
        self.flush(stats)
        call = self.calls["draft_read", self.ctx.index]
        call.inputs["anchor_token"][0] = anchor
        call.inputs["anchor_pos"][0] = pos
        if self.reads_lookup:
            if found is None:
                raise ValueError("this drafter reads prompt-lookup's block (exported --lookup-input): pass found")
            call.inputs["lookup_tokens"][:] = found[0]
            call.inputs["lookup_match"][0] = found[1]
        self._run("draft_read", call, stats)
        return call.outputs["draft_tokens"]

    def confidence(self) -> np.ndarray | None:
        """The last draft_read's per-slot confidences (7,), if the drafter has the head."""
        return self.calls["draft_read", self.ctx.index].outputs.get("confidence")

    def check_draft(self, draft: str) -> None:
        if draft == "hybrid" and (self.hybrid is None or self.confidence() is None):
            why = ("its drafter has no confidence head" if self.confidence() is None else
                   "its drafter has no hybrid calibration: run `hyflash calibrate` on the drafter folder, then export again")
            raise ValueError(f"{self.folder}: --draft hybrid needs a calibrated drafter; {why}")

    def fold(self, feats: np.ndarray, pos: int, n: int, stats: Stats | None = None) -> None:
        """Fold committed rows (the first n <= 8 of feats) at positions pos.. into the drafter's memory
        and window: the graphs read the current context copy and write the other, which becomes current."""
        shift = self.calls["window_shift", self.ctx.index]
        shift.inputs["features"][:n] = feats[:n]  # rows >= n are never read (the n_valid rule)
        shift.inputs["n_valid"][0] = n
        shift.inputs["positions"][:] = np.arange(pos, pos + VERIFY_ROWS)
        if self.has_memory:  # shares features and n_valid with window_shift
            self._run("state_commit", self.calls["state_commit", self.ctx.index], stats)
        self._run("window_shift", shift, stats)
        self.ctx.flip()
        self.ctx.folded(pos, n)

    def pend(self, row: np.ndarray, pos: int, stats: Stats | None = None) -> None:
        """A plain step's committed feature row (position pos), folded with up to 7 more in one commit."""
        if not self._pending:
            self._pending_pos = pos
        self._pending.append(row.copy())
        if len(self._pending) == VERIFY_ROWS:
            self.flush(stats)

    def flush(self, stats: Stats | None = None) -> None:
        """Fold the pending rows, so the drafter's context holds every committed row."""
        if self._pending:
            rows, self._pending = np.stack(self._pending), []
            self.fold(rows, self._pending_pos, len(rows), stats)

    def check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})")
        if len(prompt) >= self.usable_context:
            raise ValueError(f"the prompt has {len(prompt)} tokens; this export's usable context is "
                             f"{self.usable_context} (max_context {self.max_context} - {VERIFY_ROWS}): shorten the "
                             "prompt or export with a larger --max-context")

    def reusable(self, prompt: list[int], use_drafter: bool) -> int:
        """How many leading rows of the committed context `prompt` can keep: its common prefix with the
        committed text, short of the whole prompt (its last token must run to give the first logits).
        The target's cache can keep any prefix (later rows are overwritten); the drafter's memory cannot
        forget, so with the drafter the prefix must be everything it has folded in, or nothing."""
        n = 0
        for a, b in zip(self.cache.tokens, prompt[:-1]):
            if a != b:
                break
            n += 1
        if use_drafter and n != self.ctx.rows:
            return 0
        return n

    def prefill(self, prompt: list[int], use_drafter: bool, stats: Stats, reuse: bool = False) -> np.ndarray:
        """1. The prompt through target_prefill in chunks (the tail through target_verify where a
        whole chunk would pass the cache's end); every prompt feature committed to the drafter,
        8 rows at a time. With `reuse`, rows the committed context already holds are kept and only the
        rest runs (a conversation's new turn). -> the logits after the last prompt token."""
        self._pending = []
        pos = self.reusable(prompt, use_drafter) if reuse else 0
        if pos == 0:
            self.ctx.reset()
        self.cache.commit(0, pos, prompt[:pos])
        if not use_drafter:
            self.ctx.rows = -1  # the rows below are not folded into the drafter
        stats.prefilled = len(prompt) - pos
        logits = None
        while pos < len(prompt):
            graph = "target_prefill" if pos + self.chunk <= self.max_context else "target_verify"
            ids = prompt[pos:pos + self.contract.width(graph)]
            logits, feats = self.run_target(graph, ids, pos, stats)
            self.commit_rows(ids, pos)
            if use_drafter:
                for r in range(0, len(ids), VERIFY_ROWS):
                    self.fold(feats[r:], pos + r, min(VERIFY_ROWS, len(ids) - r), stats)
            logits = logits[len(ids) - 1].copy()  # the output array is reused by the next call
            pos += len(ids)
        return logits

    def commit_rows(self, tokens: list[int], pos: int) -> None:
        """Cache rows pos.. (already written by the call at pos) now hold `tokens`; later rows are stale."""
        self.cache.commit(pos, len(tokens), tokens)

    def generate(self, prompt: list[int], cfg: GenerationConfig, stats: Stats | None = None,
                 reuse: bool = False) -> Iterator[list[int]]:
        """Yield newly committed tokens round by round; `stats` (if given) fills in as it goes.
        `reuse`: keep what the committed context shares with `prompt` and prefill only the rest (the next
        turn of a conversation: the previous prompt and reply, then the new turn); same tokens as without.

        A runtime holds one conversation's buffers: a second generation while one is under way (from
        another thread, or an unfinished generator) is refused; give each thread its own Runtime."""
        self.check_prompt(prompt)
        self.check_draft(cfg.draft)
        check_policy(cfg.width, self.contract.verify_widths)
        if cfg.width == "rule" and cfg.draft != "none":
            self.cost_curve()
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("this Runtime is already generating (in another thread, or an unfinished "
                               "generate()); give each concurrent generation its own Runtime")
        try:
            yield from self._generate(prompt, cfg, stats, reuse)
        finally:
            self._busy.release()

    def _generate(self, prompt: list[int], cfg: GenerationConfig, stats: Stats | None,
                  reuse: bool) -> Iterator[list[int]]:
        stats = stats if stats is not None else Stats()
        stats.prompt_tokens = len(prompt)
        rng = np.random.default_rng(cfg.seed)
        draft_cost = cfg.draft_cost
        if cfg.width == "rule" and cfg.draft == "hybrid":  # one cost model: hybrid's skip reads the same costs
            c = self.cost_curve().at(len(prompt))
            draft_cost = c.draft / (c.verify[VERIFY_ROWS] + c.commit)
        drafting = drafting_for(cfg.draft, self, draft_cost)
        self._phase = "prefill/"
        t0 = time.perf_counter()
        logits = self.prefill(prompt, drafting is not None and drafting.uses_drafter, stats, reuse)  # 1. prefill
        stats.prefill_s = time.perf_counter() - t0
        self._phase = ""
        pos = len(prompt)  # the anchor's position: rows < pos are committed
        limit = min(self.usable_context, len(prompt) + cfg.max_new_tokens)
        policy = policy_for(cfg.width, self, drafting, len(prompt)) if drafting is not None else None
        anchor = choose(logits, cfg.sampling, rng)
        new = self._stop([anchor], stats, cfg, len(prompt), limit)
        history = np.empty(limit, np.int64)  # prompt + output, for prompt-lookup: filled in place, never rebuilt
        history[:len(prompt)] = prompt
        t1 = time.perf_counter()
        try:  # also when the caller stops early (a stop string): the generator then closes at its yield
            while True:
                history[pos + 1 - len(new):pos + 1] = new  # the text so far ends with the anchor, at pos
                stats.tokens.extend(new)
                if new:
                    yield new
                if stats.stop_reason:
                    break
                if drafting is None:  # target-only: one row at a time through the step graph (target_decode)
                    logits, _ = self.run_target(self.contract.step_graph, [anchor], pos, stats)
                    self.commit_rows([anchor], pos)
                    emitted = [choose(logits[0], cfg.sampling, rng)]
                else:
                    emitted = self.round(drafting, policy, history, anchor, pos, cfg.sampling, rng, stats)
                new = self._stop(emitted, stats, cfg, len(prompt), limit)
                if drafting is not None:
                    self.commit_round(drafting, anchor, emitted, new, pos, stats)
                anchor, pos = emitted[-1], pos + len(new)
        finally:
            if drafting is not None and drafting.uses_drafter:
                self.flush(stats)  # the drafter's context holds every committed row (a next turn may reuse it)
            stats.decode_s = time.perf_counter() - t1
            stats.drafter_context_bytes = self.context_bytes(pos) if drafting and drafting.uses_drafter else {}

    def round(self, drafting, policy, history: np.ndarray, anchor: int, pos: int, sampling: Sampling,
              rng: np.random.Generator, stats: Stats) -> list[int]:
        """One speculative round at the anchor (position pos): the accepted drafts and the target's bonus token.
        The policy may rest the drafter (a plain step) or verify fewer drafts than the block has (a narrower
        verify graph); the block's w K/V rows are all written, `commit_round` keeps those of the emitted tokens."""
        rest = not policy.drafts(pos)  # the width rule rests the drafter: no draft_read this round
        proposal = drafting.propose(history, anchor, pos, stats, rest)  # 2. draft d_1..d_7 for pos+1..pos+7
        self._rested = proposal is None  # nothing to verify without the drafter: a plain step
        if self._rested:
            width, drafts = 1, np.empty(0, np.int64)
        else:
            width = policy.width(proposal, pos)
            drafts = proposal.drafts[:width - 1]
        logits, self._verified = self.run_target(self.contract.rows_graph(width), [anchor, *drafts.tolist()], pos,
                                                 stats)
        k, bonus = accept(drafts, logits[:width], sampling, rng)  # 3. verify, 4. accept d_1..d_k and a bonus
        if proposal is not None:
            drafting.accepted(proposal, k)
        # the head's expectation is over the whole block: its calibration record is kept for full-width rounds
        stats.record_round(k, self.block, proposal.expected if proposal is not None and width == VERIFY_ROWS else None)
        stats.widths[width] += 1
        stats.rested_rounds += self._rested
        policy.made(k, width, proposal, pos)
        return [*drafts[:k].tolist(), bonus]

    def commit_round(self, drafting, anchor: int, emitted: list[int], new: list[int], pos: int, stats: Stats) -> None:
        """5. commit rows 0..n-1 of the verify block (n: the emitted tokens kept, fewer at a cut): the anchor and
        the emitted drafts but the last emitted token, which is the next anchor; so the committed text is always
        prompt + output minus its last token. Their features go into the drafter's context (a resting
        drafter's a few rows at a time, before it next drafts)."""
        n = len(new)
        self.commit_rows([anchor, *emitted[:n - 1]], pos)
        if not drafting.uses_drafter:
            return
        if self._rested:
            if n:
                self.pend(self._verified[0], pos, stats)
        else:
            self.flush(stats)
            self.fold(self._verified, pos, n, stats)

    def _stop(self, new: list[int], stats: Stats, cfg: GenerationConfig, prompt_len: int, limit: int) -> list[int]:
        """Cut `new` at EOS or the token limit; set stats.stop_reason when generation must end."""
        done = len(stats.tokens)
        room = limit - prompt_len - done
        out = []
        for t in new:
            if len(out) == room:
                break
            out.append(t)
            if t in self.eos and not cfg.ignore_eos:
                stats.stop_reason = "eos"
                return out
        if prompt_len + done + len(out) >= limit:
            stats.stop_reason = ("max_new_tokens" if limit < self.usable_context else
                                 f"usable context reached ({self.usable_context} tokens = max_context "
                                 f"{self.max_context} - {VERIFY_ROWS})")
        return out
