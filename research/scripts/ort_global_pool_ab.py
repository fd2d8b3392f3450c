"""One onnxruntime thread pool shared by the six sessions (onnxruntime's global thread pools,
`use_per_session_threads` off; it keeps spinning between calls, which only a session's own pool can be told
not to) against the runtime's per-session pools (spinning within a call only). A process can hold only one of the
two (once global pools exist, every session must use them), so each run is one policy in its own process:
call it alternately, e.g. `for r in 1 2 3; do for p in runtime global-pool; do python
research/scripts/ort_global_pool_ab.py $p EXPORT; done; done >> research/results/x.jsonl`. Per context, 6 held-out
prompts (as research/scripts/ort_threading_ab.py cuts them), 64 tokens, greedy: the median tokens/s of HyFlash,
prompt-lookup and target-only, whose outputs must be equal. Measure on an idle machine.
Usage: python research/scripts/ort_global_pool_ab.py runtime|global-pool EXPORT [--threads 2]  -> one JSON line"""

import argparse
import json

import numpy as np
import onnxruntime.capi.onnxruntime_pybind11_state as ort_state
from tokenizers import Tokenizer

import hyflash.runtime_py.backends as backends
from hyflash.runtime_py.bench import source_texts
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats

ap = argparse.ArgumentParser()
ap.add_argument("policy", choices=("runtime", "global-pool"))
ap.add_argument("export")
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()

if args.policy == "global-pool":
    ort_state.set_global_thread_pool_sizes(args.threads, 1)

    def global_pool(ort, threads):
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.use_per_session_threads = False
        # onnxruntime honours force_spinning_stop only for a session's own pool: the shared pool keeps
        # spinning between calls (onnxruntime/core/session/inference_session.cc, control_spinning)
        opts.add_session_config_entry("session.force_spinning_stop", "1")
        return opts
    backends.ort_session_options = global_pool  # read when the Runtime opens its sessions
rt = Runtime(args.export, threads=args.threads)
ids = Tokenizer.from_file(f"{args.export}/tokenizer.json").encode("\n".join(source_texts(None))).ids
out = {"policy": args.policy, "threads": args.threads, "export": args.export}
for c in (256, 1024, 2048):
    tps = {d: [] for d in ("model", "prompt-lookup", "none")}
    for i in range(6):
        tokens = {}
        for draft in tps:
            stats = Stats()
            cfg = GenerationConfig(max_new_tokens=64, draft=draft, ignore_eos=True)
            tokens[draft] = [t for chunk in rt.generate(ids[i * 5000:i * 5000 + c], cfg, stats) for t in chunk]
            tps[draft].append(stats.tokens_per_s)
        assert tokens["model"] == tokens["prompt-lookup"] == tokens["none"], f"outputs differ at context {c}"
    out[str(c)] = {d: round(float(np.median(v)), 1) for d, v in tps.items()}
print(json.dumps(out))
