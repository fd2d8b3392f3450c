"""The speculative loop an on-device app runs (DESIGN §5), over any backend of `backends.py`.

The runtime owns every buffer: the target's static K/V cache (allocated once, rows written in
place at their positions) and the drafter's window and recurrent state. Rejected drafts cost
no rollback: their cache rows are overwritten by the next round, and they never reach the
drafter's state (only rows 0..k are committed).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterator

import numpy as np

from ..export.manifest import load_manifest
from .backends import open_graphs
from .lookup import prompt_lookup
from .sampling import Sampling, accept, choose

DRAFTS = ("model", "prompt-lookup", "none")


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: Sampling = Sampling()
    seed: int = 0
    ignore_eos: bool = False
    draft: str = "model"  # "model" | "prompt-lookup" | "none" (target-only through target_decode)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.draft not in DRAFTS:
            raise ValueError(f"--draft must be one of {', '.join(DRAFTS)}, got {self.draft!r}")


@dataclasses.dataclass
class Stats:
    prompt_tokens: int = 0
    tokens: list[int] = dataclasses.field(default_factory=list)
    rounds: int = 0
    accepted_per_slot: list[int] = dataclasses.field(default_factory=list)
    graph_ms: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    graph_calls: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stop_reason: str = ""
    drafter_context_bytes: dict = dataclasses.field(default_factory=dict)
    phase: str = "prefill"  # graph times are keyed "prefill/<graph>" during prefill, "<graph>" after

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
                "tokens_per_s": self.tokens_per_s, "prefill_s": self.prefill_s, "decode_s": self.decode_s,
                "graph_ms": {g: self.graph_ms[g] / self.graph_calls[g] for g in self.graph_ms},
                "graph_calls": dict(self.graph_calls), "stop_reason": self.stop_reason,
                "drafter_context_bytes": self.drafter_context_bytes}


class Runtime:
    def __init__(self, folder: str | Path, backend: str = "onnxruntime", threads: int | None = None):
        self.folder = Path(folder)
        self.manifest = m = load_manifest(self.folder)
        self.graphs = open_graphs(backend, self.folder, m, threads)
        self.specs = {g: {t["name"]: t for t in spec["inputs"]} for g, spec in m["graphs"].items()}
        self.max_context = m["max_context"]
        self.chunk = m["prefill_chunk"]
        self.block = m["block"]
        self.vocab = m["graphs"]["target_decode"]["outputs"][0]["shape"][1]  # logits: (1, V)
        eos = m["target"]["config"].get("eos_token_id")
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.has_memory = "state_commit" in m["graphs"]
        kv = self.specs["target_decode"]["k_cache"]["shape"]
        self.k_cache = np.zeros(kv, np.float32)  # allocated once; rows written in place
        self.v_cache = np.zeros(kv, np.float32)
        self.ctx = {name: np.zeros(self.specs["draft_read"][name]["shape"], np.float32)
                    for name in ("win_k", "win_v")}
        if self.has_memory:
            for name in ("ssm_state", "conv_state"):
                self.ctx[name] = np.zeros(self.specs["state_commit"][name]["shape"], np.float32)
        self.ctx["win_pos"] = np.full(self.specs["draft_read"]["win_pos"]["shape"], -1, np.int64)

    @property
    def usable_context(self) -> int:
        return self.max_context - 8

    def context_bytes(self, committed: int) -> dict:
        win = self.ctx["win_k"].nbytes + self.ctx["win_v"].nbytes
        rows = self.ctx["win_k"].shape[1]
        state = sum(self.ctx[k].nbytes for k in ("ssm_state", "conv_state") if k in self.ctx)
        occupied = win * min(committed, rows) // rows
        return {"allocated": win + self.ctx["win_pos"].nbytes + state,
                "occupied": occupied + self.ctx["win_pos"].nbytes + state,
                "window_allocated": win, "window_occupied": occupied, "state": state,
                "target_kv_allocated": self.k_cache.nbytes + self.v_cache.nbytes}

    def _run(self, graph: str, inputs: list, stats: Stats) -> list[np.ndarray]:
        t = time.perf_counter()
        out = self.graphs.run(graph, inputs)
        key = graph if stats.phase == "decode" else f"prefill/{graph}"
        stats.graph_ms[key] += (time.perf_counter() - t) * 1e3
        stats.graph_calls[key] += 1
        return out

    def _reset(self) -> None:
        for name, buf in self.ctx.items():
            buf.fill(-1 if name == "win_pos" else 0)

    def _target(self, graph: str, tokens: list[int], pos: int, stats: Stats):
        """Run a target graph on `tokens` at positions pos.. (padded to its width); write their K/V rows."""
        rows = self.specs[graph]["tokens"]["shape"][0]
        n = len(tokens)
        ids = np.zeros(rows, np.int64)
        ids[:n] = tokens
        positions = np.arange(pos, pos + rows, dtype=np.int64)
        logits, feats, k_new, v_new = self._run(
            graph, [ids, positions, np.array([n], np.int64), self.k_cache, self.v_cache], stats)
        self.k_cache[:, :, pos:pos + n] = k_new[:, :, :n]
        self.v_cache[:, :, pos:pos + n] = v_new[:, :, :n]
        return logits, feats

    def _commit(self, feats: np.ndarray, pos: int, n: int, stats: Stats) -> None:
        """Fold committed rows (n <= 8 of feats) at positions pos.. into the drafter's memory and window."""
        rows = np.zeros((8, feats.shape[1]), np.float32)
        rows[:n] = feats[:n]
        n_valid = np.array([n], np.int64)
        if self.has_memory:
            self.ctx["ssm_state"], self.ctx["conv_state"] = self._run(
                "state_commit", [rows, n_valid, self.ctx["ssm_state"], self.ctx["conv_state"]], stats)
        positions = np.arange(pos, pos + 8, dtype=np.int64)
        self.ctx["win_k"], self.ctx["win_v"], self.ctx["win_pos"] = self._run(
            "window_shift", [rows, positions, n_valid, self.ctx["win_k"], self.ctx["win_v"], self.ctx["win_pos"]],
            stats)

    def check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})")
        if len(prompt) >= self.usable_context:
            raise ValueError(f"the prompt has {len(prompt)} tokens; this export's usable context is "
                             f"{self.usable_context} (max_context {self.max_context} - 8): shorten the prompt or "
                             "export with a larger --max-context")

    def _prefill(self, prompt: list[int], use_drafter: bool, stats: Stats) -> np.ndarray:
        """1. prefill in chunks; commit every prompt feature to the drafter, 8 rows at a time."""
        self._reset()
        logits = None
        for start in range(0, len(prompt), self.chunk):
            ids = prompt[start:start + self.chunk]
            logits, feats = self._target("target_prefill", ids, start, stats)
            if use_drafter:
                for r in range(0, len(ids), 8):
                    self._commit(feats[r:], start + r, min(8, len(ids) - r), stats)
            logits = logits[len(ids) - 1]
        return logits

    def probe_prefill(self, prompt: list[int]) -> dict:
        """Time to first token (speculative prefill: target chunks and drafter commits) and tokens/s."""
        t = time.perf_counter()
        int(self._prefill(prompt, True, Stats()).argmax())
        s = time.perf_counter() - t
        return {"ttft_ms": s * 1e3, "prefill_tokens_per_s": len(prompt) / s}

    def probe_graph_times(self, c: int, repeats: int, median) -> dict[str, float]:
        """Median ms of each graph call as the loop makes it, at committed length c (after probe_prefill)."""
        stats, tok = Stats(), 1
        out = {"target_decode": median(lambda: self._target("target_decode", [tok], c, stats), repeats),
               "target_verify": median(lambda: self._target("target_verify", [tok] * 8, c, stats), repeats)}
        if c + self.chunk <= self.max_context:
            out["target_prefill"] = median(lambda: self._target("target_prefill", [tok] * self.chunk, c, stats),
                                           repeats)
        feats = np.zeros((8, self.specs["window_shift"]["features"]["shape"][1]), np.float32)
        n_valid = np.array([8], np.int64)
        read = ([np.array([tok], np.int64), np.array([c], np.int64), self.ctx["win_k"], self.ctx["win_v"],
                 self.ctx["win_pos"]] + ([self.ctx["ssm_state"]] if self.has_memory else []))
        out["draft_read"] = median(lambda: self._run("draft_read", read, stats), repeats)
        if self.has_memory:
            out["state_commit"] = median(lambda: self._run(
                "state_commit", [feats, n_valid, self.ctx["ssm_state"], self.ctx["conv_state"]], stats), repeats)
        shift = [feats, np.arange(c, c + 8, dtype=np.int64), n_valid, self.ctx["win_k"], self.ctx["win_v"],
                 self.ctx["win_pos"]]
        out["window_shift"] = median(lambda: self._run("window_shift", shift, stats), repeats)
        return out

    def generate(self, prompt: list[int], cfg: GenerationConfig, stats: Stats | None = None) -> Iterator[list[int]]:
        """Yield newly committed tokens round by round; `stats` (if given) fills in as it goes."""
        self.check_prompt(prompt)
        stats = stats if stats is not None else Stats()
        stats.prompt_tokens = len(prompt)
        rng = np.random.default_rng(cfg.seed)
        use_drafter = cfg.draft == "model"
        t0 = time.perf_counter()
        logits = self._prefill(prompt, use_drafter, stats)
        stats.prefill_s = time.perf_counter() - t0
        stats.phase = "decode"
        pos = len(prompt)  # the anchor's position: rows < pos are committed
        limit = min(self.usable_context, len(prompt) + cfg.max_new_tokens)
        anchor = choose(logits, cfg.sampling, rng)
        new = [anchor]
        t1 = time.perf_counter()
        while True:
            new = self._stop(new, stats, cfg, len(prompt), limit)
            stats.tokens.extend(new)
            if new:
                yield new
            if stats.stop_reason:
                break
            if cfg.draft == "none":
                logits, _ = self._target("target_decode", [anchor], pos, stats)
                anchor = choose(logits[0], cfg.sampling, rng)
                pos += 1
                new = [anchor]
                continue
            # 2. draft
            if use_drafter:
                drafts = self._run("draft_read", [np.array([anchor], np.int64), np.array([pos], np.int64),
                                                  self.ctx["win_k"], self.ctx["win_v"], self.ctx["win_pos"]]
                                   + ([self.ctx["ssm_state"]] if self.has_memory else []), stats)[0]
            else:
                drafts = prompt_lookup(prompt + stats.tokens, self.block)
            # 3. verify [anchor, d_1..d_7] at pos..pos+7 (all 8 K/V rows written; rejected ones go stale)
            logits, feats = self._target("target_verify", [anchor, *drafts.tolist()], pos, stats)
            # 4. accept the longest agreeing prefix, plus the target's bonus token
            k, bonus = accept(drafts, logits, cfg.sampling, rng)
            stats.rounds += 1
            stats.accepted_per_slot += [0] * (self.block - len(stats.accepted_per_slot))
            for i in range(k):
                stats.accepted_per_slot[i] += 1
            # 5. commit rows 0..k (anchor and accepted drafts) to the drafter: never a rejected one
            if use_drafter:
                self._commit(feats, pos, k + 1, stats)
            # 6. emit d_1..d_k and the bonus; the bonus is the next anchor
            new = [*drafts[:k].tolist(), bonus]
            anchor, pos = bonus, pos + k + 1
        stats.decode_s = time.perf_counter() - t1
        stats.drafter_context_bytes = self.context_bytes(pos) if use_drafter else {}

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
                                 f"{self.max_context} - 8)")
        return out
