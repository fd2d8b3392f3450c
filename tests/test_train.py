"""Training: corpus split, tokenizer, target and drafter trainers, resume, and DDP equivalence."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hyflash.cli import main
from hyflash.models.loading import load_drafter, load_target
from hyflash.train.batches import response_anchors
from hyflash.train.calibrate import measure_rounds
from hyflash.train.data import is_heldout, train_tokenizer, write_corpus
from hyflash.train.regenerate import load_regenerated


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A few real stdlib modules as the corpus, a tiny BPE, and a 2-layer target trained 4 steps."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    src = tmp_path_factory.mktemp("stdlib")
    for name in ("bisect.py", "heapq.py", "textwrap.py", "colorsys.py", "shlex.py", "fnmatch.py", "glob.py"):
        (src / name).write_text((root / name).read_text())
    out = tmp_path_factory.mktemp("corpus")
    record = write_corpus(out, src)
    assert record["files"]["train"] + record["files"]["heldout"] == 7
    train_tokenizer(out / "train.txt", 320, out / "tokenizer.json")
    run = tmp_path_factory.mktemp("target")
    args = ["train-target", "--corpus", str(out), "--tokenizer", str(out / "tokenizer.json"), "--out", str(run),
            "--seq-len", "64", "--layers", "4", "--hidden", "64", "--batch", "2", "--warmup", "2",
            "--checkpoint-every", "2"]
    assert main(args + ["--steps", "2"]) == 0
    assert main(args + ["--steps", "4"]) == 0  # resumes at step 2
    return out, run


def test_split_is_stable_and_by_file():
    assert is_heldout("json/decoder.py") == is_heldout("json/decoder.py")
    names = [f"pkg/mod{i}.py" for i in range(2000)]
    share = sum(map(is_heldout, names)) / len(names)
    assert 0.03 < share < 0.07


def test_target_training_resumes_and_writes_a_loadable_checkpoint(corpus):
    _, run = corpus
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [1, 2, 3, 4]
    assert log[-1]["loss"] < log[0]["loss"]
    from hyflash.models.loading import load_target

    target = load_target(run / "model")
    assert target.cfg.architecture == "Qwen3ForCausalLM" and (run / "model" / "tokenizer.json").is_file()


def _drafter_args(corpus, out):
    data, run = corpus
    return ["train-drafter", "--target", str(run / "model"), "--data", str(data), "--tokenizer",
            str(data / "tokenizer.json"), "--out", str(out), "--seq-len", "48", "--anchors", "6", "--batch", "4",
            "--steps", "3", "--warmup", "1", "--markov-rank", "8"]


def test_train_drafter_continues_from_a_drafter_folder(corpus, tmp_path, capsys):
    """--init-from: the folder's weights and architecture are where the run starts (at a vanishing lr the
    result is the folder's weights, bit for bit; a fresh drafter at that seed is not), and an architecture
    flag beside it is refused in one line."""
    first, more = tmp_path / "first", tmp_path / "more"
    assert main(_drafter_args(corpus, first)) == 0
    args = _drafter_args(corpus, more)
    args = args[:args.index("--markov-rank")] + args[args.index("--markov-rank") + 2:]  # the folder's own
    assert main(args + ["--init-from", str(first / "model"), "--lr", "1e-12", "--steps", "1"]) == 0
    a, b = load_file(first / "model" / "model.safetensors"), load_file(more / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((more / "run_config.json").read_text())["init_from"] == str(first / "model")
    fresh = tmp_path / "fresh"
    assert main(args[:args.index("--out") + 1] + [str(fresh)] + args[args.index("--out") + 2:]
                + ["--lr", "1e-12", "--steps", "1", "--markov-rank", "8"]) == 0
    c = load_file(fresh / "model" / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)
    capsys.readouterr()
    for flags, says in ((["--markov-rank", "8"], "leave out --markov-rank"),
                        (["--markov-rank", "64"], "leave out --markov-rank"),  # a default given is refused too
                        (["--window", "128"], "leave out --window")):
        assert main(args + ["--init-from", str(first / "model"), *flags, "--out", str(tmp_path / "refused")]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1
    assert main(args + ["--init-from", str(first), "--out", str(tmp_path / "refused")]) == 2  # the run, not its model/
    assert "not a drafter folder" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def test_slot_gamma_weighs_the_slots_losses(corpus, tmp_path, capsys):
    """--slot-gamma G: slot k's loss weighs exp(-(k-1)/G), normalised; the same first step under another G logs
    another loss; the run records G, and resuming it without G is refused in one line."""
    from hyflash.train.drafter import SLOT_GAMMA, Distill

    _, run = corpus
    target = load_target(run / "model")
    plain, sharp = tmp_path / "plain", tmp_path / "sharp"
    assert main(_drafter_args(corpus, plain) + ["--steps", "1"]) == 0
    assert main(_drafter_args(corpus, sharp) + ["--steps", "1", "--slot-gamma", "0.5"]) == 0
    drafter = load_drafter(sharp / "model", target)
    weight = Distill(drafter, target, 6, 0.5).slot_weight
    k = torch.arange(drafter.cfg.block, dtype=torch.float32)
    assert torch.allclose(weight, torch.exp(-2 * k) / torch.exp(-2 * k).sum())
    assert torch.allclose(Distill(drafter, target, 6).slot_weight,
                          torch.exp(-k / SLOT_GAMMA) / torch.exp(-k / SLOT_GAMMA).sum())
    logs = [json.loads((r / "log.jsonl").read_text().splitlines()[0]) for r in (plain, sharp)]
    assert logs[0]["ce"] != logs[1]["ce"]  # same weights, same batch: only the weighting differs
    assert logs[0]["tau"] == logs[1]["tau"]  # what the drafter drafts before its first step is the same
    assert json.loads((sharp / "run_config.json").read_text())["slot_gamma"] == 0.5
    assert "slot_gamma" not in json.loads((plain / "run_config.json").read_text())
    capsys.readouterr()
    assert main(_drafter_args(corpus, sharp) + ["--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "slot_gamma" in err and err.count("\n") == 1


def test_the_lookup_input_is_added_to_a_trained_drafter(corpus, tmp_path, capsys):
    """--init-from with --lookup-input: the drafter gains prompt-lookup's block as an input, drafting exactly
    as before until trained (whatever the block), then learning to use it; a drafter that has it is refused."""
    from hyflash.models.drafter import LOOKUP_WEIGHTS
    from hyflash.models.loading import load_drafter, load_target
    from hyflash.models.lookup import lookup_many

    _, run = corpus
    first, grown = tmp_path / "first", tmp_path / "grown"
    assert main(_drafter_args(corpus, first)) == 0
    target = load_target(run / "model")
    plain = load_drafter(first / "model", target)
    added = load_drafter(first / "model", target, add_lookup_input=True)
    assert added.cfg.lookup_input and not plain.cfg.lookup_input
    tokens = torch.tensor(([5, 9, 13, 7, 21, 5, 9, 13, 30, 11] * 4)[:36])
    anchors, block = torch.tensor([12, 15, 22, 27]), plain.cfg.block
    with torch.no_grad():
        _, features = target.trunk(tokens[None])
        prev = tokens[(anchors[:, None] + torch.arange(block)).clamp(max=35)]
        found = tuple(torch.from_numpy(x) for x in lookup_many(tokens.numpy(), anchors.numpy(), block))
        assert (found[1] > 0).all()  # lookup matches there: a block that would move the drafts if it were read
        a, _ = plain.forward_train(features[0], tokens, anchors, prev)
        b, _ = added.forward_train(features[0], tokens, anchors, prev, lookup=found)
    assert torch.equal(a, b)
    args = _drafter_args(corpus, grown)
    args = args[:args.index("--markov-rank")] + args[args.index("--markov-rank") + 2:]
    assert main(args + ["--init-from", str(first / "model"), "--lookup-input", "--lr", "1e-2"]) == 0
    cfg = json.loads((grown / "model" / "config.json").read_text())["hyflash_drafter"]
    assert cfg["lookup_input"] is True
    weights = load_file(grown / "model" / "model.safetensors")
    assert set(LOOKUP_WEIGHTS) <= weights.keys() and any(weights[k].abs().max() > 0 for k in LOOKUP_WEIGHTS)
    assert json.loads((grown / "run_config.json").read_text())["added"] == "lookup_input"
    capsys.readouterr()
    assert main(args + ["--init-from", str(grown / "model"), "--lookup-input", "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "already reads prompt-lookup's block" in err and err.count("\n") == 1
    assert not (tmp_path / "no").exists()


def test_eval_drafter_gives_the_training_logs_held_out_figures(corpus, tmp_path, capsys):
    """eval-drafter measures a drafter folder as it is: the held-out tau and cross-entropy a training log reports
    for the same weights (one step at a vanishing lr leaves them bit for bit); the memory-limited ablation
    changes them; a bad folder is one line and exit 2."""
    first, again = tmp_path / "first", tmp_path / "again"
    assert main(_drafter_args(corpus, first)) == 0
    args = _drafter_args(corpus, again)
    args = args[:args.index("--markov-rank")] + args[args.index("--markov-rank") + 2:]
    assert main(args + ["--init-from", str(first / "model"), "--lr", "1e-12", "--steps", "1", "--eval-every", "1",
                        "--eval-rows", "3"]) == 0
    logged = json.loads((again / "log.jsonl").read_text().splitlines()[-1])
    data, run = corpus
    common = ["eval-drafter", "--drafter", str(first / "model"), "--target", str(run / "model"), "--data", str(data),
              "--tokenizer", str(data / "tokenizer.json"), "--seq-len", "48", "--anchors", "6", "--rows", "3",
              "--device", "cpu", "--json"]
    capsys.readouterr()
    assert main(common + ["--out", str(tmp_path / "eval.json")]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == json.loads((tmp_path / "eval.json").read_text())
    assert got["rows"] == 3 and got["memory_history"] is None
    assert got["tau"] == pytest.approx(logged["heldout_tau"], abs=1e-6)
    assert got["ce"] == pytest.approx(logged["heldout_ce"], rel=1e-5)
    assert got["walked_tau"] == pytest.approx(logged["heldout_walked_tau"], abs=1e-6) and got["walked_rounds"] > 0
    assert main(common + ["--memory-history", "1"]) == 0
    limited = json.loads(capsys.readouterr().out)
    assert limited["memory_history"] == 1 and limited["ce"] != pytest.approx(got["ce"], rel=1e-5)
    assert main(common[:2] + [str(first)] + common[3:]) == 2  # the run, not its model/
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(first) in err


def test_ddp_two_ranks_match_one_process(corpus, tmp_path):
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    assert main(_drafter_args(corpus, single)) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "hyflash.cli", *_drafter_args(corpus, ddp)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    ranks = json.loads((ddp / "rank_checksums.json").read_text())
    assert ranks[0] == ranks[1]  # the two ranks hold identical weights
    logs = [[json.loads(x)["loss"] for x in (d / "log.jsonl").read_text().splitlines()] for d in (single, ddp)]
    assert logs[0] == pytest.approx(logs[1], abs=1e-5)
    a, b = load_file(single / "model" / "model.safetensors"), load_file(ddp / "model" / "model.safetensors")
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=2e-2), k  # bf16 files: rounding only
    # one writer: rank 0 alone wrote the model (once, by rename: no temporary folder left) and said so
    assert result.stdout.count("wrote ") == 1
    assert sorted(p.name for p in ddp.iterdir()) == ["checkpoint", "log.jsonl", "model", "rank_checksums.json",
                                                  "run_config.json"]
    assert sorted(p.name for p in (ddp / "model").iterdir()) == ["config.json", "model.safetensors"]
    resumed = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)  # both ranks resume, done
    assert resumed.returncode == 0 and load_file(ddp / "model" / "model.safetensors").keys() == b.keys()


def test_eval_target_reports_loss_by_position(corpus, tmp_path, capsys):
    data, run = corpus
    png = tmp_path / "lbp.png"
    args = ["--target", str(run / "model"), "--corpus", str(data), "--tokenizer", str(data / "tokenizer.json"),
            "--seq-len", "32", "--windows", "3", "--json"]
    assert main(["eval-target", *args, "--plot", str(png)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["windows"] >= 1 and 0 <= report["accuracy"] <= 1 and report["loss"] > 0
    assert "copy_rate" not in report and png.stat().st_size > 5000
    # the copy probes are the research group's (the reference target's experiments), not the product command's
    with pytest.raises(SystemExit) as refused:
        main(["eval-target", *args, "--copy-fillers", "8,16"])
    assert refused.value.code == 2
    assert main(["research", "eval-target", *args, "--copy-fillers", "8,16", "--copy-probes", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (set(report["copy_rate"]) == set(report["copy_accuracy_teacher_forced"])
            == set(report["copy_recovery_teacher_forced"]) == {"copy_8", "copy_16"})
    assert [b["to"] for b in report["loss_by_position"]][-1] == 32


def test_a_checkpoint_without_its_optimizer_state_resumes_at_its_step(tmp_path):
    """research/scripts/target_v2_keep.sh keeps weights (bf16), step and log, not Adam's moments."""
    from safetensors.torch import save_file

    from hyflash.train.loop import TrainConfig, load_checkpoint

    model = torch.nn.Linear(4, 3)
    (tmp_path / "checkpoint").mkdir()
    save_file({k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()},
              tmp_path / "checkpoint" / "model.safetensors")
    (tmp_path / "checkpoint" / "state.json").write_text(json.dumps({"step": 7, "log": [{"step": 7}]}))
    fresh = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(fresh.parameters())
    step, log = load_checkpoint(fresh, opt, TrainConfig(out=tmp_path, steps=10, batch=1))
    assert step == 7 and log == [{"step": 7}] and not opt.state  # moments start afresh
    assert torch.allclose(fresh.weight, model.weight.to(torch.bfloat16).float())


