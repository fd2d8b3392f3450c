"""`hyflash train-drafter`: distil a drafter from a frozen target (docs/design.md).

For each training sequence the target runs once (no grad) and gives the features and its own
next-token choices; anchors are sampled; slot k of anchor a learns the target's choice for
position a+k with weight exp(-(k-1)/gamma). With the confidence head on, it learns whether the
drafter's greedy chain is still right at slot k (binary cross-entropy).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hyflash.models.drafter import Drafter, DrafterConfig
from hyflash.models.loading import save_drafter, target_info
from hyflash.models.target import Target
from hyflash.train.data import sample_windows, token_stream
from hyflash.train.loop import TrainConfig, train, write_folder


class Distill(nn.Module):
    """drafter + frozen target; forward(tokens (B, T)) -> (loss, metrics). DDP wraps this."""

    def __init__(self, drafter: Drafter, target: Target, anchors: int, gamma: float = 4.0):
        super().__init__()
        self.drafter = drafter
        self.target = [target.eval().requires_grad_(False)]  # a list: not a submodule, never trained
        self.anchors = anchors
        k = torch.arange(drafter.cfg.block, dtype=torch.float32)
        self.register_buffer("slot_weight", torch.exp(-k / gamma) / torch.exp(-k / gamma).sum(), persistent=False)

    def forward(self, tokens: torch.Tensor):
        target, block = self.target[0], self.drafter.cfg.block
        with torch.no_grad():
            logits, features = target(tokens)
        choice = logits.argmax(-1)  # (B, T): the target's token for position t+1
        t = tokens.shape[1]
        weights = torch.arange(1, t + 1)
        anchors = []
        for b in range(tokens.shape[0]):
            # anchors depend on the sequence alone, so any split of a batch over ranks draws the same
            gen = torch.Generator().manual_seed(int((tokens[b] * weights).sum()) % 2**31)
            anchors.append(torch.randperm(t - block - 1, generator=gen)[:self.anchors] + 1)  # in [1, T-block-1]
        memory = self.drafter.memory_inputs(features, torch.stack(anchors)) if self.drafter.cfg.memory != "off" else None
        losses, confs, hits = [], [], []
        for b, a in enumerate(anchors):
            labels = choice[b][a[:, None] + torch.arange(block)]  # (A, 7): slot k <- choice at a+k-1
            prev = torch.cat([tokens[b][a][:, None], labels[:, :-1]], dim=1)
            out, conf = self.drafter.forward_train(features[b], tokens[b], a, prev,
                                                   memory[b] if memory is not None else None)
            ce = F.cross_entropy(out.flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
            losses.append((ce * self.slot_weight).sum(-1).mean())
            correct = (out.argmax(-1) == labels).float().cumprod(-1)  # greedy chain still right at slot k
            hits.append(correct)
            if conf is not None:
                confs.append(F.binary_cross_entropy(conf.clamp(1e-6, 1 - 1e-6), correct))
        loss = torch.stack(losses).mean()
        metrics = {"ce": loss.detach(), "tau": 1 + torch.cat(hits).sum(-1).mean()}
        if confs:
            metrics["conf_bce"] = torch.stack(confs).mean().detach()
            loss = loss + 0.1 * torch.stack(confs).mean()
        return loss, metrics


def train_drafter(target: Target, drafter_cfg: DrafterConfig, corpus: Path, tokenizer: Path, cfg: TrainConfig,
                  seq_len: int = 512, anchors: int = 48) -> Path:
    torch.manual_seed(cfg.seed)  # the same initial weights in every process and every rerun
    drafter = Drafter.for_target(target, drafter_cfg)
    with torch.no_grad():
        drafter.norm.weight.copy_(target.norm.weight)  # start from the target's final norm
    model = Distill(drafter, target, anchors)
    stream = token_stream(corpus, tokenizer, "train")

    train(model, lambda m, batch: m(torch.from_numpy(batch)), lambda rng, n: sample_windows(stream, n, seq_len, rng), cfg, f"drafter-{drafter_cfg.name}")
    dest = cfg.out / "model"
    write_folder(dest, lambda tmp: save_drafter(drafter.eval(), tmp, target_info(target)))
    return dest
