"""The target decoder against transformers itself, on tiny random checkpoints of each family."""


import pytest
import torch
from hf_models import VARIANTS, save_hf_model

from hyflash.models.loading import load_target
from hyflash.models.target import greedy, write_cache

torch.manual_seed(0)


def assert_close(actual, expected, atol, what):
    diff = (actual - expected).abs()
    assert diff.max().item() <= atol, f"{what}: max diff {diff.max().item():.3g}, mean {diff.mean().item():.3g}"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_and_taps_match_transformers(variant, hf_checkpoint):
    folder, hf = hf_checkpoint(variant)
    model = load_target(folder)
    tokens = torch.randint(3, 96, (1, 50))
    with torch.no_grad():
        ref = hf(tokens, output_hidden_states=True)
        k, v = model.empty_cache(64)
        logits, feats, _, _ = model.step(tokens[0], torch.arange(50), torch.tensor([50]), k, v)
        full_logits, full_feats = model(tokens)
    assert_close(logits, ref.logits[0], 1e-4, "step logits")
    assert_close(full_logits[0], ref.logits[0], 1e-4, "forward logits")
    h = model.cfg.hidden_size
    for i, layer in enumerate(model.taps):
        assert_close(feats[:, i * h:(i + 1) * h], ref.hidden_states[layer + 1][0], 1e-5, f"tap {layer}")
    assert_close(full_feats[0], feats, 1e-5, "forward features")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_continuation_matches_transformers(variant, hf_checkpoint):
    folder, hf = hf_checkpoint(variant)
    model = load_target(folder)
    prompt = torch.randint(3, 96, (1, 21))
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0,
                          min_new_tokens=32)
    ours = greedy(model, prompt[0].tolist(), 32, max_context=128, chunk=8)
    assert ours == ref[0, 21:].tolist()


def test_chunked_prefill_then_decode_equals_one_forward(hf_checkpoint):
    folder, _ = hf_checkpoint("qwen3")
    model = load_target(folder)
    tokens = torch.randint(3, 96, (37,))
    t_max = 48
    with torch.no_grad():
        full, full_feats = model(tokens[None])
        k, v = model.empty_cache(t_max)
        # stale rows: garbage (huge, NaN-free values) everywhere past what has been written
        k.normal_(0, 1e3)
        v.normal_(0, 1e3)
        rows, feats, pos = [], [], 0
        for n in (8, 8, 5, 1, 1, 8, 6):
            chunk = 8 if n > 1 else 1
            ids = torch.cat([tokens[pos:pos + n], torch.randint(3, 96, (chunk - n,))])
            logits, f, k_new, v_new = model.step(ids, torch.arange(pos, pos + chunk), torch.tensor([n]), k, v)
            write_cache(k, k_new, pos, n)
            write_cache(v, v_new, pos, n)
            rows.append(logits[:n])
            feats.append(f[:n])
            pos += n
    assert pos == 37
    assert_close(torch.cat(rows), full[0], 1e-4, "chunked logits")
    assert_close(torch.cat(feats), full_feats[0], 1e-4, "chunked features")


def test_stale_rows_change_nothing(hf_checkpoint):
    """Rows at or past positions[0] are masked: other (finite) values give bit-identical rows.

    Stale rows always hold finite values (zeros, or K/V of rejected drafts); NaN/inf there
    would need a select over the whole cache per layer, which the hot path does not pay for.
    """
    folder, _ = hf_checkpoint("llama")
    model = load_target(folder)
    tokens = torch.randint(3, 96, (8,))
    k, v = model.empty_cache(32)
    k[:, :, :10].normal_()
    v[:, :, :10].normal_()
    args = (tokens, torch.arange(10, 18), torch.tensor([5]))
    with torch.no_grad():
        a = model.step(*args, k, v)
        k2, v2 = k.clone(), v.clone()
        k2[:, :, 10:] = 3e4 * torch.randn_like(k2[:, :, 10:])
        v2[:, :, 10:] = -7e4
        b = model.step(*args, k2, v2)
    for x, y in zip(a, b):
        assert torch.equal(x[..., :5, :] if x.dim() == 4 else x[:5], y[..., :5, :] if y.dim() == 4 else y[:5])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_and_sharded_checkpoints_load(dtype, tmp_path):
    from transformers import AutoModelForCausalLM

    hf = save_hf_model("qwen2", tmp_path / "one", dtype=dtype)
    hf.to(dtype).save_pretrained(tmp_path / "sharded", max_shard_size="50KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ref = AutoModelForCausalLM.from_pretrained(tmp_path / "one", dtype=torch.float32)
    tokens = torch.randint(3, 96, (1, 16))
    with torch.no_grad():
        expected = ref(tokens).logits[0]
        for sub in ("one", "sharded"):
            logits, _ = load_target(tmp_path / sub)(tokens)
            assert_close(logits[0], expected, 1e-4, sub)
