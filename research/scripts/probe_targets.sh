#!/usr/bin/env bash
# Issue 15: how much do the targets use distant evidence? `hyflash probe` (nearby and distant evidence,
# 256 / 768 / 1,536 tokens of filler, 8 probes each, greedy) on the embedded first-generation target and
# the second-generation one (checkpoints/target-v3), each exported with an untrained drafter: what matters
# here is `explained` (the share of the target's own continuation equal to the passage's) and
# prompt-lookup's tau; drafters for the second generation are not trained yet. The committed
# research/results/probe_target_v3.* were made with the stage-E weights (commit 8efeb0a); checkpoints/target-v3 is
# now the stage-F model (research/reference/MODEL_CARD.md), so a rerun measures that one.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
mkdir -p runs/exports results
for name in reference v3; do
  target=reference; [ $name = v3 ] && target=checkpoints/target-v3
  [ -f runs/exports/probe-$name/manifest.json ] ||
    $H export --target "$target" --drafter random --out runs/exports/probe-$name --format onnx
  $H probe runs/exports/probe-$name --prompts 8 --threads 2 --out research/results/probe_target_$name.json \
    --plot research/results/probe_target_$name.png
done
