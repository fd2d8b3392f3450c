#!/usr/bin/env bash
# The SmolLM2-135M-Instruct drafter's chat data: prompts made here, then the target's own answers with its
# tap features written in the same pass. Resumable: rerun to continue; TOKENS=... to extend the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
PROMPTS=data/chat/train-prompts.jsonl
OUT=${OUT:-data/chat/smollm2-regen}
TOKENS=${TOKENS:-1200000}
[ -f "$PROMPTS" ] || $HF chat-prompts --target smollm2-135m-instruct --out "$PROMPTS" \
    --magpie 1200 --code 2500 --passages 1500 --follow-up-share 0.25 --seed 0 --threads 2
$HF regenerate --target smollm2-135m-instruct --prompts-from "$PROMPTS" --out "$OUT" \
    --tokens "$TOKENS" --batch 48 --max-new-tokens 320 --seq-len 1024 --greedy-share 0.5 --temperature 0.7 \
    --seed 0 --threads 2
