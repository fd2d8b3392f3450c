"""`hyflash regenerate --prompts-from PROMPTS.jsonl`: the target answers conversations turn by turn, and
its tap features and own argmax are written in the same pass (the drafter's training data).

Each line of the prompts file is `{"turns": [user message, ...], ...}`. Turn t is rendered after
the conversation so far as the target read and wrote it (`hyflash.models.chat.Transcript`, as `hyflash
chat` renders it), answered until the template's end of turn or `max_new` tokens; a conversation
stops early where the next turn would not fit in `seq_len`, or where the template renders the history
differently from the ids the target read and wrote (the next turn would not extend them). A batch of conversations is decoded at
once, finished answers leaving the batch (`hyflash.models.batched.answer_batch`). Each conversation is
greedy or sampled at `temperature` as a whole.

The folder (resumable; shard i is a pure function of the prompts, the settings and i; `--tokens` only
says where to stop, so a pilot is the start of the full run):

- `config.json`: target and its weights' sha256, the prompts file's sha256, every setting;
- `shard-NNNNN.npz` (committed: a few MB in all): `tokens` (B, seq_len) int32 (end-of-turn-filled after
  `length`), `length` (B,), `answer` (B, seq_len) bool (the positions the target wrote), `greedy` (B,),
  `turns` (B,) answered, `category` (B,) str;
- `features/shard-NNNNN.npy` (sum of lengths, K*H) fp16, the taps' outputs at every position of the
  shard's rows one after another (row b's start at the sum of the lengths before it; a row's last
  position is zero: it is never fed back), and `features/shard-NNNNN.labels.npy` (sum of lengths,)
  int32, the target's argmax after each position where it was computed (the answers and each
  prompt's last token; -1 elsewhere); memory-mapped by the trainer; not committed (GBs);
- `checksums.json` and `features/checksums.json`: sha256 of every finished file;
- `throughput.json`: answer tokens, seconds and tokens/s of the shards written by each run, and each shard's.
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

from hyflash.models.batched import answer_batch
from hyflash.models.chat import Transcript
from hyflash.models.files import sha256, write_json_atomic
from hyflash.models.target import Target

FORMAT = "hyflash-chat-regenerated-1"
NOT_IDENTITY = ("tokens", "features")  # settings a folder can be continued with changed (ChatRegenConfig.identity)


@dataclasses.dataclass(frozen=True)
class ChatRegenConfig:
    tokens: int = 1_000_000  # stop after the shard that brings the answers' tokens to this many
    greedy_share: float = 0.5
    temperature: float = 1.0
    max_new: int = 320  # tokens per answer at most
    seq_len: int = 1024  # a conversation's tokens at most (a turn is answered only if max_new more fit)
    batch: int = 48
    seed: int = 0
    features: bool = True  # write the taps' features and the target's argmax in the same pass

    def __post_init__(self):
        if not 0 <= self.greedy_share <= 1:
            raise ValueError(f"--greedy-share must be in [0, 1], got {self.greedy_share}")
        if self.temperature <= 0 and self.greedy_share < 1:
            raise ValueError(f"--temperature must be > 0 for the sampled share, got {self.temperature}")
        if min(self.tokens, self.batch, self.max_new) < 1 or self.seq_len <= self.max_new + 8:
            raise ValueError("--tokens, --batch and --max-new-tokens must be positive and --seq-len > max-new + 8")

    def identity(self) -> dict:
        """What fixes the shards' contents (not `tokens`, which only says where to stop, nor `features`: a
        folder can be continued without them and its cache finished by `hyflash cache-features`)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in NOT_IDENTITY}


def answer_shard(model: Target, tokenizer, eos: tuple[int, ...], rows: list[dict], cfg: ChatRegenConfig,
                 index: int) -> tuple[dict, dict | None]:
    """Shard `index`: (token arrays, feature arrays or None)."""
    rng = np.random.default_rng([cfg.seed, index])
    greedy = rng.random(len(rows)) < cfg.greedy_share
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    chats = [Transcript(tokenizer) for _ in rows]
    answer = np.zeros((len(rows), cfg.seq_len), bool)
    turns = np.zeros(len(rows), np.int32)
    feats: list = [None] * len(rows)
    labels: list = [None] * len(rows)
    taps = model.taps if cfg.features else ()
    for t in range(max(len(r["turns"]) for r in rows)):
        todo = []
        for b, row in enumerate(rows):
            if len(row["turns"]) > t and turns[b] == t:
                prompt, text = chats[b].prompt(row["turns"][t])
                extends = prompt[:len(chats[b].ids)] == chats[b].ids  # else the template re-rendered the history
                if extends and len(prompt) + cfg.max_new <= cfg.seq_len:
                    todo.append((b, prompt, text))
        if not todo:
            break
        temperature = torch.tensor([0.0 if greedy[b] else cfg.temperature for b, _, _ in todo])
        answers = answer_batch(model, [p for _, p, _ in todo], cfg.max_new, temperature, gen, eos, taps)
        for (b, prompt, text), a in zip(todo, answers):
            chats[b].record(rows[b]["turns"][t], prompt, text, a.tokens)
            answer[b, len(prompt):len(prompt) + len(a.tokens)] = True
            turns[b] += 1
            if taps:
                if labels[b] is not None:  # earlier answers' labels: from their own pass
                    a.labels[:len(labels[b])] = np.where(a.labels[:len(labels[b])] < 0, labels[b],
                                                         a.labels[:len(labels[b])])
                feats[b], labels[b] = a.features, a.labels
    tokens = np.full((len(rows), cfg.seq_len), eos[0], np.int32)
    length = np.zeros(len(rows), np.int32)
    for b, chat in enumerate(chats):
        tokens[b, :len(chat.ids)] = chat.ids
        length[b] = len(chat.ids)
    arrays = {"tokens": tokens, "length": length, "answer": answer, "greedy": greedy, "turns": turns,
              "category": np.array([str(r.get("category", "")) for r in rows])}
    if not taps:
        return arrays, None
    none = (np.zeros((0, model.feature_size), np.float16), np.zeros(0, np.int32))  # a row with no turn answered
    f = np.concatenate([feats[b] if feats[b] is not None else none[0] for b in range(len(rows))])  # (sum of lengths, K*H)
    lab = np.concatenate([labels[b] if labels[b] is not None else none[1] for b in range(len(rows))])
    return arrays, {"features": f, "labels": lab}


