"""`hyflash train-drafter`: distil a drafter from a frozen target (docs/design.md).

For each training sequence the target runs once (no grad) and gives the features and its own
next-token choices; anchors are sampled where a row allows them (the response part of regenerated
text, assistant turns of chat; `train/batches.py`); slot k of anchor a learns the target's choice for
position a+k with weight exp(-(k-1)/gamma) (`SLOT_GAMMA` unless told). With the confidence head on, it
learns whether the drafter's greedy chain is still right at slot k (binary cross-entropy). With soft labels
(`soft` > 0, from a feature cache) a slot's loss mixes in the cross-entropy against the target's whole
distribution over the draft vocabulary at that position, the target's layers after its last tap run on the
cached features (`Target.after_taps`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hyflash.models.drafter import Drafter, DrafterConfig
from hyflash.models.loading import load_drafter, save_drafter, target_info
from hyflash.models.lookup import lookup_many
from hyflash.models.target import LOGIT_BUDGET, Target, chunked_argmax
from hyflash.train.batches import Rows
from hyflash.train.loop import TrainConfig, pick_device, train, write_folder

SLOT_GAMMA = 4.0  # slot k's loss weighs exp(-(k-1)/SLOT_GAMMA)


def chunked_head_loss(drafter: Drafter, states: torch.Tensor, prev: torch.Tensor, labels: torch.Tensor,
                      copy: tuple[torch.Tensor, torch.Tensor] | None = None, teacher: torch.Tensor | None = None):
    """Cross-entropy and argmax (as target ids) of `drafter.head(states, prev, copy)` for (N, d) states and
    target-id labels (copy: (N,) lookup tokens and their copy logits, `lookup_input`): at a large vocabulary
    a chunk of rows at a time, each chunk's logits recomputed in backward instead of kept. teacher: (N, N_head)
    the target's distribution over the head's tokens at the labels' positions (`teacher_probs`); with it a
    third result, the cross-entropy against it (soft labels)."""
    rows = max(1, LOGIT_BUDGET // drafter.cfg.vocab_size)
    if len(states) <= rows:
        return _head_loss(drafter, states, prev, labels, copy, teacher)
    parts = [checkpoint(_head_loss, drafter, states[i:i + rows], prev[i:i + rows], labels[i:i + rows],
                        copy and (copy[0][i:i + rows], copy[1][i:i + rows]),
                        None if teacher is None else teacher[i:i + rows], use_reentrant=False)
             for i in range(0, len(states), rows)]
    return tuple(torch.cat([p[j] for p in parts]) for j in range(len(parts[0])))


def _head_loss(drafter: Drafter, states, prev, labels, copy=None, teacher=None):
    """labels: target ids; with a draft vocabulary a label outside it has no hard loss (it cannot be drafted)."""
    logits = drafter.head(states, prev, copy).float()
    if drafter.cfg.draft_vocab:
        index = torch.full((drafter.cfg.vocab_size,), -100, dtype=torch.long, device=labels.device)
        index[drafter.d2t] = torch.arange(drafter.cfg.draft_vocab, device=labels.device)
        labels = index[labels]
    ce = F.cross_entropy(logits, labels, reduction="none", ignore_index=-100)
    guess = drafter.target_ids(logits.argmax(-1))
    if teacher is None:
        return ce, guess
    return ce, guess, -(teacher * torch.log_softmax(logits, dim=-1)).sum(-1)


@torch.no_grad()
def teacher_probs(drafter: Drafter, final: torch.Tensor) -> torch.Tensor:
    """(N, d) the target's final normalised hidden states -> (N, N_head) its distribution renormalised over the
    tokens the drafter's head can draft (all of them without a draft vocabulary), in float32."""
    return torch.softmax(F.linear(final, drafter.head_weight).float(), dim=-1)


