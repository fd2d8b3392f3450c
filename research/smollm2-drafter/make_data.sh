#!/usr/bin/env bash
# The SmolLM2-135M-Instruct drafter's chat data: prompts made here, then the target's own answers with its
# tap features written in the same pass. Resumable: rerun to continue; TOKENS=... to extend the run.
# SET=prose makes a second set weighted to prose: on the held-out chat set the shipped drafter is weakest on
# questions and writing (docs/results-smollm2.md), and the first set is half code tasks with no writing
# tasks; the second has self-written writing tasks and questions, and some passage and code tasks (so the
# drafter keeps what it learnt).
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
case ${SET:-chat} in
  chat) PROMPTS=data/chat/train-prompts.jsonl; OUT=${OUT:-data/chat/smollm2-regen}; TOKENS=${TOKENS:-1200000}
        SEED=0; MIX=(--magpie 1200 --writing 0 --code 2500 --passages 1500) ;;
  prose) PROMPTS=data/chat/train-prompts-prose.jsonl; OUT=${OUT:-data/chat/smollm2-regen-prose}
         TOKENS=${TOKENS:-400000}; SEED=1; MIX=(--magpie 700 --writing 1000 --code 500 --passages 300) ;;
  *) echo "SET is chat or prose" >&2; exit 2 ;;
esac
[ -f "$PROMPTS" ] || $HF chat-prompts --target smollm2-135m-instruct --out "$PROMPTS" "${MIX[@]}" \
    --follow-up-share 0.25 --seed "$SEED" --threads 2
$HF regenerate --target smollm2-135m-instruct --prompts-from "$PROMPTS" --out "$OUT" \
    --tokens "$TOKENS" --batch 48 --max-new-tokens 320 --seq-len 1024 --greedy-share 0.5 --temperature 0.7 \
    --seed "$SEED" --threads 2
