"""The drafter: its training form equals its run-time form; the graphs' masking contract."""

import copy
import itertools

import pytest
import torch

from hyflash.models.config import TargetConfig
from hyflash.models.drafter import Drafter, DrafterConfig
from hyflash.models.lookup import lookup, lookup_many
from hyflash.models.target import Target

H, V = 64, 96


def tiny_target(layers=4, seed=0):
    raw = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": V, "hidden_size": H, "intermediate_size": 128,
           "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "max_position_embeddings": 512, "tie_word_embeddings": True}
    torch.manual_seed(seed)
    target = Target(TargetConfig.from_hf(raw))
    torch.nn.init.normal_(target.embed.weight, std=0.1)  # logits of a few units, as trained models give
    return target


def tiny_drafter(seed=0, **overrides):
    target = tiny_target()
    cfg = DrafterConfig.for_target(target, **{"ssm_heads": 2, "ssm_head_dim": 16, "d_state": 8, "markov_rank": 8,
                                              **overrides})
    torch.manual_seed(seed)
    drafter = Drafter.for_target(target, cfg)
    with torch.no_grad():  # untrained weights are near-trivial; perturb everything so every path matters
        for name, p in drafter.named_parameters():
            p.add_(0.3 * torch.randn_like(p))
        if cfg.draft_vocab:  # a scattered draft vocabulary: some of any block's tokens fall outside it
            drafter.d2t.copy_(torch.randperm(V)[:cfg.draft_vocab])
    return drafter.eval()


def run_time(drafter, features, tokens, sizes, max_context, pad=float("nan")):
    """Commit features in blocks of `sizes` (padding rows NaN); draft after each commit.
    -> anchors (A,), draft tokens (A, 7), draft logits (A, 7, V), confidences (A, 7) or None."""
    ctx = drafter.init_context(max_context, features.dtype, features.dtype)
    anchors, toks, logits, confs, pos = [], [], [], [], 0
    for n in sizes:
        f = torch.full((8, features.shape[1]), pad)
        f[:n] = features[pos:pos + n]
        positions = torch.arange(pos, pos + 8)
        nv = torch.tensor([n])
        if "ssm_state" in ctx:
            ctx["ssm_state"], ctx["conv_state"] = drafter.state_commit(f, nv, ctx["ssm_state"], ctx["conv_state"])
        ctx["win_k"], ctx["win_v"], ctx["win_pos"] = drafter.window_shift(f, positions, nv, ctx["win_k"],
                                                                          ctx["win_v"], ctx["win_pos"])
        pos += n
        found = {}
        if drafter.cfg.lookup_input:  # prompt-lookup's block on the text up to the anchor, as the loop finds it
            block, match = lookup(tokens[:pos + 1].tolist(), drafter.cfg.block)
            found = {"lookup_tokens": torch.from_numpy(block), "lookup_match": torch.tensor([match])}
        t, lg, cf = drafter.draft_read(tokens[pos:pos + 1], torch.tensor([pos]), ctx["win_k"], ctx["win_v"],
                                       ctx["win_pos"], ctx.get("ssm_state"), **found)
        anchors.append(pos)
        toks.append(t)
        logits.append(lg)
        confs.append(cf)
    conf = torch.stack(confs) if confs[0] is not None else None
    return torch.tensor(anchors), torch.stack(toks), torch.stack(logits), conf


CASES = [dict(memory=m, markov_rank=r, window=w)
         for m, r, w in itertools.product(["mamba2", "gated_deltanet", "off"], [8, 0], [6, 64])]
