"""Many sequences at once through `Target`'s own layers: one prefill, then one row per step, with a
KV cache allocated once per batch (the copy-rate probe and `hyflash regenerate`).

Prompts of different lengths are left-padded: each sequence has its own positions (its first
real token at 0) and never attends to its padding. Each row decodes greedily or samples at its
own temperature. `answer_batch` also stops a row at its end-of-turn id (finished rows leave the
batch, so the step shrinks with it) and can return the tap features and the target's own argmax
at every position, the drafter's training data, from the same pass. Tests check the rows against
`hyflash.models.target.greedy` / `generate` and the features against `Target.forward`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from hyflash.models.target import Target


class _Batch:
    """The rows being decoded: their caches, padding and temperatures; `keep` drops finished rows."""

    def __init__(self, model: Target, b: int, total: int, pad: torch.Tensor, temperature: torch.Tensor,
                 taps: tuple[int, ...] = ()):
        cfg = model.cfg
        self.model, self.taps = model, taps
        shape = (cfg.num_layers, b, cfg.num_kv_heads, total, cfg.head_dim)
        self.device = model.embed.weight.device
        self.k = torch.empty(shape, dtype=model.embed.weight.dtype, device=self.device)
        self.v = torch.empty_like(self.k)
        self.pad, self.temperature = pad.long().to(self.device), temperature.double()  # temperature stays on the CPU
        self.padded = bool(self.pad.any())

    def keep(self, rows: torch.Tensor) -> None:
        """Only `rows` (indices into the current batch) go on."""
        on = rows.to(self.device)
        self.k, self.v = self.k[:, on].contiguous(), self.v[:, on].contiguous()
        self.pad, self.temperature = self.pad[on], self.temperature[rows.cpu()]

    def pick(self, logits: torch.Tensor, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, V) -> (chosen (B,), argmax (B,)) on the CPU: greedy rows take the argmax, sampled rows draw
        (on the CPU, with `generator`, whatever the model's device)."""
        best = logits.argmax(-1).cpu()
        token = best.clone()
        sampled = self.temperature > 0
        if sampled.any():
            probs = torch.softmax(logits[sampled.to(logits.device)].double().cpu() / self.temperature[sampled, None], -1)
            token[sampled] = torch.multinomial(probs, 1, generator=generator)[:, 0]
        return token, best

    def run(self, x: torch.Tensor, start: int, last_only: bool = True):
        """x (B, n) tokens at rows start.. -> logits (B, V) of the last row (or (B, n, V)), taps' features
        (B, n, K*H) or None."""
        model = self.model
        x = x.to(self.device)
        b, n = x.shape
        rows = torch.arange(start, start + n, device=self.device)
        if self.padded:  # each sequence's own positions; a query sees its row's real tokens up to itself
            pos = (rows[None, :] - self.pad[:, None]).clamp(min=0)  # (B, n)
            rope = model.rotary(pos.flatten()).map(lambda t: t.view(b, n, -1))
            keys = torch.arange(start + n, device=self.device)
            mask = (keys[None, None, :] <= rows[None, :, None]) & (keys[None, None, :] >= self.pad[:, None, None])
            mask = (mask | (keys[None, None, :] == rows[None, :, None]))[:, None]  # (B, 1, n, start + n); a pad
            # row sees itself only, so no row is all masked (its output is never read)
        else:
            rope = model.rotary(rows)
            mask = None
        h = model.embed(x)
        feats = []
        for i, layer in enumerate(model.layers):
            q, k, v = layer.project(h, rope)  # q (B, heads, n, hd); k, v (B, kvh, n, hd)
            self.k[i, :, :, start:start + n] = k
            self.v[i, :, :, start:start + n] = v
            ks, vs = self.k[i, :, :, :start + n], self.v[i, :, :, :start + n]
            attn = F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask, is_causal=start == 0 and mask is None,
                                                  enable_gqa=True)
            h = layer.finish(h, attn)
            if i in self.taps:
                feats.append(h)
        logits = model.lm_head(model.norm(h[:, -1] if last_only else h))
        return logits, torch.cat(feats, dim=-1) if feats else None


