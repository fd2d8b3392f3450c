"""The drafter's recurrent memory: Mamba-2 (default) and Gated DeltaNet, one contract.

Per layer the state is `S: (heads, P, N)` (Mamba-2: head dim x d_state; DeltaNet: value dim x
key dim) plus a short causal conv's last `kernel-1` inputs, `conv: (kernel-1, C)`.

- `commit(c, valid, S, conv)`: fold up to 8 committed features in (run time, `state_commit`).
  Rows that are not valid never reach anything: their inputs are *selected* to zero (not
  multiplied: 0*NaN = NaN), their step sizes are zeroed after the softplus, and the conv state
  advances by an index selection built from the valid count. With no valid row the state comes
  back bit-exactly.
- `read(S, x)`: the slots' read-out, `y = S @ q` then gated RMSNorm and out_proj. Never writes.
- `states_at(c, anchors, history)` (training): the state every anchor sees, i.e. after the
  features 0..a-1, for a whole sequence at once; `read_many` reads them. Mamba-2 does it in the
  quadratic (attention-like) form without materialising states; DeltaNet runs the same
  `step` the run-time form uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def softplus(x: torch.Tensor) -> torch.Tensor:
    # relu(x) + log1p(exp(-|x|)): stable, and built from ops every backend lowers
    return torch.relu(x) + torch.log1p(torch.exp(-x.abs()))


def causal_conv(seq, n: int, w, b):
    """Depthwise causal conv + SiLU: seq (..., k-1+n, C), weights w (..., k, C), bias b broadcasting to
    (..., n, C) -> (..., n, C). Leading dims: one layer, or all layers stacked."""
    out = b
    for j in range(w.shape[-2]):
        out = out + seq[..., j:j + n, :] * w[..., j:j + 1, :]
    return F.silu(out)


def mamba2_update(S, x, B, dt, A_log, valid):
    """S <- exp(sum dt*A) S + sum_i decay_after_i dt_i x_i (x) B_i over the n new rows, padding rows
    (valid False) with dt = 0 after the softplus (they decay by exp(0) = 1 and add nothing).
    S (..., h, P, N), x (..., n, h, P), B (..., n, N), dt (..., n, h), A_log broadcasting to dt."""
    dt = torch.where(valid[:, None], dt, 0.0)
    dA = dt * -torch.exp(A_log)  # (..., n, h)
    n = dA.shape[-2]
    later = torch.triu(torch.ones(n, n, dtype=dA.dtype, device=dA.device), diagonal=1)  # later[i, j] = j > i
    decay_after = torch.exp(later @ dA)  # (..., n, h): decay applied to row i by rows i+1..n-1
    total = torch.exp(dA.sum(-2))  # (..., h)
    xw = ((decay_after * dt)[..., None] * x).movedim(-3, -1)  # (..., h, P, n): each row's x, weighted
    add = xw @ B[..., None, :, :]  # (..., h, P, n) @ (..., 1, n, N): one MatMul (an Einsum is slow in onnxruntime)
    return total[..., None, None] * S + add


class GatedRMSNorm(nn.Module):
    """RMSNorm(y * silu(z)) * w, per head group as Mamba-2's output norm."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, y, z):
        y = y * F.silu(z)
        return y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight  # fuses (see RMSNorm)


