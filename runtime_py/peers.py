"""What a user would run instead, measured beside hyflash in `bench --chat`: onnxruntime-genai (its own
model builder, fp32 or int4 on the CPU, plain decoding and its n-gram speculation) and optimum-onnx's
`ORTModelForCausalLM` (target-only).

Every peer is fed token ids (onnxruntime-genai's own tokenizer mis-encodes "\\n" on some GGUF-derived
tokenizer.json files) and stops at the export's end-of-text ids or the token budget, as hyflash does.

onnxruntime-genai's builder (0.18) is written against transformers 5: it imports two class names that
transformers 4.5x does not have and reads RoPE settings from `rope_parameters`. `build_genai` runs it in a
subprocess (`python -m hyflash.runtime_py.genai_build`) that gives it both, the second from the model's
own config.json (its RoPE theta), so it reads this model as transformers does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from hyflash.models.loading import weights_sha256
from hyflash.models.pull import cache_root
from hyflash.runtime_py.bench import OptimumBaseline

PEERS = ("onnxruntime-genai", "optimum-ort")
GENAI_PRECISIONS = ("fp32", "int4")


@dataclasses.dataclass
class PeerRun:
    """One answer: its tokens, seconds to the first token, seconds for the rest."""
    tokens: list[int]
    ttft_s: float
    decode_s: float

    @property
    def tokens_per_s(self) -> float:
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s and len(self.tokens) > 1 else 0.0


def peer_cache() -> Path:
    return cache_root() / "peers"


def build_genai(target_dir: Path, precision: str) -> Path:
    """onnxruntime-genai's CPU model of `target_dir` at `precision` (built once, cached by the target's config and
    weights)."""
    import onnxruntime_genai

    if precision not in GENAI_PRECISIONS:
        raise ValueError(f"onnxruntime-genai precision must be one of {', '.join(GENAI_PRECISIONS)}, got {precision!r}")
    key = hashlib.sha256((weights_sha256(target_dir) + (Path(target_dir) / "config.json").read_text()).encode())
    out = peer_cache() / f"onnxruntime-genai-{onnxruntime_genai.__version__}" / f"{key.hexdigest()[:16]}-{precision}"
    if (out / "genai_config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".partial")
    cmd = [sys.executable, "-m", "hyflash.runtime_py.genai_build", "-i", str(target_dir), "-o", str(tmp),
           "-p", precision, "-e", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not (tmp / "genai_config.json").is_file():
        tail = [line for line in done.stderr.splitlines() if line.strip()][-1:] or [f"exit {done.returncode}"]
        raise RuntimeError(f"onnxruntime-genai's builder failed on {target_dir}: {tail[0][:300]}")
    tmp.rename(out)
    return out


class GenaiPeer:
    """onnxruntime-genai on one built model: `answer(prompt, max_new, eos)` plain or with n-gram speculation."""

    def __init__(self, folder: Path, threads: int | None, ngram: bool, label: str):
        import onnxruntime_genai as og

        config = og.Config(str(folder))
        if threads:
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {
                "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
        self.og, self.model, self.ngram, self.label = og, og.Model(config), ngram, label

    def answer(self, prompt: list[int], max_new: int, eos: tuple[int, ...]) -> PeerRun:
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt) + max_new, do_sample=False)
        if self.ngram:  # its own adaptive n-gram drafting (CPU); not exact in int4
            params.set_speculative_options(max_draft_tokens=7, ngram_size=3)
        gen = og.Generator(self.model, params)
        tokens: list[int] = []
        t0 = time.perf_counter()
        gen.append_tokens(prompt)
        first = None
        while not gen.is_done() and len(tokens) < max_new:
            gen.generate_next_token()
            new = [int(t) for t in gen.get_next_tokens()]
            if first is None:
                first = time.perf_counter()
            for t in new:
                if len(tokens) < max_new:
                    tokens.append(t)
            if any(t in eos for t in new):
                break
        end = time.perf_counter()
        cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
        return PeerRun(tokens[:cut], (first or end) - t0, end - (first or end))


class OptimumPeer(OptimumBaseline):
    """bench's optimum-ort baseline answering a chat turn: greedy, target-only, stopping at end of turn."""

    def answer(self, prompt: list[int], max_new: int, eos: tuple[int, ...]) -> PeerRun:
        import torch

        ids = torch.tensor([prompt])
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=eos[0], eos_token_id=list(eos))
        t = time.perf_counter()
        self.model.generate(ids, max_new_tokens=1, **kw)
        first = time.perf_counter() - t
        t = time.perf_counter()
        out = self.model.generate(ids, max_new_tokens=max_new, **kw)[0, len(prompt):].tolist()
        total = time.perf_counter() - t
        return PeerRun(out, first, max(total - first, 1e-9))


def open_peers(names: tuple[str, ...], target_dir: Path, threads: int | None, log=print) -> tuple[list, dict]:
    """The peers' runners (label -> answerer) and each peer's status ("ok" or why it is left out)."""
    runners, status = [], {}
    for name in names:
        if name not in PEERS:
            raise ValueError(f"--peer must name one of {', '.join(PEERS)}, got {name!r}")
        try:
            if name == "onnxruntime-genai":
                for precision in GENAI_PRECISIONS:
                    log(f"bench: building onnxruntime-genai's {precision} model (cached) ...")
                    folder = build_genai(target_dir, precision)
                    runners.append(GenaiPeer(folder, threads, False, f"ort-genai-{precision}"))
                    runners.append(GenaiPeer(folder, threads, True, f"ort-genai-{precision}-ngram"))
            else:
                runners.append(OptimumPeer(target_dir, threads))
            status[name] = "ok"
        except ImportError as e:
            status[name] = f"not installed ({e.name}); pip install 'hyflash[bench]'"
        except Exception as e:  # an independent library on this folder: report, never abort the bench
            status[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return runners, status
