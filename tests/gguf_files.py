"""Tiny GGUF files written the way llama.cpp's converter writes a Llama checkpoint: its tensor names, its
Q/K row permutation, its metadata keys and a byte-level BPE tokenizer table with a ChatML template."""

from __future__ import annotations

import json

import numpy as np
from hf_models import make_hf_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TEXT = ["the quick brown fox jumps over the lazy dog", "hello world, this is a tiny tokenizer",
        "def add(a, b):\n    return a + b\n", "user assistant system message content", "1234567890 () [] {}"]


def bpe_tokenizer(vocab: int = 320) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXT * 20, trainer)
    return tok


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary layout: each head's rows reordered from halves to interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(path, quant: str = "F32", arch: str = "llama", seed: int = 0):
    """A random transformers Llama (vocabulary: `bpe_tokenizer`) written as GGUF; returns (model, tokenizer).
    quant: F32, or Q8_0 for the weight matrices (norms stay F32, as llama.cpp keeps them)."""
    import gguf

    tok = bpe_tokenizer()
    n_vocab = tok.get_vocab_size()
    model = make_hf_model("llama", seed, vocab_size=n_vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if quant == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template(CHATML)

    def add(name: str, t, matrix: bool = True):
        a = t.detach().float().numpy()
        if quant == "Q8_0" and matrix:
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)

    sd = model.state_dict()
    add("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"], False)
        q = _permute(sd[p + "self_attn.q_proj.weight"].numpy(), cfg.num_attention_heads)
        k = _permute(sd[p + "self_attn.k_proj.weight"].numpy(), cfg.num_key_value_heads)
        import torch
        add(f"blk.{i}.attn_q.weight", torch.from_numpy(q))
        add(f"blk.{i}.attn_k.weight", torch.from_numpy(k))
        add(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        add(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        add(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], False)
        add(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        add(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        add(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    add("output_norm.weight", sd["model.norm.weight"], False)
    add("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model, tok