class Memory(nn.Module):
    """What both memories share: in/out projections, the causal conv, the read-out."""

    def __init__(self, d_model: int, heads: int, head_dim: int, d_state: int, kernel: int, conv_channels: int,
                 extra: int, query_dim: int):
        super().__init__()
        self.heads, self.head_dim, self.d_state, self.kernel = heads, head_dim, d_state, kernel
        self.conv_channels = conv_channels
        self.in_proj = nn.Linear(d_model, conv_channels + extra, bias=False)
        self.conv_w = nn.Parameter(torch.randn(kernel, conv_channels) / kernel)  # depthwise, (k, C)
        self.conv_b = nn.Parameter(torch.zeros(conv_channels))
        self.q_proj = nn.Linear(d_model, query_dim, bias=False)  # read queries from the slots
        self.z_proj = nn.Linear(d_model, heads * head_dim, bias=False)
        self.norm = GatedRMSNorm(heads * head_dim)
        self.out_proj = nn.Linear(heads * head_dim, d_model, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, heads)))
        self.dt_bias = nn.Parameter(torch.log(torch.expm1(torch.linspace(1e-3, 1e-1, heads))))

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (self.heads, self.head_dim, self.d_state), (self.kernel - 1, self.conv_channels)

    def conv(self, seq: torch.Tensor, n: int) -> torch.Tensor:
        """Causal depthwise conv + SiLU. seq: (..., k-1+n, C) with k-1 rows of history -> (..., n, C)."""
        return causal_conv(seq, n, self.conv_w, self.conv_b)

    def commit(self, c, valid, S, conv_state, n_valid):
        """c: (8, d) already zero where not valid; valid: (8,) bool; S: (h, P, N); conv: (k-1, C)."""
        n = c.shape[0]
        proj = self.in_proj(c[None])[0]  # (n, C + extra)
        u, rest = proj[:, :self.conv_channels], proj[:, self.conv_channels:]
        seq = torch.cat([conv_state, u], dim=0)  # (k-1+n, C)
        keep = torch.arange(self.kernel - 1, device=c.device) + n_valid  # the last k-1 valid rows
        new_conv = torch.index_select(seq, 0, keep)
        return self.update(S, self.conv(seq, n), rest, valid), new_conv

    def read(self, S, x):
        """S: (..., h, P, N); x: (..., n, d) normed slot states -> (..., n, d)."""
        q = self.query(x)  # (..., n, h|1, N)
        y = torch.einsum("...hpn,...shn->...shp", S, q.expand(*q.shape[:-2], self.heads, q.shape[-1]))
        y = y.flatten(-2)  # (..., n, h*P)
        return self.out_proj(self.norm(y, self.z_proj(x)))

    def train_inputs(self, c):
        """c: ([B,] T, d) -> conv outputs ([B,] T, C) and the other projections ([B,] T, extra), zero history."""
        proj = self.in_proj(c)
        u = proj[..., :self.conv_channels]
        pad = torch.zeros(*u.shape[:-2], self.kernel - 1, self.conv_channels, dtype=c.dtype, device=c.device)
        return self.conv(torch.cat([pad, u], dim=-2), c.shape[-2]), proj[..., self.conv_channels:]

    def states_batch(self, c, anchors, history=None):
        """c: (B, T, d), anchors: (B, A) -> one `states_at` result per sequence."""
        return [self.states_at(c[b], anchors[b], history) for b in range(c.shape[0])]


class Mamba2(Memory):
    """S <- exp(dt*A) S + dt x (x) B; read y = S C_q. x: (h, P), B and C_q: (N,), one group."""

    def __init__(self, d_model, heads, head_dim, d_state, kernel=4):
        super().__init__(d_model, heads, head_dim, d_state, kernel,
                         conv_channels=heads * head_dim + d_state, extra=heads, query_dim=d_state)

    def query(self, x):
        return self.q_proj(x)[..., None, :]  # (..., n, 1, N): C_q, shared by all heads

    def read(self, S, x):
        """S: (..., h, P, N); x: (..., n, d) -> (..., n, d). With one C_q for all heads the read
        y[s, (h, p)] = sum_n S[h, p, n] C_q[s, n] is a single MatMul."""
        y = self.q_proj(x) @ S.flatten(-3, -2).transpose(-1, -2)  # (..., n, N) @ (..., N, h*P) -> (..., n, h*P)
        return self.out_proj(self.norm(y, self.z_proj(x)))

    def split(self, conv_out, rest):
        xs = conv_out[..., :self.heads * self.head_dim].unflatten(-1, (self.heads, self.head_dim))
        B = conv_out[..., self.heads * self.head_dim:]
        return xs, B, softplus(rest + self.dt_bias)  # x (.., h, P), B (.., N), dt (.., h)

    def update(self, S, conv_out, rest, valid):
        x, B, dt = self.split(conv_out, rest)
        return mamba2_update(S, x, B, dt, self.A_log, valid)

    @staticmethod
    def commit_layers(mems: list["Mamba2"], c, valid, S, conv_state, n_valid):
        """`commit` of every layer at once, one op for all layers where `commit` has one per layer (the
        layers fold the same features): c (8, d), valid (8,), S (L, h, P, N), conv_state (L, k-1, C)
        -> (S, conv_state) of all layers. The same functions as `commit`, on the layers' stacked parameters."""
        n, m0 = c.shape[0], mems[0]
        proj = torch.stack([m.in_proj(c[None])[0] for m in mems])  # (L, n, C + h)
        u, rest = proj[..., :m0.conv_channels], proj[..., m0.conv_channels:]
        seq = torch.cat([conv_state, u], dim=1)  # (L, k-1+n, C)
        keep = torch.arange(m0.kernel - 1, device=c.device) + n_valid
        new_conv = torch.index_select(seq, 1, keep)
        stack = lambda name: torch.stack([getattr(m, name) for m in mems])  # noqa: E731  (L, ...)
        conv_out = causal_conv(seq, n, stack("conv_w"), stack("conv_b")[:, None])  # (L, n, C)
        x, B = conv_out[..., :m0.heads * m0.head_dim].unflatten(-1, (m0.heads, m0.head_dim)), \
            conv_out[..., m0.heads * m0.head_dim:]
        dt = softplus(rest + stack("dt_bias")[:, None])  # (L, n, h)
        return mamba2_update(S, x, B, dt, stack("A_log")[:, None], valid), new_conv

    def states_at(self, c, anchors, history=None):
        """Inputs of the quadratic read for anchors (A,): contributions of every t < a (and t >= a-history)."""
        c = c[:max(1, int(anchors.max()))]  # none past the last anchor's (the convolution is causal)
        conv_out, rest = self.train_inputs(c)
        x, B, dt = self.split(conv_out, rest)  # (T, h, P), (T, N), (T, h)
        cum = torch.cumsum((dt * -torch.exp(self.A_log)).double(), 0)  # (T, h) inclusive, fp64
        t = torch.arange(c.shape[0], device=c.device)
        seen = t[None, :] < anchors[:, None]  # (A, T)
        if history is not None:
            seen = seen & (t[None, :] >= anchors[:, None] - history)
        last = cum[(anchors - 1).clamp(min=0)]  # (A, h): cum at a-1
        expo = torch.where(seen[:, :, None], last[:, None, :] - cum[None], float("-inf"))  # (A, T, h)
        weight = (torch.exp(expo).to(c.dtype) * dt[None])  # (A, T, h)
        return weight, x, B

    def read_many(self, inputs, xs):
        """xs: (A, S, d) slots of each anchor -> (A, S, d), reading the states `states_at` gave."""
        weight, x, B = inputs
        cq = self.q_proj(xs)  # (A, S, N)
        g = torch.einsum("asn,tn->ast", cq, B)  # C_q . B_t
        y = torch.einsum("ast,ath,thp->ashp", g, weight, x).flatten(-2)  # (A, S, h*P)
        return self.out_proj(self.norm(y, self.z_proj(xs)))


