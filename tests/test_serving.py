"""Runs that last: one Runtime serving many prompts in a row gives exactly what a fresh runtime gives
for each; runtimes in threads of their own are independent; one runtime shared by two threads is
refused clearly rather than mixing two conversations' buffers."""

import threading

import numpy as np
import pytest

from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
from hyflash.runtime_py.sampling import Sampling

EOS = 2  # the tiny checkpoints' eos_token_id


def _requests():
    """Prompts of several lengths, greedy and sampled, with and without stopping at EOS."""
    rng = np.random.default_rng(7)
    out = []
    for i, length in enumerate((5, 40, 17, 61, 3, 29)):
        prompt = rng.integers(3, 96, length).tolist()
        sampling = Sampling() if i % 2 == 0 else Sampling(temperature=0.9, top_p=0.95)
        out.append((prompt, GenerationConfig(max_new_tokens=12 + 5 * i, sampling=sampling, seed=i,
                                             ignore_eos=i % 3 == 0)))
    out.append(([5, 6, 7], GenerationConfig(max_new_tokens=20, draft="none")))
    out.append(([5, 6, 7], GenerationConfig(max_new_tokens=20, draft="prompt-lookup")))
    return out


def _run(runtime, prompt, cfg):
    stats = Stats()
    tokens = [t for new in runtime.generate(prompt, cfg, stats) for t in new]
    return tokens, stats.stop_reason


@pytest.mark.parametrize("backend", ["onnxruntime", "executorch"])
def test_one_runtime_many_prompts_equals_fresh_runtimes(both_formats, backend):
    served = Runtime(both_formats, backend)
    for prompt, cfg in _requests():
        assert _run(served, prompt, cfg) == _run(Runtime(both_formats, backend), prompt, cfg)


def test_stopping_at_eos_leaves_the_runtime_clean(both_formats):
    """A generation that stops early (EOS forced by an eos set to the first token it will emit) is
    followed by one that must not see any of its rows or state."""
    runtime = Runtime(both_formats)
    prompt, cfg = [9, 10, 11, 12], GenerationConfig(max_new_tokens=16, ignore_eos=True)
    expected = _run(Runtime(both_formats), prompt, cfg)
    runtime.eos = {expected[0][3]}
    short, reason = _run(runtime, prompt, GenerationConfig(max_new_tokens=16))
    assert reason == "eos" and short == expected[0][:expected[0].index(expected[0][3]) + 1]
    runtime.eos = set()
    assert _run(runtime, prompt, cfg) == expected


def test_runtimes_in_their_own_threads(both_formats):
    requests = _requests()[:4]
    expected = [_run(Runtime(both_formats), p, c) for p, c in requests]
    results, errors = [None] * 4, []

    def work(i):
        try:
            results[i] = _run(Runtime(both_formats), *requests[i])
        except Exception as e:  # reported below, with the thread's index
            errors.append((i, e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == expected


def test_one_runtime_shared_by_two_threads_is_refused_clearly(both_formats):
    runtime = Runtime(both_formats)
    prompt, cfg = [5, 6, 7, 8], GenerationConfig(max_new_tokens=40, ignore_eos=True)
    expected = _run(Runtime(both_formats), prompt, cfg)
    started, release = threading.Event(), threading.Event()
    outcome = {}

    def first():
        gen = runtime.generate(prompt, cfg)
        tokens = list(next(gen))
        started.set()
        release.wait()
        tokens += [t for new in gen for t in new]
        outcome["first"] = tokens

    def second():
        started.wait()
        try:
            outcome["second"] = _run(runtime, prompt, cfg)
        except RuntimeError as e:
            outcome["second"] = str(e)
        release.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcome["first"] == expected[0]  # the conversation under way is untouched
    assert "already generating" in outcome["second"] and "its own Runtime" in outcome["second"]
    assert _run(runtime, prompt, cfg) == expected  # and the runtime serves again once it is free