def _save(path: Path, write) -> str:
    """Write through a temporary sibling, rename; returns the file's sha256."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
    tmp.replace(path)
    return sha256(path)


def _npz(arrays: dict):
    def write(f):
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)  # a conversation row is mostly padding
        f.write(buf.getvalue())
    return write


def regenerate_chats(model: Target, tokenizer, eos: tuple[int, ...], conversations: list[dict],
                     cfg: ChatRegenConfig, out: Path, source: dict, progress: bool = True) -> dict:
    """Write (or resume, or extend) the folder; returns its summary."""
    out = Path(out)
    shards_max = -(-len(conversations) // cfg.batch)
    config = {"format": FORMAT, **source, **cfg.identity(), "taps": list(model.taps), "conversations":
              len(conversations)}
    if (out / "config.json").is_file():
        old = {k: v for k, v in json.loads((out / "config.json").read_text()).items() if k not in NOT_IDENTITY}
        if old != config:
            diff = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
            raise ValueError(f"{out} was regenerated with other settings ({', '.join(diff)}); "
                             "use another --out or delete it to start over")
    (out / "features").mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", {**config, "tokens": cfg.tokens})
    sums = _read(out / "checksums.json")
    fsums = _read(out / "features" / "checksums.json")
    runs = json.loads((out / "throughput.json").read_text()) if (out / "throughput.json").is_file() else []
    run = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": torch.get_num_threads(),
           "device": str(model.embed.weight.device), "shards": 0,
           "answer_tokens": 0, "seconds": 0.0}
    runs.append(run)
    model.eval()
    written = sum(int(v) for v in _read(out / "answer_tokens.json").values())
    counts = _read(out / "answer_tokens.json")
    bar = tqdm(total=cfg.tokens, initial=min(written, cfg.tokens), desc="regenerate", unit="tok",
               disable=not progress, dynamic_ncols=True)
    for i in range(shards_max):
        name = f"shard-{i:05d}"
        if f"{name}.npz" in sums:  # written: kept (a checkout without the features rebuilds them with cache-features)
            continue
        if written >= cfg.tokens:
            break
        t = time.perf_counter()
        arrays, feats = answer_shard(model, tokenizer, eos, conversations[i * cfg.batch:(i + 1) * cfg.batch],
                                     cfg, i)
        if feats is not None:
            fsums[f"{name}.npy"] = _save(out / "features" / f"{name}.npy", lambda f: np.save(f, feats["features"]))
            fsums[f"{name}.labels.npy"] = _save(out / "features" / f"{name}.labels.npy",
                                                lambda f: np.save(f, feats["labels"]))
            write_json_atomic(out / "features" / "checksums.json", fsums)
        sums[f"{name}.npz"] = _save(out / f"{name}.npz", _npz(arrays))
        n = int(arrays["answer"].sum())
        counts[name] = n
        write_json_atomic(out / "answer_tokens.json", counts)
        write_json_atomic(out / "checksums.json", sums)
        written += n
        run["shards"] += 1
        run["answer_tokens"] += n
        run["seconds"] = round(run["seconds"] + time.perf_counter() - t, 1)
        run["answer_tokens_per_s"] = round(run["answer_tokens"] / run["seconds"], 1)
        run.setdefault("per_shard", []).append({"shard": i, "answer_tokens": n,
                                                "seconds": round(time.perf_counter() - t, 1)})
        write_json_atomic(out / "throughput.json", runs)
        bar.update(n)
        bar.set_postfix(tok_s=f"{n / (time.perf_counter() - t):.0f}")
    bar.close()
    return {"folder": str(out), "shards": len(sums), "answer_tokens": written, "throughput": run}


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
