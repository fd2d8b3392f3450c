#!/usr/bin/env bash
# Issue 15: the paper's long-range evidence at this project's scale, on the second-generation pair
# (research/scripts/reference_v2.sh first: its target, regenerated text and drafters are reused).
# - Ablations, trained with the embedded drafters' recipe on a smaller budget (ABL_STEPS, 1,500), beside
#   HyFlash retrained on that same budget (hyflash-base), so that each comparison is at equal steps:
#   HyFlash without attention among draft slots, a one-layer HyFlash, and the window drafter with HyFlash's
#   parameter count (MLP 816: 2.107 M parameters against HyFlash's 2.105 M; memory off). The
#   history-limited HyFlash (memory of the last 256 features only) is the trained HyFlash run again on the
#   eager backend (`probe --memory-history 256`).
# - The evidence probes (nearby / distant, fillers 256 / 768 / 1,536, 8 probes each): the four second-
#   generation drafters with the history-limited HyFlash ($RESULT.json), then the ablations
#   (${RESULT}_ablations.json; the same seeded probes, so the two files' rows compare).
# - The paper's table: tau by context bucket up to the target's 2,048 for full attention (trained at 512),
#   window, HyFlash, Gated DeltaNet and prompt-lookup, greedy and at T = 1: the embedded pair's bench,
#   `PLAIN=checkpoints/drafters-v2/drafter-hyflash/model PROMPTS=16 research/scripts/drafter_card.sh`
#   (research/reference/bench.json, bench_t1.json; PLAIN adds the HyFlash row without the lookup input).
# Every step resumes where it stopped; rerun the script to continue.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
source research/scripts/lib.sh
TARGET=${TARGET:-checkpoints/target-v3h-copy6} V2=${V2:-runs/reference-v2} OUT=${OUT:-runs/long-range}
ABL_STEPS=${ABL_STEPS:-1500} RESULT=${RESULT:-research/results/long_range_probe} REGEN=${REGEN:-data/regen-v2}
GEN2=${GEN2:-$OUT/export-v2}  # the four second-generation drafters as first trained (HyFlash without the lookup input)
ABL_DONE=${ABL_DONE:-checkpoints/long-range}  # finished ablation runs, committed: copied, not retrained
ABL_PARTIAL=${ABL_PARTIAL:-checkpoints/long-range-partial}  # unfinished ones, committed at a session's end: resumed
mkdir -p "$OUT" results
[ -f "$TARGET/model.safetensors" ] && [ -f "$REGEN/config.json" ] ||
  { echo "the target ($TARGET) or the regenerated text ($REGEN) is missing: run research/scripts/reference_v2.sh first" >&2; exit 2; }

export_run() {  # export folder, run folder: the run's drafter exported with the target (again if retrained)
  export_drafter "$1" "$2/model"
}
ablation() {  # name, then train-drafter flags; a finished run is left alone
  local name=$1; shift
  seed_run "$OUT/drafter-$name" "$ABL_DONE" "$ABL_PARTIAL"
  [ -f "$OUT/drafter-$name/model/config.json" ] ||
    $H train-drafter --target "$TARGET" --data "$REGEN" --out "$OUT/drafter-$name" "$@" --window 128 \
      --markov-rank 32 --steps "$ABL_STEPS" --batch 4 --threads 1 >> "$OUT/drafter-$name.log" 2>&1
  export_run "$OUT/export-$name" "$OUT/drafter-$name"
}
# the ablations need only the target and the regenerated text: they train first (ABLATIONS_ONLY=1 stops
# there, so that they can use the cores while reference_v2.sh still trains the four drafters)
both ablation "hyflash-base --memory mamba2 --intermediate-size 512" "hyflash-noslot --memory mamba2 --intermediate-size 512 --no-slot-attention"
both ablation "hyflash-1layer --memory mamba2 --intermediate-size 512 --layers 1" "swa-matched --memory off --intermediate-size 816"
[ -z "${ABLATIONS_ONLY:-}" ] || exit 0
for name in hyflash swa gdn full; do
  [ -f "$V2/drafter-$name/model/config.json" ] ||
    { echo "the drafter $name is not trained yet ($V2/drafter-$name): run research/scripts/reference_v2.sh to its end first" >&2; exit 2; }
done
# the four drafters as first trained, exported here (drafter_card.sh's HyFlash export now has the lookup input)
for name in hyflash swa gdn full; do export_run "$GEN2-$name" "$V2/drafter-$name"; done

evidence_probe "$RESULT" "$GEN2"-{hyflash,swa,gdn,full} --memory-history 256
evidence_probe "${RESULT}_ablations" "$OUT"/export-{hyflash-base,hyflash-noslot,hyflash-1layer,swa-matched}