def draw_anchors(tokens: torch.Tensor, anchorable: torch.Tensor, block: int, anchors: int) -> torch.Tensor:
    """(B, A) anchor positions, A = min(anchors, the fewest any row allows): row b's from the positions
    a in [1, T - block - 1] with anchorable[b, a], distinct, drawn from a generator seeded by the row's
    tokens (so any split of a batch over ranks draws the same)."""
    t = tokens.shape[1]
    allowed = [torch.nonzero(row[1:t - block]).flatten() + 1 for row in anchorable]
    count = min(anchors, min(len(a) for a in allowed))
    if count == 0:
        raise ValueError(f"a row of {t} tokens allows no anchor (none of its positions 1..{t - block - 1} is trainable)")
    weights = torch.arange(1, t + 1, device=tokens.device)
    out = []
    for row, pos in zip(tokens, allowed):
        gen = torch.Generator().manual_seed(int((row * weights).sum()) % 2**31)
        out.append(pos[torch.randperm(len(pos), generator=gen).to(pos.device)[:count]])
    return torch.stack(out)


class Distill(nn.Module):
    """drafter + frozen target; forward(tokens (B, T), anchorable (B, T)) -> (loss, metrics). DDP wraps this."""

    def __init__(self, drafter: Drafter, target: Target, anchors: int, gamma: float = SLOT_GAMMA, soft: float = 0.0):
        super().__init__()
        if not 0 <= soft <= 1:
            raise ValueError(f"soft labels' share must be in [0, 1], got {soft}")
        self.drafter = drafter
        self.target = [target.eval().requires_grad_(False)]  # a list: not a submodule, never trained
        self.anchors = anchors
        self.soft = soft
        k = torch.arange(drafter.cfg.block, dtype=torch.float32)
        self.register_buffer("slot_weight", torch.exp(-k / gamma) / torch.exp(-k / gamma).sum(), persistent=False)

    def predict(self, tokens: torch.Tensor, anchorable: torch.Tensor, features: torch.Tensor | None = None,
                labels: torch.Tensor | None = None):
        """tokens (B, T); anchorable (B, T) bool: the positions an anchor may take (`draw_anchors`).
        Yields per row: anchors (A,), labels (A, 7) (the target's choices for positions a+1..a+7),
        the drafter's normalised slot states (A, 7, d) (its logits: `Drafter.head(states, prev, copy)`),
        prev (A, 7), confidence (A, 7) or None, and copy: with `lookup_input`, prompt-lookup's blocks at
        the anchors (A, 7) and their copy logits (A, 7), else None; slots are fed the labels before them
        (while its chain is right, exactly what the runtime's draft sees). Logits exist only where labels are.
        features (B, T, K*H) and labels (B, T), from a feature cache: used instead of running the target."""
        target, block = self.target[0], self.drafter.cfg.block
        tokens, anchorable = tokens.to(self.slot_weight.device), anchorable.to(self.slot_weight.device)
        anchors = draw_anchors(tokens, anchorable, block, self.anchors)  # (B, A)
        label_pos = (anchors[:, :, None] + torch.arange(block, device=tokens.device)).flatten(1)  # (B, A*7)
        if features is None:
            with torch.no_grad():
                hidden, features = target.trunk(tokens)
                choice = chunked_argmax(torch.gather(hidden, 1, label_pos[..., None].expand(-1, -1, hidden.shape[-1])),
                                        target.lm_head.weight)  # (B, A*7): the target's token after a+k-1
        else:
            features = features.to(self.slot_weight.device)
            choice = torch.gather(labels.to(tokens.device), 1, label_pos)
            if (choice < 0).any():
                raise ValueError("the feature cache has no label at an anchor's position (a damaged cache?)")
        memory = self.drafter.memory_inputs(features, anchors) if self.drafter.cfg.memory != "off" else None
        for b, a in enumerate(anchors):  # a: (A,)
            labels = choice[b].view(-1, block)  # (A, 7): slot k <- choice at a+k-1
            prev = torch.cat([tokens[b][a][:, None], labels[:, :-1]], dim=1)
            lookup = None
            if self.drafter.cfg.lookup_input:  # what the loop's lookup finds at each anchor, history up to it
                lookup = tuple(torch.from_numpy(x).to(tokens.device)
                               for x in lookup_many(tokens[b].cpu().numpy(), a.cpu().numpy(), block))
            states, conf = self.drafter.forward_train(features[b], tokens[b], a, prev,
                                                      memory[b] if memory is not None else None, states_only=True,
                                                      lookup=lookup)
            copy = (lookup[0], self.drafter.copy_logits(states, lookup[1])) if lookup is not None else None
            yield a, labels, states, prev, conf, copy

    def forward(self, tokens: torch.Tensor, anchorable: torch.Tensor, features: torch.Tensor | None = None,
                labels: torch.Tensor | None = None):
        final = None
        if self.soft > 0:
            if features is None:
                raise ValueError("soft labels read the target's distribution from a feature cache; train on "
                                 "conversations with their feature cache")
            with torch.no_grad():
                final = self.target[0].after_taps(features.to(self.slot_weight.device))  # (B, T, d)
        hard, softs, confs, hits = [], [], [], []
        for b, (a, labels, states, prev, conf, copy) in enumerate(self.predict(tokens, anchorable, features, labels)):
            teacher = None
            if final is not None:  # slot k's label is the target's choice after position a+k-1
                teacher = teacher_probs(self.drafter, final[b][(a[:, None] + torch.arange(labels.shape[1],
                                                                                          device=a.device)).flatten()])
            ce, guess, *soft_ce = chunked_head_loss(
                self.drafter, states.flatten(0, 1), prev.flatten(), labels.flatten(),
                tuple(x.flatten() for x in copy) if copy is not None else None, teacher)
            ce, guess = ce.view_as(labels), guess.view_as(labels)  # guess: target ids
            hard.append((ce * self.slot_weight).sum(-1).mean())
            if soft_ce:
                softs.append((soft_ce[0].view_as(labels) * self.slot_weight).sum(-1).mean())
            correct = (guess == labels).float().cumprod(-1)  # greedy chain still right at slot k
            hits.append(correct)
            if conf is not None:
                with torch.autocast(conf.device.type, enabled=False):  # BCE is unsafe under autocast
                    confs.append(F.binary_cross_entropy(conf.float().clamp(1e-6, 1 - 1e-6), correct))
        loss = torch.stack(hard).mean()
        metrics = {"ce": loss.detach(), "tau": 1 + torch.cat(hits).sum(-1).mean()}
        if softs:
            soft_ce = torch.stack(softs).mean()
            metrics["soft_ce"] = soft_ce.detach()
            loss = (1 - self.soft) * loss + self.soft * soft_ce
        if confs:
            metrics["conf_bce"] = torch.stack(confs).mean().detach()
            loss = loss + 0.1 * torch.stack(confs).mean()
        return loss, metrics


