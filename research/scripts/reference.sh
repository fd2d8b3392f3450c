#!/usr/bin/env bash
# The embedded reference pair, made by the project's own commands (docs/design.md; issue 6).
# Each step resumes where it stopped (checkpoints under runs/); rerun the script to continue.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash

[ -f data/corpus/train.txt ] || $H corpus --out data/corpus
[ -f data/corpus/tokenizer.json ] || $H train-tokenizer --corpus data/corpus --vocab-size 4096

# target: Qwen3 architecture, 12 layers x 256, context 2,048, 900 steps of 4 x 2,048 tokens
$H train-target --out runs/target --steps 900 --batch 4 --threads 2

# drafters: window 128, context 512, the same budget each (1,000 steps of 4 x 512 tokens); MLP 512
# and Markov rank 32 keep all four drafters and the target under 40 MB together. On 2 cores, two
# runs at a time with one thread each.
drafter() {  # name, then train-drafter flags
  local name=$1; shift
  $H train-drafter --target reference --out "runs/drafter-$name" "$@" \
    --intermediate-size 512 --markov-rank 32 --steps 1000 --batch 4 --threads 1 > "runs/drafter-$name.log" 2>&1
}
drafter hyflash --memory mamba2 --window 128 & drafter swa --memory off --window 128 & wait
drafter gdn --memory gated_deltanet --window 128 & drafter full --memory off --window full & wait
