"""The nearby / distant evidence probes: how the prompts are built, and `hyflash probe` end to end
on a real export (every greedy run equal to target-only, a tau per drafter, kind and distance)."""

import json
import shutil

import numpy as np
import pytest
from conftest import word_tokenizer
from tokenizers import Tokenizer

from hyflash.cli import main
from hyflash.models.generation import load_tokenizer
from hyflash.runtime_py.bench import run_once
from hyflash.runtime_py.loop import Runtime
from hyflash.runtime_py.probe import CUE, PASSAGE, chat_probe_prompts, probe_prompts


def test_probe_prompts_put_the_passage_near_or_far_and_pair_them():
    stream = np.arange(20_000)  # every token distinct: positions can be read back from the ids
    near, cont_near = probe_prompts(stream, "nearby", 300, 4, seed=3)
    far, cont_far = probe_prompts(stream, "distant", 300, 4, seed=3)
    far2, cont_far2 = probe_prompts(stream, "distant", 700, 4, seed=3)
    assert (cont_near == cont_far).all() and (cont_far == cont_far2).all()  # the same passages everywhere
    for n, f, f2, c in zip(near, far, far2, cont_far):
        passage = np.arange(c[0] - CUE, c[0] - CUE + PASSAGE)
        assert len(n) == len(f) == PASSAGE + 300 + CUE and len(f2) == PASSAGE + 700 + CUE
        assert n[-CUE:] == f[-CUE:] == passage[:CUE].tolist()  # the cue: the passage's first tokens
        assert n[300:300 + PASSAGE] == passage.tolist()  # nearby: filler, passage, cue
        assert f[:PASSAGE] == passage.tolist()  # distant: passage, filler, cue
        filler = np.array(f[PASSAGE:PASSAGE + 300])
        assert (np.diff(filler) == 1).all() and not np.isin(filler, np.arange(passage[0] - 2048, passage[-1] + 2048)).any()
        assert c.tolist() == passage[CUE:].tolist()


def _find(seq: list[int], part: list[int]) -> int:
    return next(i for i in range(len(seq) - len(part) + 1) if seq[i:i + len(part)] == part)


def test_chat_probes_hand_the_passage_over_in_an_early_turn(tmp_path):
    """A chat probe: the template's turns around the passage and the filler, in the kind's order, the request,
    then the cue; the same passages (and continuations) as the plain probes."""
    word_tokenizer(200).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "w0",
        "chat_template": "{% for m in messages %}w190 {{ m['role'] }} {{ m['content'] }} w191 {% endfor %}"
                         "{% if add_generation_prompt %}w192 {% endif %}"}))
    tok = load_tokenizer(tmp_path)
    stream = np.random.default_rng(0).integers(1, 180, 20_000)  # words the template and its texts never use
    near, cont_near = chat_probe_prompts(tok, stream, "nearby", 300, 3, seed=3)
    far, cont_far = chat_probe_prompts(tok, stream, "distant", 300, 3, seed=3)
    _, plain = probe_prompts(stream, "distant", 300, 3, seed=3)
    assert (cont_near == cont_far).all() and (cont_far == plain).all()
    for n, f, c in zip(near, far, cont_far):
        passage = stream[_find(stream.tolist(), c[:8].tolist()) - CUE:][:PASSAGE].tolist()
        assert n[-CUE:] == f[-CUE:] == passage[:CUE] and f[-CUE - 1] == 192  # the answer opens with the cue
        at_near, at_far = _find(n, passage), _find(f, passage)
        assert len(f) - CUE - (at_far + PASSAGE) > 300 > len(n) - CUE - (at_near + PASSAGE)  # far / near the cue
        assert f[at_far - 1] != 191 and n.count(191) == f.count(191) == 5  # inside a turn; five turns closed