def train_drafter(target: Target, drafter_cfg: DrafterConfig | None, data, cfg: TrainConfig, anchors: int = 48,
                  eval_every: int | None = None, eval_rows: int = 16, run_config: dict | None = None,
                  init_from: Path | None = None, add_lookup_input: bool = False, gamma: float | None = None,
                  soft: float = 0.0) -> Path:
    """`data`: rows to train on (`hyflash.train.batches.open_rows`); every `eval_every` steps the log
    gets the held-out tau, cross-entropy and walked tau on `eval_rows` fixed held-out rows (`heldout_tau`,
    `heldout_walked_tau`: `walked_tau`).
    `init_from`: continue from that drafter folder's weights and config (`drafter_cfg` None); the run's
    own schedule (warm-up, cosine decay) starts afresh; `add_lookup_input` gives it prompt-lookup's block as an
    input (new weights at zero: it starts drafting exactly as the folder's). `gamma`: the slots' loss weights
    (`Distill`; None: `SLOT_GAMMA`); a run given them records them in its run config, as one given `soft` (the
    soft labels' share of the loss, `Distill`) does."""
    torch.manual_seed(cfg.seed)  # the same initial weights in every process and every rerun
    device = pick_device(cfg.device)  # the target first: the drafter uses its tables in place
    target.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    if init_from is not None:
        drafter = load_drafter(init_from, target, add_lookup_input=add_lookup_input).train()
        drafter_cfg = drafter.cfg
        run_config = {**(run_config or {}), "init_from": str(init_from),
                      **({"added": "lookup_input"} if add_lookup_input else {})}
    else:
        drafter = _fresh_drafter(target, drafter_cfg, data)
    model = Distill(drafter, target, anchors, gamma or SLOT_GAMMA, soft)
    if gamma is not None:  # runs with the default weights keep the run config they were started with
        run_config = {**(run_config or {}), "slot_gamma": gamma}
    if soft:
        run_config = {**(run_config or {}), "soft_labels": soft}

    held = data.heldout(eval_rows) if eval_every else None

    def evaluate(m) -> dict:
        _, metrics = _on_rows(m, held)
        walked = walked_tau(m, held, getattr(data, "horizon", None))["walked_tau"]
        return {"tau": metrics["tau"], "ce": metrics["ce"], **({"walked_tau": walked} if walked is not None else {})}

    train(model, _on_rows, data.sample, cfg, f"drafter-{drafter_cfg.name}", evaluate if held is not None else None,
          eval_every, {"drafter": drafter_cfg.to_dict(), "anchors": anchors, **(run_config or {}),
                       "data": data.describe})
    dest = cfg.out / "model"
    write_folder(dest, lambda tmp: save_drafter(drafter.eval(), tmp, target_info(target)))
    return dest


