"""The project's custom ops as ONNX nodes: `hyflash::cache_attention` -> `com.microsoft.GroupQueryAttention`.

onnxscript only resolves contrib ops whose schema `onnx.defs` knows; GroupQueryAttention's is
registered here first (without it the lookup fails with "Attribute GroupQueryAttention not found").
Only the inputs the CPU kernel needs are declared; rotary is done by the graph itself (the
target's own RoPE, after Qwen3's q/k norms), so `do_rotary` stays 0.
"""

from __future__ import annotations

import onnx
import onnxscript
from onnx.defs import OpSchema

from hyflash.models.kv_attention import cache_attention

DOMAIN = "com.microsoft"


def _register_schema() -> None:
    if onnx.defs.has("GroupQueryAttention", DOMAIN):
        return
    f = OpSchema.FormalParameter
    schema = OpSchema(
        "GroupQueryAttention", DOMAIN, 1,
        inputs=[f("query", "T"), f("key", "T"), f("value", "T"), f("past_key", "T"), f("past_value", "T"),
                f("seqlens_k", "M"), f("total_sequence_length", "M")],
        outputs=[f("output", "T"), f("present_key", "T"), f("present_value", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], ""),
                          ("M", ["tensor(int32)"], "")],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT),
                    OpSchema.Attribute("kv_num_heads", OpSchema.AttrType.INT)],
    )
    onnx.defs.register_schema(schema)


_register_schema()
_msft = onnxscript.values.Opset(DOMAIN, 1)


def _gqa(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, num_heads: int,
         kv_num_heads: int):
    return _msft.GroupQueryAttention(query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
                                     num_heads=num_heads, kv_num_heads=kv_num_heads, _num_outputs=3)


TRANSLATIONS = {cache_attention._opoverload: _gqa}
