#!/usr/bin/env bash
# The SmolLM2-135M-Instruct drafter's chat data: prompts made here, then the target's own answers with its
# tap features written in the same pass. Resumable: rerun to continue; TOKENS=... to extend the run.
# SET=prose makes a second set weighted to prose: on the held-out chat set the shipped drafter is weakest on
# questions and writing (docs/results-smollm2.md), and the first set is half code tasks with no writing
# tasks; the second has self-written writing tasks and questions, and some passage and code tasks (so the
# drafter keeps what it learnt).
# SET=requests makes a third set of messages written the way people ask: short questions ("Why do", "What is
# the difference between") and code requests ("Write a Python function that"), which neither set had (their
# self-written questions are long requests for advice, their code tasks work on given functions), with some
# writing and passage tasks; three answers in four greedy, as the chat bench answers.
# SET=asks makes a fourth set of the third's kinds with new prompts (another seed), weighted to short questions
# and writing tasks, the held-out chat set's weakest categories for the drafter; no passage tasks (copying is
# where it is strongest).
# SET=asks2 makes a fifth set as the fourth with new prompts (another seed): each set of such text has added to
# held-out τ, more passes over the same text have not (docs/results-smollm2.md, "A twelfth stage").
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
case ${SET:-chat} in
  chat) PROMPTS=data/chat/train-prompts.jsonl; OUT=${OUT:-data/chat/smollm2-regen}; TOKENS=${TOKENS:-1200000}
        SEED=0; MIX=(--magpie 1200 --writing 0 --code 2500 --passages 1500) ;;
  prose) PROMPTS=data/chat/train-prompts-prose.jsonl; OUT=${OUT:-data/chat/smollm2-regen-prose}
         TOKENS=${TOKENS:-400000}; SEED=1; MIX=(--magpie 700 --writing 1000 --code 500 --passages 300) ;;
  requests) PROMPTS=data/chat/train-prompts-requests.jsonl; OUT=${OUT:-data/chat/smollm2-regen-requests}
            TOKENS=${TOKENS:-560000}; SEED=2; GREEDY=0.75
            MIX=(--magpie 0 --writing 300 --questions 900 --code-requests 600 --code 0 --passages 200) ;;
  asks) PROMPTS=data/chat/train-prompts-asks.jsonl; OUT=${OUT:-data/chat/smollm2-regen-asks}
        TOKENS=${TOKENS:-620000}; SEED=3; GREEDY=0.75
        MIX=(--magpie 0 --writing 600 --questions 1000 --code-requests 400 --code 0 --passages 0) ;;
  asks2) PROMPTS=data/chat/train-prompts-asks2.jsonl; OUT=${OUT:-data/chat/smollm2-regen-asks2}
         TOKENS=${TOKENS:-620000}; SEED=4; GREEDY=0.75
         MIX=(--magpie 0 --writing 600 --questions 1000 --code-requests 400 --code 0 --passages 0) ;;
  *) echo "SET is chat, prose, requests, asks or asks2" >&2; exit 2 ;;
esac
[ -f "$PROMPTS" ] || $HF chat-prompts --target smollm2-135m-instruct --out "$PROMPTS" "${MIX[@]}" \
    --follow-up-share 0.25 --seed "$SEED" --threads 2
$HF regenerate --target smollm2-135m-instruct --prompts-from "$PROMPTS" --out "$OUT" \
    --tokens "$TOKENS" --batch 48 --max-new-tokens 320 --seq-len 1024 --greedy-share "${GREEDY:-0.5}" --temperature 0.7 \
    --seed "$SEED" --threads 2