CASES += [dict(memory="off", window="full"), dict(memory="mamba2", slot_attention=False, confidence=False),
          dict(memory="mamba2", lookup_input=True), dict(memory="off", markov_rank=0, lookup_input=True),
          dict(memory="mamba2", lookup_input=True, draft_vocab=V // 2)]  # lookup tokens outside the head too


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("overrides", CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_training_form_equals_run_time_form(overrides, dtype):
    """fp32 within 1e-5 of the logits' scale; in fp64 the two forms agree to rounding (1e-10): the
    math is the same."""
    torch.set_default_dtype(dtype)
    try:
        _check_forms_agree(tiny_drafter(**overrides).to(dtype), 1e-5 if dtype == torch.float32 else 1e-10)
    finally:
        torch.set_default_dtype(torch.float32)


def _check_forms_agree(drafter, atol):
    gen = torch.Generator().manual_seed(1)
    t = 60
    features = torch.randn(t, drafter.cfg.feature_size, generator=gen)
    tokens = torch.randint(0, V, (t,), generator=gen)
    tokens[30:50] = tokens[4:24]  # a repeat: prompt-lookup finds matches of every length
    sizes = torch.randint(1, 9, (12,), generator=gen).tolist()
    sizes = [s for s in itertools.accumulate(sizes) if s < t - 8]
    sizes = [b - a for a, b in zip([0] + sizes, sizes)]
    with torch.no_grad():
        anchors, draft_tokens, rt_logits, rt_conf = run_time(drafter, features, tokens, sizes, max_context=64)
        if drafter.cfg.draft_vocab:  # as exported: the head's rows and the id -> head index map as tables
            exported = copy.deepcopy(drafter)
            exported.materialize_head()
            _, tokens_as_exported, logits_as_exported, _ = run_time(exported, features, tokens, sizes, max_context=64)
            assert torch.equal(logits_as_exported, rt_logits) and torch.equal(tokens_as_exported, draft_tokens)
        prev = torch.cat([tokens[anchors][:, None], draft_tokens[:, :-1]], dim=1)
        scale = max(1.0, float(rt_logits.abs().max()))  # rounding grows with the values rounded
        found = None
        if drafter.cfg.lookup_input:
            found = tuple(torch.from_numpy(x) for x in lookup_many(tokens.numpy(), anchors.numpy(), drafter.cfg.block))
            assert {0, 3} <= set(found[1].tolist())  # no match and the longest: each has its own gates
        tr_logits, tr_conf = drafter.forward_train(features, tokens, anchors, prev, lookup=found)
        if drafter.cfg.memory != "off":  # the trainer's batched memory scan: one sequence of a batch of two
            batch = torch.stack([features, torch.randn(features.shape, generator=gen)])
            memory = drafter.memory_inputs(batch, torch.stack([anchors, anchors.flip(0)]))
            batched, _ = drafter.forward_train(features, tokens, anchors, prev, memory[0], lookup=found)
            assert (batched - rt_logits).abs().max() <= atol * scale
    diff = (tr_logits - rt_logits).abs()
    assert diff.max() <= atol * scale, f"max {diff.max():.3g}, mean {diff.mean():.3g}, logit scale {rt_logits.abs().max():.3g}"
    assert torch.equal(drafter.target_ids(tr_logits.argmax(-1)), draft_tokens)
    if drafter.cfg.lookup_input and drafter.cfg.draft_vocab:  # lookup proposed tokens outside the head, and in it
        inside = torch.isin(found[0], drafter.d2t)
        assert inside.any() and not inside.all()
    if rt_conf is not None:
        assert (tr_conf - rt_conf).abs().max() <= atol
    assert rt_logits.std(0).mean() > 1e-2  # anchors really differ: the test is not comparing constants



def _state_inputs(drafter, n_commits=3, seed=2):
    """A context after a few real commits, so states are not all zeros."""
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(8 * n_commits, drafter.cfg.feature_size, generator=gen)
    ctx = drafter.init_context(64)
    for i in range(n_commits):
        f, nv = feats[8 * i:8 * i + 8], torch.tensor([5 + i])
        if "ssm_state" in ctx:
            ctx["ssm_state"], ctx["conv_state"] = drafter.state_commit(f, nv, ctx["ssm_state"], ctx["conv_state"])
        ctx["win_k"], ctx["win_v"], ctx["win_pos"] = drafter.window_shift(
            f, torch.arange(8 * i, 8 * i + 8), nv, ctx["win_k"], ctx["win_v"], ctx["win_pos"])
    return ctx, torch.randn(8, drafter.cfg.feature_size, generator=gen)


@pytest.mark.parametrize("memory", ["mamba2", "gated_deltanet"])
def test_state_commit_with_nothing_valid_is_bit_exact(memory):
    drafter = tiny_drafter(memory=memory)
    ctx, feats = _state_inputs(drafter)
    feats[3] = float("nan")
    with torch.no_grad():
        ssm, conv = drafter.state_commit(feats, torch.tensor([0]), ctx["ssm_state"], ctx["conv_state"])
    assert torch.equal(ssm, ctx["ssm_state"]) and torch.equal(conv, ctx["conv_state"])
    assert ctx["ssm_state"].abs().sum() > 0


@pytest.mark.parametrize("memory", ["mamba2", "gated_deltanet", "off"])
@pytest.mark.parametrize("n_valid", [0, 1, 5, 8])
def test_rows_past_n_valid_have_no_influence(memory, n_valid):
    drafter = tiny_drafter(memory=memory, window=16)
    ctx, feats = _state_inputs(drafter)
    positions = torch.arange(24, 32)
    outs = []
    for junk in (float("nan"), float("inf"), -float("inf"), 1e30):
        f, p = feats.clone(), positions.clone()
        f[n_valid:] = junk
        p[n_valid:] = 10**12 if junk == 1e30 else -7
        with torch.no_grad():
            out = drafter.window_shift(f, p, torch.tensor([n_valid]), ctx["win_k"], ctx["win_v"], ctx["win_pos"])
            if memory != "off":
                out += drafter.state_commit(f, torch.tensor([n_valid]), ctx["ssm_state"], ctx["conv_state"])
        outs.append(out)
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert torch.equal(a, b)
    assert all(torch.isfinite(t).all() for t in outs[0])
    assert outs[0][2][-n_valid:].tolist() == list(range(24, 24 + n_valid)) if n_valid else True


def test_window_keeps_the_last_w_positions():
    drafter = tiny_drafter(memory="off", window=10)
    ctx = drafter.init_context(64)
    pos = 0
    for n in (3, 8, 1, 6):
        f = torch.randn(8, drafter.cfg.feature_size)
        with torch.no_grad():
            ctx["win_k"], ctx["win_v"], ctx["win_pos"] = drafter.window_shift(
                f, torch.arange(pos, pos + 8), torch.tensor([n]), ctx["win_k"], ctx["win_v"], ctx["win_pos"])
        pos += n
        expected = [-1] * max(0, 10 - pos) + list(range(max(0, pos - 10), pos))
        assert ctx["win_pos"].tolist() == expected


@pytest.mark.parametrize("memory", ["mamba2", "gated_deltanet", "off"])
def test_draft_read_changes_no_input(memory):
    drafter = tiny_drafter(memory=memory)
    ctx, _ = _state_inputs(drafter)
    inputs = [torch.tensor([5]), torch.tensor([24]), ctx["win_k"], ctx["win_v"], ctx["win_pos"], ctx.get("ssm_state")]
    copies = [x.clone() if x is not None else None for x in inputs]
    with torch.no_grad():
        tokens, logits, conf = drafter.draft_read(*inputs)
    assert tokens.shape == (7,) and logits.shape == (7, V) and conf.shape == (7,)
    for a, b in zip(inputs, copies):
        assert (a is None and b is None) or torch.equal(a, b)


def test_memory_history_equals_memory_rebuilt_from_last_m_features():
    """Training form with memory_history=M at anchor a == a run-time memory that holds only the
    features a-M..a-1: commit everything before a-M (this primes the 3-row conv context, which is
    part of each feature's encoding), zero the recurrent state, then commit the last M."""
    m, a = 11, 40
    drafter = tiny_drafter(memory="mamba2", memory_history=m, window=4)
    gen = torch.Generator().manual_seed(3)
    features = torch.randn(a + 8, drafter.cfg.feature_size, generator=gen)
    tokens = torch.randint(0, V, (a + 8,), generator=gen)
    ctx = drafter.init_context(64)

    def commit(lo, hi):
        for s in range(lo, hi, 8):
            n = min(8, hi - s)
            f = torch.zeros(8, features.shape[1])
            f[:n] = features[s:s + n]
            ctx["ssm_state"], ctx["conv_state"] = drafter.state_commit(f, torch.tensor([n]), ctx["ssm_state"],
                                                                       ctx["conv_state"])
            ctx["win_k"], ctx["win_v"], ctx["win_pos"] = drafter.window_shift(
                f, torch.arange(s, s + 8), torch.tensor([n]), ctx["win_k"], ctx["win_v"], ctx["win_pos"])

    with torch.no_grad():
        commit(0, a - m)
        ctx["ssm_state"] = torch.zeros_like(ctx["ssm_state"])
        commit(a - m, a)
        draft, logits, _ = drafter.draft_read(tokens[a:a + 1], torch.tensor([a]), ctx["win_k"], ctx["win_v"],
                                              ctx["win_pos"], ctx["ssm_state"])
        prev = torch.cat([tokens[a:a + 1], draft[:-1]])[None]
        train_logits, _ = drafter.forward_train(features, tokens, torch.tensor([a]), prev)
        unlimited = tiny_drafter(memory="mamba2", window=4)
        unlimited.load_state_dict(drafter.state_dict())
        no_limit_logits, _ = unlimited.forward_train(features, tokens, torch.tensor([a]), prev)
    assert (train_logits[0] - logits).abs().max() <= 1e-5
    assert (no_limit_logits[0] - logits).abs().max() > 1e-3  # the history limit really changes the result


@pytest.mark.parametrize("memory,window", [("mamba2", 16), ("gated_deltanet", 16), ("off", 16), ("off", "full")])
def test_context_bytes_match_allocated_tensors(memory, window):
    drafter = tiny_drafter(memory=memory, window=window)
    ctx = drafter.init_context(64, kv_dtype=torch.float16, state_dtype=torch.float32)
    counted = drafter.cfg.context_bytes(64, kv_bytes=2, state_bytes=4)
    assert counted["allocated"] == sum(t.numel() * t.element_size() for t in ctx.values())
    assert counted["window_allocated"] == ctx["win_k"].nbytes + ctx["win_v"].nbytes
    if memory != "off":
        assert counted["state"] == ctx["ssm_state"].nbytes and counted["conv_state"] == ctx["conv_state"].nbytes
    assert drafter.cfg.context_bytes(64, occupied=3)["window_occupied"] == 3 * ctx["win_k"][:, :, 0].nbytes * 2


def test_config_rejects_bad_values():
    target = tiny_target()
    for bad, message in [(dict(memory="lstm"), "memory"), (dict(window=0), "window"), (dict(layers=0), "layers"),
                         (dict(window="full"), "full"), (dict(memory="off", memory_history=4), "memory_history"),
                         (dict(markov_rank=-1), "markov_rank")]:
        with pytest.raises(ValueError, match=message):
            DrafterConfig.for_target(target, **bad)


def test_chunked_head_loss_equals_the_whole_vocabulary_at_once(monkeypatch):
    """At a large vocabulary the loss runs a few rows at a time (logits recomputed in backward): the same
    losses (hard and soft labels), guesses and gradients as all rows at once; and labels only where they are
    needed."""
    from hyflash.train import drafter as d

    drafter = tiny_drafter()
    g = torch.Generator().manual_seed(0)
    states = torch.randn(50, drafter.cfg.hidden_size, generator=g)
    prev = torch.randint(0, drafter.cfg.vocab_size, (50,), generator=g)
    labels = torch.randint(0, drafter.cfg.vocab_size, (50,), generator=g)

    teacher = torch.softmax(torch.randn(50, drafter.cfg.vocab_size, generator=g), -1)

    def run():
        drafter.zero_grad()
        x = states.clone().requires_grad_(True)
        ce, guess, soft = d.chunked_head_loss(drafter, x, prev, labels, teacher=teacher)
        (ce + soft).sum().backward()
        return ce.detach(), guess, soft.detach(), x.grad, drafter.markov_out.weight.grad.clone()
    whole = run()
    monkeypatch.setattr(d, "LOGIT_BUDGET", 7 * drafter.cfg.vocab_size)  # 7 rows per chunk
    chunked = run()
    for a, b in zip(whole, chunked):
        assert torch.allclose(a.float(), b.float(), atol=1e-6)
    hidden = torch.randn(3, 11, drafter.cfg.hidden_size, generator=g)
    assert torch.equal(d.chunked_argmax(hidden, drafter.lm_head), (hidden @ drafter.lm_head.t()).argmax(-1))


@pytest.mark.parametrize("taps", [None, (0, 1)])
def test_the_layers_after_the_last_tap_give_the_targets_final_states(taps):
    """`Target.after_taps` on the features `trunk` returns gives `trunk`'s final normalised states: what a
    feature cache holds is the target's whole distribution at every position (soft labels read it so)."""
    target = tiny_target()
    if taps is not None:
        target.taps = taps  # two layers after the last tap
    assert max(target.taps) < target.cfg.num_layers - 1
    tokens = torch.randint(0, V, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden, features = target.trunk(tokens)
        tail = target.after_taps(features)
    assert torch.allclose(tail, hidden, atol=1e-5)
    assert torch.equal(target.lm_head(tail).argmax(-1), target.lm_head(hidden).argmax(-1))
