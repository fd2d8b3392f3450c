"""`python -m hyflash.runtime_py.genai_build ARGS`: onnxruntime-genai's model builder (ARGS as its own),
under the transformers this project pins (`hyflash.runtime_py.peers` says why this is needed).

Two things the builder expects from transformers 5 are given to it here: the class names it imports
for models this project does not build (placeholders: only their own families would use them), and a
config whose RoPE settings sit in `rope_parameters`, filled from the model's own config (theta
included; read otherwise it would take the default 10,000).
"""

import runpy
import sys

import transformers
from transformers import AutoConfig

FUTURE_NAMES = {"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"}
_lazy_getattr = type(transformers).__getattr__
_from_pretrained = AutoConfig.from_pretrained


def _getattr(module, name):
    if module.__name__ == "transformers" and name in FUTURE_NAMES:
        return type(name, (), {})
    return _lazy_getattr(module, name)


def _config(*args, **kwargs):
    result = _from_pretrained(*args, **kwargs)
    config = result[0] if isinstance(result, tuple) else result
    if getattr(config, "rope_scaling", {}) is None:
        config.rope_scaling = {"rope_type": "default"}
    if not hasattr(config, "rope_parameters") and hasattr(config, "rope_theta"):
        config.rope_parameters = {**config.rope_scaling, "rope_theta": config.rope_theta}
    return result


if __name__ == "__main__":
    type(transformers).__getattr__ = _getattr
    AutoConfig.from_pretrained = _config
    sys.argv = ["builder", *sys.argv[1:]]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
