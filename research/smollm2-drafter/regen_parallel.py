"""Finish a conversations folder with several `hyflash regenerate` processes at once (one GPU or many).

`hyflash regenerate` writes one shard after another; a shard is a function of the prompts, the settings
and its index alone, so shards can be written by different processes and put together. This copies the
folder once per worker, marks in each copy the shards the other workers take as taken (worker k takes
shards k, k+W, ...), runs the workers with `--no-features` on `--device`, and moves every finished
shard back into the folder with its checksum and answer-token count (a shard a worker had not finished
when `--seconds` ran out is dropped; the folder's readers use its finished prefix).

    python research/smollm2-drafter/regen_parallel.py --target DIR --workers 8 --seconds 240
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hyflash.models.files import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompts", type=Path, default=ROOT / "data/chat/train-prompts.jsonl")
    ap.add_argument("--data", type=Path, default=ROOT / "data/chat/smollm2-regen")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=240)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", type=Path, default=Path("/tmp/regen-workers"))
    args = ap.parse_args()
    cfg = json.loads((args.data / "config.json").read_text())
    shards = -(-cfg["conversations"] // cfg["batch"])
    sums = json.loads((args.data / "checksums.json").read_text())
    todo = [i for i in range(shards) if f"shard-{i:05d}.npz" not in sums]
    print(f"{len(todo)} of {shards} shards to write, {args.workers} workers", flush=True)
    shutil.rmtree(args.work, ignore_errors=True)
    procs = []
    for k in range(args.workers):
        copy = args.work / f"w{k}"
        shutil.copytree(args.data, copy, ignore=shutil.ignore_patterns("features"))
        mine = set(todo[k::args.workers])
        taken = {**sums, **{f"shard-{i:05d}.npz": "taken" for i in todo if i not in mine}}
        (copy / "checksums.json").write_text(json.dumps(taken))
        cmd = [sys.executable, "-m", "hyflash.cli", "regenerate", "--target", args.target,
               "--prompts-from", str(args.prompts), "--out", str(copy), "--tokens", "100000000",
               "--batch", str(cfg["batch"]), "--max-new-tokens", str(cfg["max_new"]), "--seq-len", str(cfg["seq_len"]),
               "--greedy-share", str(cfg["greedy_share"]), "--temperature", str(cfg["temperature"]),
               "--seed", str(cfg["seed"]), "--threads", "1", "--no-features", "--device", args.device]
        procs.append(subprocess.Popen(cmd, stdout=open(copy.parent / f"w{k}.log", "w"), stderr=subprocess.STDOUT))
    t0 = time.time()
    while any(p.poll() is None for p in procs) and time.time() - t0 < args.seconds:
        time.sleep(2)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        p.wait()
    counts = json.loads((args.data / "answer_tokens.json").read_text())
    runs = json.loads((args.data / "throughput.json").read_text()) if (args.data / "throughput.json").is_file() else []
    runs_before = list(runs)
    for k in range(args.workers):
        copy = args.work / f"w{k}"
        got = json.loads((copy / "checksums.json").read_text())
        got_counts = json.loads((copy / "answer_tokens.json").read_text())
        for name, digest in got.items():
            if digest == "taken" or name in sums:
                continue
            shutil.copy2(copy / name, args.data / name)
            sums[name] = digest
            counts[name[:-4]] = got_counts[name[:-4]]
        own = json.loads((copy / "throughput.json").read_text())[len(runs_before):]  # this worker's run
        runs += [dict(r, worker=k, workers=args.workers) for r in own if r.get("shards")]
    write_json_atomic(args.data / "checksums.json", dict(sorted(sums.items())))
    write_json_atomic(args.data / "answer_tokens.json", dict(sorted(counts.items())))
    write_json_atomic(args.data / "throughput.json", runs)
    prefix = 0
    while f"shard-{prefix:05d}.npz" in sums:
        prefix += 1
    print(json.dumps({"shards": len(sums), "finished_prefix": prefix, "answer_tokens": sum(counts.values()),
                      "seconds": round(time.time() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
