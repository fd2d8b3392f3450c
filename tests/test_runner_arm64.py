"""hyflash-run built for ARM64 (`make runner-arm64`) and run under qemu-user on emulated CPUs, one without the
dot-product extension (Cortex-A53) and one with it (Cortex-A76, as in phones): exact against its own
target-only decoding in fp32 and with the int4 target, and refusing bad input as on x86. Slow (emulation);
skipped, with the reason, when the ARM binary or qemu is absent (`make runner-arm64` makes both)."""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
ARM_RUNNER = ROOT / "build" / "arm64" / "armv8-a" / "hyflash-run"
SYSROOT = Path("/usr/aarch64-linux-gnu")
CPUS = ("cortex-a53", "cortex-a76")  # without and with the dot-product extension

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ARM_RUNNER.is_file(), reason="no ARM64 runner: run `make runner-arm64`"),
              pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="no qemu-aarch64: `make runner-arm64`")]


@pytest.fixture(scope="module", autouse=True)
def up_to_date_arm_runner():
    """The ARM64 build brought up to date with the sources (incrementally), as the x86-64 runner is: a binary
    left from older sources would judge an export it cannot read."""
    subprocess.run(["cmake", "--build", str(ARM_RUNNER.parent), "-j2"], check=True, capture_output=True)


def run_arm(cpu: str, folder, prompt, *flags):
    """The ARM64 hyflash-run under qemu on `cpu` -> (exit code, [one dict per run], stderr)."""
    cmd = ["qemu-aarch64", "-L", str(SYSROOT), "-cpu", cpu, str(ARM_RUNNER), str(folder),
           "--prompt-ids", ",".join(map(str, prompt)), "--json", *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    runs = [json.loads(line) for line in out.stdout.splitlines()] if out.returncode == 0 else []
    return out.returncode, runs, out.stderr


def prompts(n=2, length=40):
    rng = np.random.default_rng(11)
    return [rng.integers(3, 4000, length).tolist() for _ in range(n)]


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("export", ["reference_pte", "reference_int4_pte"])
def test_speculative_equals_its_own_target_only_on_arm(request, export, cpu):
    folder = request.getfixturevalue(export)
    for prompt in prompts():
        flags = ("--max-new-tokens", "24", "--ignore-eos")
        code, (spec,), err = run_arm(cpu, folder, prompt, *flags)
        assert code == 0, err
        code, (plain,), err = run_arm(cpu, folder, prompt, *flags, "--no-draft")
        assert code == 0, err
        assert spec["tokens"] == plain["tokens"]
        assert spec["rounds"] < len(spec["tokens"])  # the drafter's blocks were accepted: a real speculative run


def test_bad_input_is_refused_in_one_line_on_arm(reference_pte, tmp_path):
    code, _, err = run_arm(CPUS[0], reference_pte, [999_999])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "outside the vocabulary" in err
    broken = tmp_path / "export"
    shutil.copytree(reference_pte, broken)
    (broken / "manifest.json").write_text("{ not json")
    code, _, err = run_arm(CPUS[0], broken, [5, 6, 7])
    assert code == 2 and len(err.strip().splitlines()) == 1
