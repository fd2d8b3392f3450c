"""Hugging Face checkpoint folders <-> `Target`: config.json + safetensors (single or sharded).

Weights are read with safetensors only (no pickle, nothing executes). On-disk names are the
`transformers` names; the module stores q/k/v and gate/up fused, so loading concatenates them
(Phi-3 already stores them fused) and saving splits them again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from importlib.resources import files
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from hyflash.models.config import TargetConfig, read_json_object, rope_inv_freq
from hyflash.models.drafter import LOOKUP_WEIGHTS, Drafter, DrafterConfig
from hyflash.models.files import sha256
from hyflash.models.pull import resolve_pullable
from hyflash.models.target import Rotary, Target

# The embedded reference models: package data of `hyflash` (folder hyflash/reference/), by name.
REFERENCE = files("hyflash") / "reference"
REFERENCE_NAMES = {
    "target": {"reference": "target"},
    "drafter": {"reference": "drafter-hyflash", "reference-swa": "drafter-swa",
                "reference-full": "drafter-full", "reference-gdn": "drafter-gdn",
                "smollm2-135m-instruct": "drafter-smollm2"},  # SmolLM2-135M-Instruct's HyFlash drafter
}
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file holding it."""
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: not a valid safetensors index ({e})") from None
        files = {name: folder / f for name, f in weight_map.items()}
        for path in set(files.values()):
            if not path.resolve().is_relative_to(folder.resolve()):
                raise ValueError(f"{index}: shard {path.name} lies outside the folder")
            if not path.is_file():
                raise FileNotFoundError(f"{path}: shard named in the index is missing")
        return files
    if single.is_file():
        return {name: single for name in _keys(single)}
    raise FileNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def weights_sha256(folder: Path) -> str:
    """One sha256 for a checkpoint's weights: over its weight files' own sha256s, in name order."""
    listing = "".join(f"{f.name}:{sha256(f)}\n"
                      for f in sorted(set(weight_files(Path(folder)).values())))
    return hashlib.sha256(listing.encode()).hexdigest()


def _keys(path: Path) -> list[str]:
    try:
        with safe_open(path, framework="pt") as f:
            return list(f.keys())
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    files = weight_files(folder)
    by_file: dict[Path, list[str]] = {}
    for name, path in files.items():
        by_file.setdefault(path, []).append(name)
    out = {}
    for path, names in by_file.items():
        try:
            with safe_open(path, framework="pt") as f:
                for name in names:
                    out[name] = f.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    return out


