"""One training loop for the target and the drafters: one process, or DDP under torchrun; CPU or GPU.

Devices (`--device auto|cpu|cuda|mps`): under torchrun each rank trains on its own device
(cuda:LOCAL_RANK) and the process group is NCCL on CUDA, gloo on CPU. On a GPU the loop runs
under bf16 autocast over fp32 master weights (the frozen target of a drafter run sits in bf16).

Under `torchrun` each rank takes its slice of the same global batch (drawn from a generator
seeded by (seed, step), so a resumed run sees the batches it would have seen), gradients are
averaged by DDP, and the logged loss is the all-reduced global mean: the same numbers a single
process computes on the whole global batch.

Checkpoints (every `checkpoint_every` steps and at the end) are `model.safetensors` +
`optimizer.pt` (loaded with weights_only=True) + `state.json`; `resume` picks up the latest.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from hyflash.models.files import replace_folder, write_json_atomic


@dataclasses.dataclass
class TrainConfig:
    out: Path
    steps: int
    batch: int  # global batch (sequences); split evenly across ranks
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    checkpoint_every: int = 50
    seed: int = 0
    threads: int | None = None
    device: str = "auto"  # auto | cpu | cuda | mps
    stop_after: int | None = None  # end the run after this step, on the schedule of `steps` (a stage cut short)

    def __post_init__(self):
        for name in ("steps", "batch", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        t = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


DEVICES = ("auto", "cpu", "cuda", "mps")


def pick_device(requested: str = "auto") -> torch.device:
    """This process's device: auto = CUDA if visible, else MPS (one process), else CPU; on CUDA,
    rank LOCAL_RANK of a torchrun launch takes cuda:LOCAL_RANK."""
    if requested not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {requested!r}")
    cuda = torch.cuda.is_available()
    mps = torch.backends.mps.is_available() and int(os.environ.get("WORLD_SIZE", "1")) == 1
    if requested == "auto":
        requested = "cuda" if cuda else "mps" if mps else "cpu"
    if requested == "cuda":
        if not cuda:
            raise ValueError("--device cuda: no CUDA device is visible to torch; use --device cpu (or auto)")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA devices; launch "
                             "torchrun with --nproc_per_node at most the device count")
        return torch.device("cuda", local)
    if requested == "mps":
        if not mps:
            raise ValueError("--device mps: MPS is not available here (or several processes were launched)")
        return torch.device("mps")
    return torch.device("cpu")


def process_group_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def world(device: torch.device | None = None) -> tuple[int, int]:
    """(rank, world size); the first call under torchrun initialises the process group for `device`'s
    kind (NCCL for CUDA, gloo otherwise)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1 and not dist.is_initialized():
        device = device or torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(process_group_backend(device))
    return (dist.get_rank(), size) if size > 1 else (0, 1)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def is_writer() -> bool:
    """Rank 0 writes checkpoints, logs and the final model; the other ranks write nothing."""
    return world()[0] == 0


def write_folder(dest: Path, fill: Callable[[Path], None]) -> None:
    """`fill(tmp)` writes a folder's files into a temporary sibling, which then replaces `dest` in
    one rename: a reader never sees half a model. Rank 0 only; other ranks wait for it."""
    try:
        if is_writer():
            tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            fill(tmp)
            replace_folder(tmp, dest)
    finally:  # every rank returns once the folder is complete (or rank 0 failed: nobody waits forever)
        if dist.is_initialized():
            dist.barrier()


def trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p for k, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(model, opt, step: int, cfg: TrainConfig, log: list[dict]) -> None:
    ckpt = cfg.out / "checkpoint"
    tmp = cfg.out / "checkpoint.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    weights = {k: p.detach().contiguous().clone() for k, p in trainable(model).items()}
    save_file(weights, tmp / "model.safetensors")
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "log": log}))
    if ckpt.exists():
        for f in ckpt.iterdir():
            f.unlink()
        ckpt.rmdir()
    tmp.rename(ckpt)


def load_checkpoint(model, opt, cfg: TrainConfig) -> tuple[int, list[dict]]:
    ckpt = cfg.out / "checkpoint"
    if not (ckpt / "state.json").is_file():
        return 0, []
    missing, unexpected = model.load_state_dict(load_file(ckpt / "model.safetensors"), strict=False)
    if unexpected or set(missing) & set(trainable(model)):
        raise ValueError(f"{ckpt}: checkpoint does not match the model (delete it to start over)")
    if (ckpt / "optimizer.pt").is_file():
        opt.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
    # else a checkpoint kept without its optimizer state (research/scripts/target_v2.sh commits weights and step
    # only, not the 84 MB of Adam moments): the moments start afresh at the saved step
    state = json.loads((ckpt / "state.json").read_text())
    return state["step"], state["log"]


def check_run_config(out: Path, run_config: dict) -> None:
    """A run folder records what it was started with (run_config.json); resuming it with anything else
    (other flags, data, target) would silently mix two runs, so it is refused in one line."""
    path = Path(out) / "run_config.json"
    run_config = json.loads(json.dumps(run_config, default=str))  # as it reads back (tuples as lists)
    started = path.is_file()
    if dist.is_initialized():  # every rank has looked before rank 0 writes: they all take one branch
        dist.barrier()
    if started:
        old = json.loads(path.read_text())
        diff = sorted(k for k in set(old) | set(run_config) if old.get(k) != run_config.get(k))
        if diff:
            shown = ", ".join(f"{k}: {old.get(k)!r} -> {run_config.get(k)!r}" for k in diff[:3])
            raise ValueError(f"{out} holds a run started with other settings ({shown}); resume it with the same "
                             "flags, or use another --out")
        return
    if is_writer():
        Path(out).mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, run_config)


