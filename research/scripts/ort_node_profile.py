"""Where a target graph's time goes on onnxruntime: per-op-type kernel milliseconds of target_decode,
target_verify and draft_read at one committed length, from onnxruntime's own profiler, with the calls
made the way `hyflash profile` makes them (hyflash.runtime_py.profile.call_times). Measure on an idle machine.
Usage: python research/scripts/ort_node_profile.py EXPORT_FOLDER COMMITTED [THREADS]  -> JSON on stdout"""

import collections
import json
import sys
import tempfile

import numpy as np
import onnxruntime as ort

from hyflash.runtime_py.loop import Runtime
from hyflash.runtime_py.profile import call_times, prefill_time

folder, committed = sys.argv[1], int(sys.argv[2])
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
prefix = tempfile.mkdtemp() + "/ort"


class ProfiledOptions(ort.SessionOptions):
    def __init__(self):
        super().__init__()
        self.enable_profiling = True
        self.profile_file_prefix = prefix


ort.SessionOptions = ProfiledOptions  # the Runtime's sessions, opened below, profile every node
runtime = Runtime(folder, threads=threads)
prefill_time(runtime, np.random.default_rng(0).integers(3, runtime.vocab, committed).tolist())
call_times(runtime, committed, 60)
report = {"committed": committed, "threads": threads}
for graph in ("target_decode", "target_verify", "draft_read", "state_commit", "window_shift"):
    events = json.load(open(runtime.backend.sessions[graph].end_profiling()))
    runs = sum(e.get("name") == "model_run" for e in events)
    by_op = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
    report[graph] = {"runs": runs, "kernel_ms_per_run": sum(by_op.values()) / runs / 1e3,
                     "by_op_ms_per_run": {op: round(us / runs / 1e3, 4) for op, us in by_op.most_common()}}
print(json.dumps(report, indent=1))
