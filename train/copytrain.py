"""The copy curriculum's batches and probes, wired into `hyflash.train.loop.train`.

`train` calls `batch_fn(rng, n)` then `loss_fn(model, batch)` once per step, with no step
number; this object counts steps itself, starting from the run's checkpoint (so a resumed run
draws the stage it would have drawn). Every `probe_every` steps the loss function first measures
the model (copy rate at two filler lengths, with the matches after a greedy copy's first miss and
the teacher-forced recovery after an own miss, plain held-out loss on a few windows, random-token
induction accuracy): the figures go into that step's log entry (`probe_after` = updates done) and
one line on stdout. A stage with `own_misses` runs the model twice a step: once without gradients
to find the copied tokens it misses, once on the rows with those misses in the inputs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hyflash.train.copyprobe import copy_breakdowns, induction_accuracy, own_miss_inputs, recovery_accuracy
from hyflash.train.data import sample_windows
from hyflash.train.evaluate import loss_by_position
from hyflash.train.loop import model_device
from hyflash.train.repeats import CURRICULA, Stage, curriculum_rows, stage_at


@dataclasses.dataclass(frozen=True)
class WeightedRows:
    tokens: np.ndarray  # (n, T+1) int64
    weights: np.ndarray  # (n, T+1) float32: weights[:, j] weighs the prediction of tokens[:, j]
    copies: np.ndarray | None = None  # (n, T+1) bool: the tokens a repeated copy predicts
    forced: np.ndarray | None = None  # (n, T+1) bool: copied tokens to replace by a wrong guess

    def __getitem__(self, rows: slice) -> "WeightedRows":  # train() slices a batch by rank
        return WeightedRows(*(None if a is None else a[rows]
                              for a in (self.tokens, self.weights, self.copies, self.forced)))


def weighted_lm_loss(model, batch: WeightedRows, own_misses: bool = False) -> torch.Tensor:
    """Next-token cross-entropy weighted per token (all weights 1: `lm_loss`); with `own_misses`, on
    inputs that carry the model's misses of the copies (`own_miss_inputs`)."""
    device = model_device(model)
    tokens, w = torch.from_numpy(batch.tokens).to(device), torch.from_numpy(batch.weights[:, 1:]).to(device)
    inputs = tokens
    if own_misses and batch.copies is not None:
        forced = None if batch.forced is None else torch.from_numpy(batch.forced).to(device)
        inputs = own_miss_inputs(model, tokens, torch.from_numpy(batch.copies).to(device), forced)
    logits, _ = model(inputs[:, :-1])
    ce = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    return (ce * w.flatten()).sum() / w.sum().clamp(min=1e-6)


def checkpoint_step(out: Path) -> int:
    state = out / "checkpoint" / "state.json"
    return json.loads(state.read_text())["step"] if state.is_file() else 0


class CopyCurriculum:
    def __init__(self, train_stream: np.ndarray, heldout: np.ndarray | None, vocab: int, eos: int,
                 seq_len: int, out: Path, name: str | None = "copy", probe_every: int | None = None,
                 probe_fillers=(256, 1536), probe_n: int = 8, probe_windows: int = 4):
        self.stream, self.heldout, self.vocab, self.eos = train_stream, heldout, vocab, eos
        self.length = seq_len + 1
        self.schedule: tuple[Stage, ...] | None = CURRICULA[name] if name else None
        self.probe_every, self.fillers, self.probe_n, self.windows = probe_every, probe_fillers, probe_n, probe_windows
        self.step = checkpoint_step(out)

    def batch_fn(self, rng: np.random.Generator, n: int) -> "WeightedRows":
        """n rows of seq_len + 1 tokens for the current step, with their loss weights."""
        if self.schedule is None:
            rows = sample_windows(self.stream, n, self.length, rng)
            return WeightedRows(rows, np.ones(rows.shape, np.float32))
        return WeightedRows(*curriculum_rows(self.stream, self.vocab, self.eos, self.schedule, self.step, rng, n,
                                             self.length))

    def loss_fn(self, model, batch: "WeightedRows"):
        extra = {}
        if self.probe_every and self.step > 0 and self.step % self.probe_every == 0:
            extra = self.probe(model)
        own_misses = self.schedule is not None and stage_at(self.schedule, self.step).own_misses
        self.step += 1
        return weighted_lm_loss(model, batch, own_misses), extra

    @torch.no_grad()
    def probe(self, model) -> dict[str, float]:
        model = getattr(model, "module", model)
        rates = {}
        for name, b in copy_breakdowns(model, self.heldout, self.fillers, self.probe_n, eos=self.eos).items():
            rates[name], rates["after_miss" + name[4:]] = b["rate"], b["after_miss"]
        for f in self.fillers:
            rates[f"recovery_{f}"] = recovery_accuracy(model, self.heldout, f, self.probe_n, eos=self.eos)
        report = loss_by_position(model, self.heldout, self.length - 1, self.windows)
        buckets = {(b["from"], b["to"]): b["loss"] for b in report["loss_by_position"]}
        out = {"probe_after": float(self.step), **rates, "heldout_loss": report["loss"],
               "heldout_acc": report["accuracy"], "induction_acc": induction_accuracy(model, self.vocab, eos=self.eos)}
        if (128, 256) in buckets and (1024, 2048) in buckets:
            out["loss_128_256"], out["loss_1024_2048"] = buckets[(128, 256)], buckets[(1024, 2048)]
        stage = stage_at(self.schedule, self.step) if self.schedule else None
        print(json.dumps({"probe": out, "stage_until": stage.until if stage else None}), flush=True)
        return out