def count_tokens(batch) -> int:
    tokens = getattr(batch, "tokens", batch)
    return int(np.asarray(tokens).size)


def train(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module, np.ndarray], tuple[torch.Tensor, dict]],
          batch_fn: Callable[[np.random.Generator, int], np.ndarray], cfg: TrainConfig,
          desc: str = "train", eval_fn: Callable[[torch.nn.Module], dict] | None = None,
          eval_every: int | None = None, run_config: dict | None = None) -> list[dict]:
    """Run (or resume) training. `batch_fn(rng, n)` draws n sequences; `loss_fn(model, batch)`
    returns (mean loss, extra metrics); every `eval_every` steps (and at the end) `eval_fn(model)`
    adds held-out figures to that step's log entry. `run_config` (flags, data, model) is checked on
    resume. Returns the log: one dict per step."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    rank, size = world(device)  # first: the process group's backend follows the device
    if run_config is not None:
        check_run_config(cfg.out, {**run_config, **_resume_identity(cfg)})
    if cfg.batch % size:
        raise ValueError(f"global batch {cfg.batch} is not divisible by the world size {size}")
    torch.manual_seed(cfg.seed)
    model.to(device)
    params = list(trainable(model).values())
    opt = _optimizer(params, cfg)
    start, log = load_checkpoint(model, opt, cfg)
    # buffers (the drafter's view of the target's embedding and LM head, masks, the draft vocabulary) are
    # the same on every rank and never change: not re-sent every step (hundreds of MB at a real vocabulary)
    wrapped = (torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                                         broadcast_buffers=False)
               if size > 1 else model)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    if rank == 0:
        cfg.out.mkdir(parents=True, exist_ok=True)
    end = min(cfg.steps, cfg.stop_after or cfg.steps)
    bar = tqdm(range(start, end), initial=start, total=end, desc=desc, disable=rank != 0,
               dynamic_ncols=True)
    per_rank = cfg.batch // size
    t0 = time.time() - (log[-1]["elapsed_s"] if log else 0.0)  # wall time adds up across resumes
    for step in bar:
        t_step = time.time()
        rng = np.random.default_rng([cfg.seed, step])
        batch = batch_fn(rng, cfg.batch)[rank * per_rank:(rank + 1) * per_rank]
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step)
        with autocast:
            loss, extra = loss_fn(wrapped, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        entry = {"step": step + 1, **_mean_over_ranks(loss, extra, size, device), "lr": cfg.lr_at(step),
                 "grad_norm": float(grad_norm), "elapsed_s": round(time.time() - t0, 1),
                 "tokens_per_s": round(count_tokens(batch) * size / (time.time() - t_step), 1)}
        if eval_fn is not None and eval_every and ((step + 1) % eval_every == 0 or step + 1 == end):
            entry.update(_held_out(model, eval_fn, autocast))
        log.append(entry)
        bar.set_postfix(loss=f"{entry['loss']:.3f}", tok_s=f"{entry['tokens_per_s']:.0f}",
                        **({"heldout_tau": f"{entry['heldout_tau']:.2f}"} if "heldout_tau" in entry else {}))
        if rank == 0 and ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == end):
            save_checkpoint(model, opt, step + 1, cfg, log)
            write_log(cfg.out, log)
    if size > 1:
        _record_rank_checksums(params, rank, size, cfg.out)
    return log


def _resume_identity(cfg: TrainConfig) -> dict:
    """The settings a resumed run must share with the run it continues (not threads, device, cadence)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(cfg).items()
            if k not in ("threads", "device", "checkpoint_every", "stop_after")}


def _mean_over_ranks(loss: torch.Tensor, extra: dict, size: int, device) -> dict:
    """The step's loss and metrics, averaged over the ranks."""
    stats = torch.tensor([loss.item(), *(float(v) for v in extra.values())], dtype=torch.float64, device=device)
    if size > 1:
        dist.all_reduce(stats)
        stats /= size
    return {"loss": stats[0].item(), **{k: v.item() for k, v in zip(extra, stats[1:])}}


def _optimizer(params: list[torch.Tensor], cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW, weight decay on matrices only."""
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def _held_out(model: torch.nn.Module, eval_fn: Callable, autocast) -> dict:
    """eval_fn's figures, named heldout_*, measured in eval mode."""
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast:
        out = {f"heldout_{k}": float(v) for k, v in eval_fn(model).items()}
    model.train(was_training)
    return out


def write_log(out: Path, log: list[dict]) -> None:
    with open(out / "log.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in log)


def _record_rank_checksums(params, rank: int, size: int, out: Path) -> None:
    """Every rank's (sum, sum of squares) of its weights, so anyone can check they agree."""
    mine = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().pow(2).sum()])
                        for p in params]).flatten()
    every = [torch.zeros_like(mine) for _ in range(size)]
    dist.all_gather(every, mine)
    if rank == 0:
        (out / "rank_checksums.json").write_text(json.dumps([e.tolist() for e in every]))


def lm_loss(model, batch: np.ndarray):
    """Next-token cross-entropy of a (B, T+1) batch of token windows: the target's training loss."""
    tokens = torch.from_numpy(batch).to(model_device(model))
    logits, _ = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()), {}
