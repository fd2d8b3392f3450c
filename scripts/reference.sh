#!/usr/bin/env bash
# The embedded reference pair, made by the project's own commands (DESIGN §6, issue 6).
# Each step resumes where it stopped (checkpoints under runs/); rerun the script to continue.
set -euo pipefail
cd "$(dirname "$0")/.."
H=.venv/bin/hyflash

[ -f data/corpus/train.txt ] || $H corpus --out data/corpus
[ -f data/corpus/tokenizer.json ] || $H train-tokenizer --corpus data/corpus --vocab-size 4096

# target: Qwen3 architecture, 12 layers x 256, context 2,048, 900 steps of 4 x 2,048 tokens
$H train-target --out runs/target --steps 900 --batch 4 --threads 2

# drafters: window 128, context 512, the same budget each
for kind in "hyflash --memory mamba2" "swa --memory off" "full --memory off --window full" \
            "gdn --memory gated_deltanet"; do
  set -- $kind
  name=$1; shift
  $H train-drafter --target runs/target/model --out "runs/drafter-$name" "$@" --steps 600 --batch 4 --threads 2
done