class GatedDeltaNet(Memory):
    """S <- a (S - b (S k) k^T) + b v k^T with L2-normed k; read y = S q. S: (h, dv, dk)."""

    def __init__(self, d_model, heads, head_dim, d_state, kernel=4):
        super().__init__(d_model, heads, head_dim, d_state, kernel,
                         conv_channels=heads * (head_dim + d_state), extra=2 * heads, query_dim=heads * d_state)

    def query(self, x):
        return F.normalize(self.q_proj(x).unflatten(-1, (self.heads, self.d_state)), dim=-1)  # (..., n, h, dk)

    def split(self, conv_out, rest):
        h, dv, dk = self.heads, self.head_dim, self.d_state
        k = F.normalize(conv_out[..., :h * dk].unflatten(-1, (h, dk)), dim=-1)
        v = conv_out[..., h * dk:].unflatten(-1, (h, dv))
        g = -torch.exp(self.A_log) * softplus(rest[..., :h] + self.dt_bias)  # log decay, <= 0
        beta = torch.sigmoid(rest[..., h:])
        return k, v, g, beta

    @staticmethod
    def step(S, k, v, g, beta):
        """One delta-rule step for every head (and any leading batch dims):
        S' = a S - (b (a S k - v)) k^T, i.e. a (S - b (S k) k^T) + b v k^T with a = exp(g).
        S: (..., h, dv, dk); k: (..., h, dk); v: (..., h, dv); g, beta: (..., h)."""
        a = torch.exp(g)[..., None]
        u = beta[..., None] * (a * (S @ k[..., None])[..., 0] - v)  # (..., h, dv)
        return a[..., None] * S - u[..., :, None] * k[..., None, :]

    def update(self, S, conv_out, rest, valid):
        k, v, g, beta = self.split(conv_out, rest)
        g = torch.where(valid[:, None], g, 0.0)  # padding: decay exp(0) = 1 ...
        beta = torch.where(valid[:, None], beta, 0.0)  # ... and no write
        for i in range(k.shape[0]):
            S = self.step(S, k[i], v[i], g[i], beta[i])
        return S

    def states_at(self, c, anchors, history=None):
        return self.states_batch(c[None], anchors[None], history)[0]

    def states_batch(self, c, anchors, history=None):
        """The scan for a batch of sequences at once, one step per position (not per position and
        sequence), keeping only the states some anchor reads: c (B, T, d), anchors (B, A) ->
        per sequence (A, h, dv, dk), the state after features 0..a-1."""
        if history is not None:
            raise ValueError("memory_history is supported for memory='mamba2' only")
        k, v, g, beta = self.split(*self.train_inputs(c))  # (B, T, h, ...)
        needed = sorted(set(anchors.flatten().tolist()))
        row = {a: i for i, a in enumerate(needed)}
        S = torch.zeros(c.shape[0], self.heads, self.head_dim, self.d_state, dtype=c.dtype, device=c.device)
        kept = [S] if needed[0] == 0 else []
        for t in range(needed[-1]):
            S = self.step(S, k[:, t], v[:, t], g[:, t], beta[:, t])
            if t + 1 in row:
                kept.append(S)
        kept = torch.stack(kept)  # (U, B, h, dv, dk)
        return [kept[[row[a] for a in anchors[b].tolist()], b] for b in range(c.shape[0])]

    def read_many(self, states, xs):
        return self.read(states, xs)