def hf_to_module(cfg: TargetConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map transformers tensor names onto `Target`'s (fusing q/k/v and gate/up)."""

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"weights: tensor {name!r} is missing")
        return hf.pop(name).float()

    sd = {"embed.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    if cfg.tie_word_embeddings:
        hf.pop("lm_head.weight", None)
    else:
        sd["lm_head.weight"] = take("lm_head.weight")
    for i in range(cfg.num_layers):
        p, m = f"model.layers.{i}.", f"layers.{i}."
        sd[m + "attn_norm.weight"] = take(p + "input_layernorm.weight")
        sd[m + "mlp_norm.weight"] = take(p + "post_attention_layernorm.weight")
        a = p + "self_attn."
        if cfg.fused_on_disk:
            sd[m + "qkv.weight"] = take(a + "qkv_proj.weight")
            sd[m + "gate_up.weight"] = take(p + "mlp.gate_up_proj.weight")
        else:
            sd[m + "qkv.weight"] = torch.cat([take(a + f"{x}_proj.weight") for x in "qkv"])
            sd[m + "gate_up.weight"] = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
            if cfg.mlp_bias:
                sd[m + "gate_up.bias"] = torch.cat([take(p + "mlp.gate_proj.bias"), take(p + "mlp.up_proj.bias")])
        if cfg.qkv_bias:
            sd[m + "qkv.bias"] = (take(a + "qkv_proj.bias") if cfg.fused_on_disk
                                  else torch.cat([take(a + f"{x}_proj.bias") for x in "qkv"]))
        sd[m + "o.weight"] = take(a + "o_proj.weight")
        if cfg.o_bias:
            sd[m + "o.bias"] = take(a + "o_proj.bias")
        if cfg.qk_norm:
            sd[m + "q_norm.weight"] = take(a + "q_norm.weight")
            sd[m + "k_norm.weight"] = take(a + "k_norm.weight")
        sd[m + "down.weight"] = take(p + "mlp.down_proj.weight")
        if cfg.mlp_bias:
            sd[m + "down.bias"] = take(p + "mlp.down_proj.bias")
    extra = [k for k in hf if "rotary_emb" not in k]
    if extra:
        raise ValueError(f"weights: unexpected tensor {extra[0]!r} ({len(extra)} unexpected in all); "
                         "the checkpoint does not match its config.json")
    return sd


def module_to_hf(model: Target) -> dict[str, torch.Tensor]:
    """The inverse of `hf_to_module` (unfused transformers names, as Llama/Qwen3 store them)."""
    cfg = model.cfg
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    hf = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"]}
    if not cfg.tie_word_embeddings:
        hf["lm_head.weight"] = sd["lm_head.weight"]
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    for i in range(cfg.num_layers):
        p, m = f"model.layers.{i}.", f"layers.{i}."
        hf[p + "input_layernorm.weight"] = sd[m + "attn_norm.weight"]
        hf[p + "post_attention_layernorm.weight"] = sd[m + "mlp_norm.weight"]
        for name, t in zip("qkv", sd[m + "qkv.weight"].split([q, kv, kv])):
            hf[p + f"self_attn.{name}_proj.weight"] = t
        if cfg.qkv_bias:
            for name, t in zip("qkv", sd[m + "qkv.bias"].split([q, kv, kv])):
                hf[p + f"self_attn.{name}_proj.bias"] = t
        hf[p + "self_attn.o_proj.weight"] = sd[m + "o.weight"]
        if cfg.qk_norm:
            hf[p + "self_attn.q_norm.weight"] = sd[m + "q_norm.weight"]
            hf[p + "self_attn.k_norm.weight"] = sd[m + "k_norm.weight"]
        gate, up = sd[m + "gate_up.weight"].chunk(2)
        hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"] = gate, up
        hf[p + "mlp.down_proj.weight"] = sd[m + "down.weight"]
    return hf


def load_target(folder: str | Path, taps: tuple[int, ...] | None = None) -> Target:
    """Load a checkpoint folder as an fp32 `Target`; one-line errors for every bad input. The weights are
    allocated once, as the checkpoint's tensors are converted (the model is built on the meta device and
    takes them over): a 1.7 B checkpoint peaks at its fp32 size plus what is not yet converted, not twice."""
    folder = Path(folder)
    cfg = TargetConfig.from_folder(folder)
    with torch.device("meta"):
        model = Target(cfg, taps)
    sd = hf_to_module(cfg, read_tensors(folder))
    expected = model.state_dict()
    for name, tensor in expected.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name not in sd:
            raise ValueError(f"weights: tensor for {name!r} is missing")
        if sd[name].shape != tensor.shape:
            raise ValueError(f"weights: {name} has shape {tuple(sd[name].shape)}, config.json implies "
                             f"{tuple(tensor.shape)}")
    model.load_state_dict(sd, strict=not cfg.tie_word_embeddings, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.rotary = Rotary(*rope_inv_freq(cfg))  # its buffers are not in the checkpoint: built here, not on meta
    return model.eval()


def save_target(model: Target, folder: str | Path, raw_config: dict, dtype=torch.float32) -> None:
    """Write a Hugging Face folder (config.json + model.safetensors) for `model`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf = {k: v.to(dtype).contiguous().clone() for k, v in module_to_hf(model).items()}
    save_file(hf, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(raw_config, indent=2) + "\n")


def embedded(name: str, kind: str) -> bool:
    """Whether this installation carries the embedded model `name`."""
    return name in REFERENCE_NAMES[kind] and (Path(str(REFERENCE / REFERENCE_NAMES[kind][name])) /
                                               "config.json").is_file()


def resolve(path_or_name: str | Path, kind: str) -> Path:
    """A folder path, the embedded model of that name (`kind` is "target" or "drafter"), or for a target the
    name of a pullable model (`hyflash.models.pull`)."""
    name = str(path_or_name)
    if kind == "target" and not Path(name).exists():
        pulled = resolve_pullable(name)  # a pullable model's name: its converted folder (pulled on first use)
        if pulled is not None:
            return pulled
    if name in REFERENCE_NAMES[kind]:
        folder = Path(str(REFERENCE / REFERENCE_NAMES[kind][name]))
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"the embedded model {name!r} is not in this installation ({folder})")
        return folder
    return Path(path_or_name)


# ---------------------------------------------------------------- drafters: config.json + model.safetensors

def save_drafter(drafter: Drafter, folder: Path, target_info: dict, dtype=torch.bfloat16) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().contiguous().to(dtype) if v.is_floating_point() else v.detach().contiguous()
               for k, v in drafter.state_dict().items()}  # the draft vocabulary's ids stay integers
    save_file(weights, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"hyflash_drafter": drafter.cfg.to_dict(),
                                                    "target": target_info}, indent=1) + "\n")


def target_info(target: Target) -> dict:
    c = target.cfg
    return {"architecture": c.architecture, "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
            "num_layers": c.num_layers, "taps": list(target.taps)}


def drafter_config_dict(folder: Path) -> dict:
    """The drafter's config.json: {"hyflash_drafter": {...}, "target": {...}} (one-line errors)."""
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: not a drafter folder (no config.json); pass a drafter folder, 'random', "
                                f"or an embedded one: {', '.join(REFERENCE_NAMES['drafter'])}")
    raw = read_json_object(path)
    if not isinstance(raw.get("hyflash_drafter"), dict):
        raise ValueError(f"{path}: not a hyflash drafter config (no 'hyflash_drafter' object)")
    return raw


def load_drafter(folder: str | Path, target: Target, overrides: dict | None = None,
                 add_lookup_input: bool = False) -> Drafter:
    """A drafter folder (config.json + model.safetensors) for this target; mismatches refused.
    `overrides` changes run-time settings that leave the weights as they are (the window).
    `add_lookup_input`: the drafter gains prompt-lookup's block as an input, its new weights at zero, so that
    it drafts exactly as the folder's until trained (`train-drafter --init-from ... --lookup-input`)."""
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
    if add_lookup_input:
        if cfg.lookup_input:
            raise ValueError(f"{folder}: this drafter already reads prompt-lookup's block; leave out --lookup-input")
        cfg = dataclasses.replace(cfg, lookup_input=True)
    drafter = Drafter.for_target(target, cfg)
    weights = {k: v.float() if v.is_floating_point() else v for k, v in load_file(folder / "model.safetensors").items()}
    missing, unexpected = drafter.load_state_dict(weights, strict=False)
    if add_lookup_input:  # the new weights, zero as Drafter makes them
        missing = [k for k in missing if k not in LOOKUP_WEIGHTS]
    if missing or unexpected:
        raise ValueError(f"{folder}: drafter weights do not match its config "
                         f"(missing {missing[:2]}, unexpected {unexpected[:2]})")
    return drafter.eval()
