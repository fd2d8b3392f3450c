"""`hyflash train-drafter`: distil a drafter from a frozen target (DESIGN §2, Training).

For each training sequence the target runs once (no grad) and gives the features and its own
next-token choices; anchors are sampled; slot k of anchor a learns the target's choice for
position a+k with weight exp(-(k-1)/gamma). With the confidence head on, it learns whether the
drafter's greedy chain is still right at slot k (binary cross-entropy).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from ..models.config import read_json_object
from ..models.drafter import Drafter, DrafterConfig
from ..models.target import Target
from .data import sample_windows, token_stream
from .loop import TrainConfig, train


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


def save_drafter(drafter: Drafter, folder: Path, target_info: dict, dtype=torch.bfloat16) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().contiguous().to(dtype) for k, v in drafter.state_dict().items()}
    save_file(weights, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"hyflash_drafter": drafter.cfg.to_dict(),
                                                    "target": target_info}, indent=1) + "\n")


def target_info(target: Target) -> dict:
    c = target.cfg
    return {"architecture": c.architecture, "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
            "num_layers": c.num_layers, "taps": list(target.taps)}


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
    save_drafter(drafter.eval(), dest, target_info(target))
    return dest


def drafter_config_dict(folder: Path) -> dict:
    """The drafter's config.json: {"hyflash_drafter": {...}, "target": {...}} (one-line errors)."""
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: not a drafter folder (no config.json); pass a drafter folder, 'random', "
                                "or an embedded one: reference, reference-swa, reference-full, reference-gdn")
    raw = read_json_object(path)
    if not isinstance(raw.get("hyflash_drafter"), dict):
        raise ValueError(f"{path}: not a hyflash drafter config (no 'hyflash_drafter' object)")
    return raw


def load_drafter(folder: str | Path, target: Target, overrides: dict | None = None) -> Drafter:
    """A drafter folder (config.json + model.safetensors) for this target; mismatches refused.
    `overrides` changes run-time settings that leave the weights as they are (the window)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    raw = drafter_config_dict(folder)
    made_for = raw.get("target")
    if isinstance(made_for, dict):
        mine = target_info(target)
        for key in ("architecture", "num_layers", "hidden_size", "vocab_size"):
            if key in made_for and made_for[key] != mine[key]:
                raise ValueError(f"{folder}: the drafter was trained for a target with {key} {made_for[key]!r}; "
                                 f"this target has {mine[key]!r}; pass the drafter's own target")
    try:
        cfg = DrafterConfig(**{**raw["hyflash_drafter"], **(overrides or {})})
    except TypeError as e:
        raise ValueError(f"{folder / 'config.json'}: not a drafter config this hyflash understands ({e})") from None
    drafter = Drafter.for_target(target, cfg)
    weights = {k: v.float() for k, v in load_file(folder / "model.safetensors").items()}
    missing, unexpected = drafter.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"{folder}: drafter weights do not match its config "
                         f"(missing {missing[:2]}, unexpected {unexpected[:2]})")
    return drafter.eval()
