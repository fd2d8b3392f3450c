"""`hyflash regenerate`: the target writes its own continuations of training prompts.

A drafter is used on the target's own text, so it should learn from it: slot k must guess the
target's choice after the target's *own* chain, which a corpus label (the choice after the
corpus' prefix) matches only part of the time. Each sequence here is a prompt cut from the
training split (or, from a chat .jsonl, a conversation up to an assistant turn rendered with the
target's template), then the target's continuation up to `seq_len` tokens (a chat answer up to its
EOS): greedy for a share of the sequences, sampled at `temperature` for the rest.

The output folder (resumable; every shard is a pure function of the config and its index):

- `config.json`: what was asked (target, its weights' sha256, the prompt source, every setting);
- `shard-NNNNN.npz`: `tokens` (B, seq_len) int32, `prompt_len` (B,) int32, `greedy` (B,) bool,
  `length` (B,) int32 (a chat answer stops at its first EOS; the row is EOS-filled after it);
- `checksums.json`: sha256 of every finished shard, written after each one;
- `throughput.json`: batched decoding against one sequence at a time, measured at the start.
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from hyflash.models.batched import decode_batch
from hyflash.models.files import sha256, write_json_atomic
from hyflash.models.target import Target

FORMAT = "hyflash-regenerated-1"


@dataclasses.dataclass(frozen=True)
class RegenConfig:
    tokens: int = 1_000_000  # response tokens to write, at least (whole batches)
    greedy_share: float = 0.5
    temperature: float = 1.0
    prompt_len: tuple[int, int] | None = (64, 384)  # drawn once per batch; None for chat prompts (their own)
    seq_len: int = 512  # prompt + response
    batch: int = 32
    seed: int = 0

    def __post_init__(self):
        lo, hi = self.prompt_len or (1, 1)
        if not 1 <= lo <= hi < self.seq_len:
            raise ValueError(f"--prompt-len {lo}..{hi} must satisfy 1 <= a <= b < --seq-len {self.seq_len}")
        if not 0 <= self.greedy_share <= 1:
            raise ValueError(f"--greedy-share must be in [0, 1], got {self.greedy_share}")
        if self.temperature <= 0 and self.greedy_share < 1:
            raise ValueError(f"--temperature must be > 0 for the sampled share, got {self.temperature}")
        if self.tokens < 1 or self.batch < 1:
            raise ValueError("--tokens and --batch must be positive")

    @property
    def shards(self) -> int:
        """Whole batches until `tokens` response tokens; a batch's response is at least seq_len - b
        (chat: counted as half the sequence)."""
        per = self.batch * (self.seq_len - self.prompt_len[1] if self.prompt_len else self.seq_len // 2)
        return -(-self.tokens // per)


@dataclasses.dataclass
class ChatPrompts:
    """Chat prompts: each a conversation up to an assistant turn, rendered by the target's template with
    the generation prompt (`hyflash.train.sources.chat_prompts`); the target answers until an EOS id."""
    prompts: list[list[int]]
    eos: tuple[int, ...]

    def shards(self, cfg: RegenConfig) -> int:
        return min(cfg.shards, -(-len(self.prompts) // cfg.batch))


def make_shard(model: Target, source, cfg: RegenConfig, index: int) -> dict[str, np.ndarray]:
    """Shard `index` of a token stream (prompts cut from it) or of `ChatPrompts`: its prompts, greedy
    rows and sampling draws all come from (seed, index)."""
    if isinstance(source, ChatPrompts):
        return _chat_shard(model, source, cfg, index)
    stream = source
    rng = np.random.default_rng([cfg.seed, index])
    p = int(rng.integers(cfg.prompt_len[0], cfg.prompt_len[1] + 1))
    starts = rng.integers(0, len(stream) - p, size=cfg.batch)
    prompts = np.stack([stream[s:s + p] for s in starts]).astype(np.int64)  # (B, p)
    greedy = rng.random(cfg.batch) < cfg.greedy_share
    temperature = torch.from_numpy(np.where(greedy, 0.0, cfg.temperature))
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    new = decode_batch(model, torch.from_numpy(prompts), cfg.seq_len - p, temperature, gen).numpy()
    return {"tokens": np.concatenate([prompts, new], axis=1).astype(np.int32),
            "prompt_len": np.full(cfg.batch, p, np.int32), "greedy": greedy,
            "length": np.full(cfg.batch, cfg.seq_len, np.int32)}


def _chat_shard(model: Target, chats: ChatPrompts, cfg: RegenConfig, index: int) -> dict[str, np.ndarray]:
    """Prompts index*B.. (left-padded to one length for decoding); each answer runs to its first EOS
    (kept) or to seq_len; the row is stored left-aligned, EOS-filled after `length`."""
    rng = np.random.default_rng([cfg.seed, index])
    rows = chats.prompts[index * cfg.batch:(index + 1) * cfg.batch]
    lens = np.array([len(r) for r in rows])
    width = int(lens.max())
    padded = torch.tensor([[chats.eos[0]] * (width - len(r)) + r for r in rows])
    greedy = rng.random(len(rows)) < cfg.greedy_share
    temperature = torch.from_numpy(np.where(greedy, 0.0, cfg.temperature))
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    new = decode_batch(model, padded, cfg.seq_len - int(lens.min()), temperature, gen,
                       pad=torch.from_numpy(width - lens)).numpy()
    tokens = np.full((len(rows), cfg.seq_len), chats.eos[0], np.int32)
    length = np.zeros(len(rows), np.int32)
    for b, (prompt, answer) in enumerate(zip(rows, new)):
        answer = answer[:cfg.seq_len - len(prompt)]
        stop = next((i + 1 for i, t in enumerate(answer) if int(t) in chats.eos), len(answer))
        row = prompt + answer[:stop].tolist()
        tokens[b, :len(row)] = row
        length[b] = len(row)
    return {"tokens": tokens, "prompt_len": lens.astype(np.int32), "greedy": greedy, "length": length}


def _save_npz(path: Path, arrays: dict) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


def regenerate(model: Target, prompts, cfg: RegenConfig, out: Path, source: dict,
               progress: bool = True) -> dict:
    """Write (or resume) the folder; returns its summary. `prompts`: a token stream to cut prompts from,
    or `ChatPrompts`. `source` (target path and sha256, prompt source) goes into config.json: a folder
    made from other settings or another target is refused."""
    out = Path(out)
    chat = isinstance(prompts, ChatPrompts)
    shards = prompts.shards(cfg) if chat else cfg.shards
    config = {"format": FORMAT, **source, **dataclasses.asdict(cfg), "shards": shards,
              "prompts": "chat" if chat else "stream"}
    config["prompt_len"] = list(cfg.prompt_len) if cfg.prompt_len else None
    if (out / "config.json").is_file():
        old = json.loads((out / "config.json").read_text())
        if old != config:
            diff = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
            raise ValueError(f"{out} was regenerated with other settings ({', '.join(diff)}); "
                             "use another --out or delete it to start over")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", config)
    sums = json.loads((out / "checksums.json").read_text()) if (out / "checksums.json").is_file() else {}
    if not chat and not (out / "throughput.json").is_file():
        write_json_atomic(out / "throughput.json", measure_throughput(model, prompts, cfg))
    model.eval()
    bar = tqdm(range(shards), desc="regenerate", unit="shard", disable=not progress, dynamic_ncols=True)
    for i in bar:
        name = f"shard-{i:05d}.npz"
        if name in sums and (out / name).is_file() and sha256(out / name) == sums[name]:
            continue  # done in an earlier run
        t = time.perf_counter()
        shard = make_shard(model, prompts, cfg, i)
        _save_npz(out / name, shard)
        sums[name] = sha256(out / name)
        write_json_atomic(out / "checksums.json", sums)
        written = int((shard["length"] - shard["prompt_len"]).sum())
        bar.set_postfix(tok_s=f"{written / (time.perf_counter() - t):.0f}")
    return {"folder": str(out), "shards": shards, **load_regenerated(out).summary()}


def measure_throughput(model: Target, stream: np.ndarray, cfg: RegenConfig, new: int = 64) -> dict:
    """Response tokens/s of one batch of `cfg.batch` against one sequence, same prompt length, greedy."""
    p = cfg.prompt_len[0]
    prompts = torch.from_numpy(np.stack([stream[i * p:(i + 1) * p] for i in range(cfg.batch)]).astype(np.int64))
    rates = {}
    for label, rows in (("single", prompts[:1]), ("batched", prompts)):
        decode_batch(model, rows, 2)  # warm-up
        t = time.perf_counter()
        decode_batch(model, rows, new)
        rates[label] = rows.shape[0] * new / (time.perf_counter() - t)
    return {"prompt_len": p, "new_tokens": new, "batch": cfg.batch, "threads": torch.get_num_threads(),
            "single_tokens_per_s": rates["single"], "batched_tokens_per_s": rates["batched"],
            "ratio": rates["batched"] / rates["single"]}


@dataclasses.dataclass
class Regenerated:
    """A regenerated folder, loaded and checked: tokens (n, seq_len) int32, prompt_len (n,), greedy (n,),
    length (n,) (tokens of the row that are prompt or answer; a chat answer ends at its EOS)."""
    folder: Path
    config: dict
    tokens: np.ndarray
    prompt_len: np.ndarray
    greedy: np.ndarray
    length: np.ndarray

    def summary(self) -> dict:
        return {"sequences": len(self.tokens), "response_tokens": int((self.length - self.prompt_len).sum()),
                "greedy_sequences": int(self.greedy.sum())}


def is_regenerated(folder: Path) -> bool:
    path = Path(folder) / "config.json"
    return path.is_file() and json.loads(path.read_text()).get("format") == FORMAT


def load_regenerated(folder: Path) -> Regenerated:
    """Every finished shard, checksums verified; an unfinished folder is refused."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    sums = json.loads((folder / "checksums.json").read_text()) if (folder / "checksums.json").is_file() else {}
    names = [f"shard-{i:05d}.npz" for i in range(config["shards"])]
    missing = [n for n in names if n not in sums]
    if missing:
        raise ValueError(f"{folder}: {len(missing)} of {len(names)} shards not written yet; rerun the same "
                         "`hyflash regenerate` command to finish it")
    parts = []
    for n in names:
        if sha256(folder / n) != sums[n]:
            raise ValueError(f"{folder / n}: checksum mismatch (changed after it was written); delete it and "
                             "rerun `hyflash regenerate` to write it again")
        with np.load(folder / n) as z:
            length = z["length"] if "length" in z else np.full(len(z["tokens"]), z["tokens"].shape[1], np.int32)
            parts.append((z["tokens"], z["prompt_len"], z["greedy"], length))
    tokens, plen, greedy, length = (np.concatenate(x) for x in zip(*parts))
    return Regenerated(folder, config, tokens, plen, greedy, length)