def _on_rows(model: Distill, rows: Rows):
    """`model` (a Distill, or DDP around one) on a batch of rows: (loss, metrics)."""
    cached = getattr(rows, "features", None) is not None  # rows from a feature cache carry the target's side
    return model(torch.from_numpy(rows.tokens), torch.from_numpy(rows.anchorable),
                 torch.from_numpy(rows.features) if cached else None, torch.from_numpy(rows.labels) if cached else None)


ANCHORS_AT_ONCE = 256  # acceptance_lengths' anchors per call: the eager forms' masks grow with anchors x length


@torch.no_grad()
def acceptance_lengths(model: Distill, rows) -> list[np.ndarray]:
    """Per row, (T,) int: at each position an anchor may take, 1 + the drafts the drafter's greedy chain gets
    right there before its first miss (teacher-forced: the tokens it is fed are the target's); 0 elsewhere.
    A row's anchors go `ANCHORS_AT_ONCE` at a time; without a feature cache the target runs once a row."""
    target = model.target[0]
    every = Distill(model.drafter, target, anchors=ANCHORS_AT_ONCE).to(model.slot_weight.device)
    cached = getattr(rows, "features", None) is not None
    block = model.drafter.cfg.block
    out = []
    for r in range(len(rows)):
        one = rows[r:r + 1]
        t = one.tokens.shape[1]
        tokens = torch.from_numpy(one.tokens)
        if cached:
            features, choice = torch.from_numpy(one.features), torch.from_numpy(one.labels)
        else:  # the target's side of the row, as the cache holds it: features and its argmax after each position
            hidden, features = target.trunk(tokens.to(every.slot_weight.device))
            choice = chunked_argmax(hidden, target.lm_head.weight)
        length = np.zeros(t, np.int64)
        allowed = np.flatnonzero(one.anchorable[0, 1:t - block]) + 1  # as `draw_anchors` allows them
        for start in range(0, len(allowed), ANCHORS_AT_ONCE):
            mask = np.zeros_like(one.anchorable)
            mask[0, allowed[start:start + ANCHORS_AT_ONCE]] = True
            for a, labels, states, prev, _, copy in every.predict(tokens, torch.from_numpy(mask), features, choice):
                _, guess = chunked_head_loss(every.drafter, states.flatten(0, 1), prev.flatten(), labels.flatten(),
                                             tuple(x.flatten() for x in copy) if copy is not None else None)
                right = (guess.view_as(labels) == labels).long().cumprod(-1).sum(-1)
                length[a.cpu().numpy()] = 1 + right.cpu().numpy()
        out.append(length)
    return out