def test_probe_runs_every_drafter_exactly(qwen3_dir, both_formats, tmp_path, capsys):
    target, out = tmp_path / "target", tmp_path / "exp"  # a target with a chat template, for --chat
    shutil.copytree(qwen3_dir, target)
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "w0",
        "chat_template": "{% for m in messages %}w90 {{ m['content'] }} w91 {% endfor %}"
                         "{% if add_generation_prompt %}w92 {% endif %}"}))
    assert main(["export", "--target", str(target), "--drafter", "random", "--out", str(out), "--format", "onnx",
                 "--max-context", "256", "--prefill-chunk", "16", "--window", "24"]) == 0
    text = tmp_path / "text.txt"
    rng = np.random.default_rng(0)
    text.write_text(" ".join(f"w{i}" for i in rng.integers(0, 96, 6_000)))
    report_path, plot_path = tmp_path / "probe.json", tmp_path / "probe.png"
    capsys.readouterr()
    assert main(["probe", str(out), "--distances", "16,64", "--prompts", "2", "--max-new-tokens", "8",
                 "--prompts-from", str(text), "--memory-history", "8", "--out", str(report_path), "--plot",
                 str(plot_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads(report_path.read_text()) and plot_path.stat().st_size > 0
    cells = [(r["kind"], r["distance"]) for r in report["rows"]]
    assert cells == [("nearby", 16), ("nearby", 64), ("distant", 16), ("distant", 64)]
    for r in report["rows"]:  # the history-limited ablation of the (mamba2) drafter beside it, on eager
        assert set(r["tau"]) == {"random", "random-history8", "prompt-lookup"}
        assert all(1 <= t <= 8 for t in r["tau"].values())
    # `explained`, recomputed for one cell: the target's own greedy continuation against the passage's
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    stream = np.array(tok.encode(text.read_text()).ids)
    prompts, continuations = probe_prompts(stream, "distant", 64, 2)
    runtime = Runtime(out)
    shares = [np.mean(np.array(run_once(runtime, p, "none", 8).tokens) == c[:8]) for p, c in zip(prompts, continuations)]
    assert report["rows"][3]["explained"] == pytest.approx(float(np.mean(shares)))
    # a probe longer than the export's usable context: one line, exit 2
    assert main(["probe", str(out), "--distances", "4000", "--prompts-from", str(text)]) == 2
    assert "usable context" in capsys.readouterr().err
    # as conversations: needs the export's chat template, then runs as exactly
    assert main(["probe", str(both_formats), "--chat", "--prompts-from", str(text)]) == 2
    assert "no chat template" in capsys.readouterr().err
    assert main(["probe", str(out), "--chat", "--kind", "distant", "--distances", "16", "--prompts", "2",
                 "--max-new-tokens", "8", "--prompts-from", str(text), "--json"]) == 0
    chat = json.loads(capsys.readouterr().out)
    assert chat["chat"] and [(r["kind"], r["distance"]) for r in chat["rows"]] == [("distant", 16)]
    assert all(1 <= t <= 8 for t in chat["rows"][0]["tau"].values())


@pytest.mark.parametrize("args", [["--kind", "far"], ["--distances", "1,x"], ["--max-new-tokens", "1"]])
def test_probe_refuses_bad_flags(both_formats, args, capsys):
    assert main(["probe", str(both_formats), *args]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_history_limited_memory_is_the_folded_state_cut_to_the_last_m(both_formats):
    """The ablation's state (recomputed from the kept features) equals the state the drafter folded in
    round by round when M covers everything, and differs from it when M cuts history; only eager runs it."""
    prompt = np.random.default_rng(4).integers(3, 96, 50).tolist()
    full, limited, cut = (Runtime(both_formats, "eager", memory_history=m) for m in (10_000, 10_000, 16))
    for rt in (full, cut):
        run_once(rt, prompt, "model", 20)
    committed = full.ctx.rows
    assert committed == len(full.backend.history) >= len(prompt)
    folded = full.ctx.current["ssm_state"]
    np.testing.assert_allclose(full.backend.limited_state(committed).numpy(), folded, rtol=1e-4, atol=1e-5)
    assert not np.allclose(cut.backend.limited_state(committed).numpy(), folded, atol=1e-3)
    plain = run_once(Runtime(both_formats, "eager"), prompt, "model", 20)
    assert run_once(limited, prompt, "model", 20).tokens == plain.tokens  # exact either way
    with pytest.raises(ValueError, match="eager backend only"):
        Runtime(both_formats, "onnxruntime", memory_history=16)
