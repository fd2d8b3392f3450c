#!/usr/bin/env bash
# Issue 16: peak RSS of one drafter training step at Qwen3-0.6B's geometry, before (BEFORE: the drafter
# kept fp32 copies of the embedding and LM head, and training computed full-vocabulary logits for the
# target at every position and for the drafter at every slot) and after (this checkout).
set -euo pipefail
cd "$(dirname "$0")/../.."
BEFORE=${BEFORE:-b994ada}
before=$(research/scripts/at_commit.sh "$BEFORE" python research/scripts/train_step_memory.py 1)
after=$(.venv/bin/python research/scripts/train_step_memory.py 1)
printf '{"before": %s, "after": %s}\n' "$before" "$after" > research/results/train_step_memory.json
cat research/results/train_step_memory.json