def walk(length: np.ndarray, first: int | None = None) -> list[int]:
    """The tokens each round of the loop commits over one row, on teacher-forced acceptance lengths (`length` > 0
    where an anchor may take; a run of such positions is one answer, its first the last prompt token). Prefill
    gives an answer's first token, so its first round is anchored one after the run's start; a round commits
    `length` tokens and the next is anchored where they end. With `first` N, as a loop that stops after N new
    tokens: each answer's rounds end at its N-th token, the last one cut there."""
    rounds, p, t = [], 0, len(length)
    while p < t:
        if length[p] == 0:
            p += 1
            continue
        p += 1  # prefill's token
        stop = p + first - 1 if first else t  # the answer's N-th token
        while p < min(stop, t) and length[p] > 0:
            rounds.append(min(int(length[p]), stop - p))
            p += rounds[-1]
        while p < t and length[p] > 0:  # the rest of this answer is past the loop's end
            p += 1
    return rounds


@torch.no_grad()
def walked_tau(model: Distill, rows, first: int | None = None) -> dict:
    """Held-out tau as the loop counts it (tokens per round): each answer walked round by round on the
    teacher-forced acceptance lengths (`acceptance_lengths`, `walk`). Where the rows say which conversations
    were answered greedily (chat data), only those are walked: on them the walk makes the greedy loop's rounds
    (a sampled answer's later tokens are not the ones a greedy loop commits). The mean over drawn anchors
    (`tau`) is usually higher: a long accepted run is one round in the loop but as many anchors as it has
    tokens in the mean. `first` N walks each answer's first N tokens alone (`walk`). walked_tau is None when no
    row has a round."""
    greedy = getattr(rows, "greedy", None)
    if greedy is not None:
        rows = rows[np.flatnonzero(greedy)]
    was = model.training
    model.eval()
    try:
        rounds = [n for length in acceptance_lengths(model, rows) for n in walk(length, first)] if len(rows) else []
    finally:
        model.train(was)
    return {"walked_tau": sum(rounds) / len(rounds) if rounds else None, "walked_tokens": sum(rounds),
            "walked_rounds": len(rounds), "walked_rows": len(rows)}


@torch.no_grad()
def evaluate_drafter(target: Target, drafter: Drafter, data, rows: int = 16, anchors: int = 48) -> dict:
    """A drafter's held-out figures as its weights are, no step taken: teacher-forced tau (1 + the drafts its
    greedy chain gets right before the first miss, the bonus included), cross-entropy and the walked tau
    (`walked_tau`) on the first `rows` held-out rows of `data` (`open_rows`), the rows and anchors training's
    log measures on."""
    held = data.heldout(rows)
    if held is None:
        raise ValueError("the data has no held-out rows to measure on")
    device = next(drafter.parameters()).device
    target.to(device)
    model = Distill(drafter.eval(), target, anchors).to(device)
    _, metrics = _on_rows(model, held)
    return {"tau": float(metrics["tau"]), "ce": float(metrics["ce"]), **walked_tau(model, held, getattr(data, "horizon", None)),
            "rows": len(held.tokens), "anchors": anchors}


def _fresh_drafter(target: Target, drafter_cfg: DrafterConfig, data) -> Drafter:
    drafter = Drafter.for_target(target, drafter_cfg)
    with torch.no_grad():
        drafter.norm.weight.copy_(target.norm.weight)  # start from the target's final norm
        if drafter_cfg.draft_vocab:  # the N tokens most frequent in the training data
            counts = data.token_counts(drafter_cfg.vocab_size)
            drafter.d2t.copy_(torch.from_numpy(np.argsort(-counts, kind="stable")[:drafter_cfg.draft_vocab].copy()))
    return drafter
