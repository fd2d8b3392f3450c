"""Training devices: which device a process trains on and which process group it joins.
Only torch's device queries are mocked; everything else is the real selection code."""

import pytest
import torch

from hyflash.cli import main
from hyflash.train.loop import pick_device, process_group_backend


@pytest.fixture
def cuda(monkeypatch):
    """A machine with two CUDA devices, as torch's device queries report it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_auto_picks_the_ranks_own_gpu_and_nccl(cuda, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        device = pick_device("auto")
        assert device == torch.device("cuda", rank) and process_group_backend(device) == "nccl"
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match="LOCAL_RANK 2 but only 2 CUDA devices"):
        pick_device("cuda")


def test_cpu_when_asked_or_when_no_gpu_is_visible(cuda, monkeypatch):
    assert pick_device("cpu") == torch.device("cpu") and process_group_backend(torch.device("cpu")) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="--device cuda: no CUDA device is visible"):
        pick_device("cuda")


def test_mps_for_one_process_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert pick_device("auto") == torch.device("mps")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert pick_device("auto") == torch.device("cpu")


def test_cli_refuses_a_missing_gpu_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["train-drafter", "--target", "reference", "--data", str(tmp_path / "no-data"), "--out",
                 str(tmp_path / "r"), "--device", "cuda", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device is visible" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()