# ---------------------------------------------------------------- regenerated data

def _regen_args(corpus, out, *extra):
    data, run = corpus
    return ["regenerate", "--target", str(run / "model"), "--prompts-from", str(data), "--out", str(out),
            "--tokens", "150", "--batch", "3", "--seq-len", "40", "--prompt-len", "8..16", "--greedy-share", "0.5",
            *extra]


def test_regenerate_writes_the_targets_own_text_and_resumes_to_the_same_bytes(corpus, tmp_path, capsys):
    from hyflash.models.loading import load_target
    from hyflash.models.target import greedy
    from hyflash.train.regenerate import load_regenerated

    _, run = corpus
    out = tmp_path / "regen"
    assert main(_regen_args(corpus, out)) == 0
    data = load_regenerated(out)
    assert data.tokens.shape[1] == 40 and data.tokens.dtype.name == "int32"
    assert data.summary()["response_tokens"] >= 150 and 0 < data.greedy.sum() < len(data.greedy)
    assert ((8 <= data.prompt_len) & (data.prompt_len <= 16)).all()
    target = load_target(run / "model")
    for row, p, g in zip(data.tokens[:6], data.prompt_len, data.greedy):
        expected = greedy(target, row[:p].tolist(), 40 - p, max_context=64)
        assert (row[p:].tolist() == expected) == bool(g)  # greedy rows are the target's chain, sampled ones not
    throughput = json.loads((out / "throughput.json").read_text())
    assert throughput["batch"] == 3 and throughput["batched_tokens_per_s"] > 0 and throughput["single_tokens_per_s"] > 0
    # resume: a lost shard is written again, identical; the others are kept as they are
    shards = sorted(out.glob("shard-*.npz"))
    kept, lost = shards[0].read_bytes(), shards[-1].read_bytes()
    sums = json.loads((out / "checksums.json").read_text())
    del sums[shards[-1].name]
    (out / "checksums.json").write_text(json.dumps(sums))
    shards[-1].unlink()
    capsys.readouterr()
    assert main(_regen_args(corpus, out)) == 0
    assert shards[-1].read_bytes() == lost and shards[0].read_bytes() == kept
    capsys.readouterr()
    # other settings into the same folder: refused, nothing touched
    assert main(_regen_args(corpus, out, "--temperature", "0.7")) == 2
    err = capsys.readouterr().err
    assert "other settings (temperature)" in err and err.count("\n") == 1
    # a shard changed after it was written: refused by the reader
    changed = bytearray(shards[0].read_bytes())
    changed[len(changed) // 2] ^= 1
    shards[0].write_bytes(bytes(changed))
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_regenerated(out)


def test_anchors_fall_in_the_response():
    from hyflash.train.batches import response_anchors
    from hyflash.train.drafter import draw_anchors

    tokens = torch.arange(2 * 40).view(2, 40)
    allowed = torch.from_numpy(response_anchors(np.array([0, 21]), 40))  # row 1: a prompt of 21 tokens
    allowed[0, 10:15] = False  # say, a user turn
    a = draw_anchors(tokens, allowed, block=7, anchors=16)
    assert a.shape == (2, min(16, 40 - 7 - 20))
    assert (a[0] >= 1).all() and (a[1] >= 20).all() and (a <= 40 - 7 - 1).all()
    assert not ((a[0] >= 10) & (a[0] < 15)).any()
    assert len(set(a[1].tolist())) == a.shape[1]  # distinct
    assert torch.equal(draw_anchors(tokens[1:], allowed[1:], 7, 16), a[1:])  # a row draws alike in any batch
    none = allowed.clone()
    none[1, :] = False
    with pytest.raises(ValueError, match="allows no anchor"):
        draw_anchors(tokens, none, 7, 16)
    # a chat answer ending at 20 (EOS filler after it): every anchor's 7 labels lie inside the answer
    ends = response_anchors(np.array([5]), 40, np.array([20]))[0]
    assert np.flatnonzero(ends).tolist() == list(range(4, 13))


def test_distant_repeats_copy_a_span_out_of_the_window_and_anchor_only_in_the_copy():
    from hyflash.train.batches import LABELS, DistantRepeats, Rows

    class Base:  # rows 0..T-1 offset by the row's index: every token says where it came from
        seq_len, describe = 400, {"kind": "test"}

        def sample(self, rng, n):
            tokens = np.arange(self.seq_len)[None, :] + 1000 * np.arange(n)[:, None]
            anchorable = np.ones((n, self.seq_len), bool)
            anchorable[1, 300:] = False  # an answer that ends at 300 + 7
            return Rows(tokens, anchorable)

        def heldout(self, n):
            return self.sample(None, n)

    rep = DistantRepeats(Base(), 1.0, span=(48, 96), gap=(128, 256), cue=8)
    rows = rep.sample(np.random.default_rng(0), 3)
    for i, (row, allowed, base_row) in enumerate(zip(rows.tokens, rows.anchorable, Base().sample(None, 3).tokens)):
        jumps = np.flatnonzero(np.diff(row) != 1)  # the text runs 0, 1, 2, ... but where the copy starts and ends
        assert len(jumps) == 2
        dst, end = jumps[0] + 1, jumps[1] + 1
        s = end - dst
        src = int(row[dst] - base_row[0])
        assert 48 <= s <= 96 and np.array_equal(row[dst:end], row[src:src + s])
        assert 128 <= dst - (src + s) <= 256  # the gap: the copy's evidence is s + gap > 128 tokens back
        assert np.array_equal(row[:dst], base_row[:dst]) and np.array_equal(row[end:], base_row[dst:400 - s])
        # anchors from the cue's end while all 7 labels are predicted from copied tokens (the last: dst+s-7)
        assert np.flatnonzero(allowed).tolist() == list(range(dst + 7, end - 6))
        assert end + LABELS <= (307 if i == 1 else 400)  # row 1's answer ends at 307: the copy stays inside it
    held = rep.heldout(2)
    assert np.array_equal(held.tokens, rep.heldout(2).tokens)  # the same held-out draw at every evaluation
    assert all(len(np.flatnonzero(np.diff(row) != 1)) == 2 for row in held.tokens)  # each carries a repeat
    assert rep.describe["distant_repeats"]["share"] == 1.0 and rep.describe["kind"] == "test"
    half = DistantRepeats(Base(), 0.5).sample(np.random.default_rng(1), 200)
    changed = (np.diff(half.tokens, axis=1) != 1).any(1).mean()
    assert 0.35 < changed < 0.65
    with pytest.raises(ValueError, match="share of rows"):
        DistantRepeats(Base(), 0.0)
    Base.seq_len = 200
    with pytest.raises(ValueError, match="raise --seq-len"):
        DistantRepeats(Base(), 0.5)


def test_train_drafter_with_distant_repeats(corpus, tmp_path, capsys):
    args = _drafter_args(corpus, tmp_path / "d")
    args[args.index("--seq-len") + 1] = "240"
    assert main(args + ["--distant-repeats", "0.5", "--eval-every", "3", "--eval-rows", "2"]) == 0
    run_config = json.loads((tmp_path / "d" / "run_config.json").read_text())
    assert run_config["data"]["distant_repeats"]["share"] == 0.5
    assert "heldout_tau" in json.loads((tmp_path / "d" / "log.jsonl").read_text().splitlines()[-1])
    assert main(_drafter_args(corpus, tmp_path / "e") + ["--distant-repeats", "0.5"]) == 2
    assert "raise --seq-len" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # refused while parsing, before the target or the data are read
        main(args + ["--distant-repeats", "1.5"])
    assert "expected a share in (0, 1], got '1.5'" in capsys.readouterr().err


def test_train_drafter_on_regenerated_text(corpus, tmp_path, capsys):
    out = tmp_path / "regen"
    assert main(_regen_args(corpus, out)) == 0
    args = _drafter_args(corpus, tmp_path / "d")
    i = args.index("--data")
    args[i + 1] = str(out)
    j = args.index("--seq-len")
    del args[j:j + 2]  # the regenerated sequences' own length
    assert main(args) == 0
    assert (tmp_path / "d" / "model" / "model.safetensors").is_file()
    assert main(args + ["--seq-len", "48"]) == 2
    assert "differs from the regenerated sequences' 40" in capsys.readouterr().err


def test_hybrid_from_calibration_to_the_loop(corpus, both_formats, tmp_path, capsys):
    """regenerate -> train-drafter -> calibrate (hybrid.json in the drafter folder) -> export (manifest
    drafter.hybrid) -> generate --draft hybrid: the target's greedy output, token for token; an export
    without calibration refuses --draft hybrid in one line."""
    from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats

    _, run = corpus
    regen = tmp_path / "regen"
    assert main(_regen_args(corpus, regen, "--greedy-share", "1.0")) == 0
    args = _drafter_args(corpus, tmp_path / "d")
    args[args.index("--data") + 1] = str(regen)
    j = args.index("--seq-len")
    del args[j:j + 2]
    assert main(args) == 0
    drafter = tmp_path / "d" / "model"
    png = tmp_path / "rel.png"
    capsys.readouterr()
    assert main(["calibrate", "--drafter", str(drafter), "--target", str(run / "model"), "--data", str(regen),
                 "--plot", str(png), "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)
    assert cal["rounds"] > 0 and png.stat().st_size > 10_000
    assert json.loads((drafter / "hybrid.json").read_text())["lookup"] == cal["lookup"]
    m = cal["mean_accepted"]
    assert m["hybrid"] <= m["better_of_two"] and m["better_of_two"] >= max(m["drafter"], m["lookup"])
    assert sum(row["rounds"] for row in cal["by_agreement"]) == cal["rounds"]
    # the blocks' agreement, measured: both blocks follow the target's chain for min(drafter, lookup) drafts,
    # so they share at least that many; where one went further, they part exactly where the other stopped
    t = load_target(run / "model")
    data = load_regenerated(regen)
    r = measure_rounds(t, load_drafter(drafter, t), data.tokens,
                       response_anchors(data.prompt_len, data.tokens.shape[1], data.length))
    least = np.minimum(r["drafter"], r["lookup"])
    part = r["drafter"] != r["lookup"]
    assert len(r["agree"]) == cal["rounds"] and part.any()  # rounds where one block went further exist
    assert (r["agree"] >= least).all() and (r["agree"][part] == least[part]).all()
    # the per-slot confidences behind `expected`: one row a round, a probability a slot, summing to it
    assert r["confidence"].shape == (len(r["expected"]), 7)
    assert ((r["confidence"] >= 0) & (r["confidence"] <= 1)).all()
    np.testing.assert_allclose(r["confidence"].sum(1), r["expected"], rtol=1e-5)
    out = tmp_path / "exp"
    assert main(["export", "--target", str(run / "model"), "--drafter", str(drafter), "--out", str(out),
                 "--format", "onnx", "--max-context", "96", "--prefill-chunk", "16"]) == 0
    rt = Runtime(out)
    assert rt.hybrid["lookup"] == cal["lookup"]
    prompt = [int(t) for t in np.load(next(regen.glob("shard-*.npz")))["tokens"][0, :30]]

    def gen(draft, **kw):
        stats = Stats()
        for _ in rt.generate(prompt, GenerationConfig(max_new_tokens=40, draft=draft, ignore_eos=True, **kw), stats):
            pass
        return stats
    base, hybrid = gen("none"), gen("hybrid")
    assert hybrid.tokens == base.tokens
    assert 0 <= hybrid.skipped_reads <= hybrid.lookup_rounds <= hybrid.rounds
    assert hybrid.graph_calls["draft_read"] == hybrid.rounds - hybrid.skipped_reads
    # a drafter that costs 100 rounds is never worth running, a free one always: the same tokens either way
    # (the target verifies whichever block), and still the state commits every round
    costly, free = gen("hybrid", draft_cost=100.0), gen("hybrid", draft_cost=0.0)
    assert costly.tokens == free.tokens == base.tokens
    assert costly.skipped_reads == costly.lookup_rounds == costly.rounds and "draft_read" not in costly.graph_calls
    assert free.skipped_reads == 0 and free.graph_calls["draft_read"] == free.rounds
    assert costly.graph_calls["window_shift"] == free.graph_calls["window_shift"] == costly.rounds
    model = gen("model")
    assert len(model.expected_accepted) == model.rounds and model.tokens == base.tokens
    # an export without the calibration (the random drafter's) refuses --draft hybrid in one line
    capsys.readouterr()
    assert main(["generate", str(both_formats), "--prompt-ids", "1,2,3", "--draft", "hybrid"]) == 2
    err = capsys.readouterr().err
    assert "no hybrid calibration: run `hyflash calibrate`" in err and err.count("\n") == 1
    # bench: a hybrid row beside its parents; the drafter's row carries its held-out calibration; two
    # drafters of one kind (an ablation) are told apart by their export folders
    twin = tmp_path / "twin"
    shutil.copytree(out, twin)
    data, _ = corpus
    capsys.readouterr()
    assert main(["bench", str(out), str(twin), "--buckets", "16,40", "--prompts-from", str(data / "heldout.txt"),
                 "--prompts-per-bucket", "2", "--max-new-tokens", "16", "--json"]) == 0
    rows = {r["drafter"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert set(rows) - {"optimum-ort"} == {"target-only", "exp", "twin", "prompt-lookup", "hybrid-exp", "hybrid-twin"}
    assert 0 <= rows["hybrid-exp"]["lookup_share"] <= 1 and sum(b["rounds"] for b in rows["exp"]["calibration"]) > 0


def test_drafter_training_logs_heldout_tau_and_refuses_a_resume_with_other_flags(corpus, tmp_path, capsys):
    out = tmp_path / "d"
    args = _drafter_args(corpus, out) + ["--eval-every", "2", "--eval-rows", "2"]
    assert main(args) == 0
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if "heldout_tau" in e] == [2, 3]  # every 2 steps and at the end
    assert all(1.0 <= e["heldout_tau"] <= 8.0 and 1.0 <= e["heldout_walked_tau"] <= 8.0 and e["tokens_per_s"] > 0
               for e in log if "heldout_tau" in e)
    capsys.readouterr()
    assert main([*args[:-4], "--lr", "5e-4", "--steps", "5"]) == 2  # a resume with another lr
    err = capsys.readouterr().err
    assert "other settings (lr: 0.001 -> 0.0005" in err and err.count("\n") == 1
    assert main([*args, "--steps", "3", "--threads", "1"]) == 0  # threads may differ


def test_draft_vocabulary_trains_exports_and_stays_exact(corpus, tmp_path):
    """--draft-vocab 64: the head scores the 64 most frequent tokens of the data, the exported draft_read
    maps them back to target ids, and greedy speculative output is still the target's own."""
    from hyflash.export.validate import summarize, validate
    from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
    from hyflash.train.data import token_stream

    data, run = corpus
    out = tmp_path / "d"
    assert main(_drafter_args(corpus, out) + ["--draft-vocab", "64"]) == 0
    w = load_file(out / "model" / "model.safetensors")
    counts = np.bincount(token_stream(data, data / "tokenizer.json", "train"), minlength=320)
    assert w["d2t"].dtype == torch.int64 and w["markov_out.weight"].shape[0] == 64
    assert set(w["d2t"].tolist()) == set(np.argsort(-counts, kind="stable")[:64].tolist())
    exp = tmp_path / "exp"
    assert main(["export", "--target", str(run / "model"), "--drafter", str(out / "model"), "--out", str(exp),
                 "--format", "onnx", "--max-context", "96", "--prefill-chunk", "16"]) == 0
    rows = summarize(validate(exp))
    assert all(r.ok for r in rows), [r for r in rows if not r.ok]
    rt = Runtime(exp)
    assert rt.contract.graph("draft_read")["outputs"][1]["shape"] == [7, 64]
    prompt = token_stream(data, data / "tokenizer.json", "heldout")[:30].tolist()
    drafted = []
    draft = rt.draft
    rt.draft = lambda *a, **k: drafted.append(draft(*a, **k).copy()) or drafted[-1]
    runs = []
    for mode in ("model", "none"):
        stats = Stats()
        for _ in rt.generate(prompt, GenerationConfig(max_new_tokens=30, draft=mode, ignore_eos=True), stats):
            pass
        runs.append(stats.tokens)
    assert runs[0] == runs[1] and drafted
    assert set(np.concatenate(drafted).tolist()) <= set(w["d2t"].tolist())