@torch.no_grad()
def decode_batch(model: Target, prompts: torch.Tensor, max_new: int, temperature: torch.Tensor | None = None,
                 generator: torch.Generator | None = None, pad: torch.Tensor | None = None) -> torch.Tensor:
    """prompts (B, P) int64 -> (B, max_new) new tokens.

    temperature: (B,) float, 0 = greedy for that row (default: every row greedy); sampled rows draw
    from softmax(logits / T) with `generator`. pad: (B,) int64, the left padding of each row (its
    first pad[b] tokens are not part of the prompt; default none).
    """
    b, p = prompts.shape
    pad = torch.zeros(b, dtype=torch.long) if pad is None else pad
    batch = _Batch(model, b, p + max_new - 1, pad, torch.zeros(b) if temperature is None else temperature)
    out = [batch.pick(batch.run(prompts, 0)[0], generator)[0]]
    for i in range(max_new - 1):  # the last new token is never fed back
        out.append(batch.pick(batch.run(out[-1][:, None], p + i)[0], generator)[0])
    return torch.stack(out, dim=1)


@dataclasses.dataclass
class Answer:
    """One row of `answer_batch`: the answer's tokens (up to and including its first stop id, or
    max_new of them), and with taps, for the prompt + answer (n = len(prompt) + len(tokens)):
    features (n, K*H) fp16 (the last token's row is zero: it is never fed back) and labels (n,) int32,
    the target's argmax after each position (-1 where not computed: before the prompt's last token,
    and after the answer's last token)."""
    tokens: list[int]
    features: np.ndarray | None = None
    labels: np.ndarray | None = None


@torch.no_grad()
def answer_batch(model: Target, prompts: list[list[int]], max_new: int, temperature: torch.Tensor | None = None,
                 generator: torch.Generator | None = None, stop: tuple[int, ...] = (),
                 taps: tuple[int, ...] = ()) -> list[Answer]:
    """Each prompt answered until one of `stop` (kept) or `max_new` tokens. A finished row leaves the
    batch once a quarter of the rows still decoding are done (its cache rows are dropped), so the
    step shrinks as answers end. `taps`: also return each row's features at those layers' outputs and
    the target's argmax at each position (`Answer`)."""
    b = len(prompts)
    lens = torch.tensor([len(r) for r in prompts])
    p = int(lens.max())
    pad = p - lens
    filler = stop[0] if stop else 0
    x = torch.tensor([[filler] * (p - len(r)) + list(r) for r in prompts])
    batch = _Batch(model, b, p + max_new - 1, pad, torch.zeros(b) if temperature is None else temperature, taps)
    tokens = [[] for _ in range(b)]
    feats = [[] for _ in range(b)] if taps else None
    labels = [[] for _ in range(b)]
    active = torch.arange(b)  # original row of each batch row
    done = torch.zeros(b, dtype=torch.bool)  # per batch row: its answer has ended
    stops = torch.tensor(list(stop) or [-1])
    logits, f = batch.run(x, 0)
    for i in range(max_new):
        token, best = batch.pick(logits, generator)
        for j, row in enumerate(active.tolist()):
            if done[j]:
                continue
            tokens[row].append(int(token[j]))
            labels[row].append(int(best[j]))
            if f is not None:
                feats[row].append(f[j, -1:] if i else f[j, int(pad[row]):])  # (1 or P, K*H)
        done |= torch.isin(token, stops)
        if i == max_new - 1 or done.all():
            break
        if done.sum() >= max(1, (len(active) - int(done.sum())) // 4) and not done.all():
            live = torch.nonzero(~done).flatten()
            batch.keep(live)
            active, done, token = active[live], done[live], token[live]
        logits, f = batch.run(token[:, None], p + i)
    out = []
    for row in range(b):
        answer = Answer(tokens[row])
        if taps:
            n = int(lens[row]) + len(tokens[row])
            fe = torch.cat(feats[row]).to(torch.float16).cpu().numpy()  # (n - 1, K*H)
            answer.features = np.concatenate([fe, np.zeros((n - len(fe), fe.shape[1]), np.float16)])
            answer.labels = np.full(n, -1, np.int32)
            answer.labels[int(lens[row]) - 1:int(lens[row]) - 1 + len(labels[row])] = labels[row]
        out.append(answer)
    return out
