#!/usr/bin/env bash
# Issue 15: does a drafter's memory learn to hold evidence out of its window when its training asks for it?
# The long-range ablations' HyFlash and the window drafter of its parameter count (1,500 steps each,
# checkpoints/long-range: no memory gain on the probes) continue STEPS (600) steps on the same regenerated
# rows, half of them carrying a distant repeat (`train-drafter --distant-repeats 0.5`: a span of 48-96
# tokens copied again 128-256 tokens after itself, anchors only in the copy, so the evidence is 176-352
# tokens back, out of the 128-token window; the last anchor where all 7 labels are copied tokens), one
# thread each, side by side. Then the evidence probes for
# the four drafters (before and after, the same seeded probes) with the history-limited HyFlash (its memory
# the last 256 committed features only, eager backend).
# Then the same for the Gated DeltaNet drafter (a delta-rule memory, built for recall) against the window
# drafter of the same recipe: the second-generation runs (checkpoints/drafters-v2, 2,000 and 3,000 steps)
# continue STEPS_GDN (400) steps the same way; ${RESULT}_gdn.json.
# Every step resumes where it stopped; rerun the script to continue.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
source research/scripts/lib.sh
TARGET=${TARGET:-checkpoints/target-v3h-copy6} REGEN=${REGEN:-data/regen-v2} BEFORE=${BEFORE:-checkpoints/long-range}
OUT=${OUT:-runs/distant} STEPS=${STEPS:-600} RESULT=${RESULT:-research/results/distant_repeats_probe}
DONE=${DONE:-checkpoints/distant-repeats}  # finished runs, committed: copied, not retrained
mkdir -p "$OUT" results

train() {  # name, the run folder it continues, steps
  seed_run "$OUT/drafter-$1" "$DONE"
  [ -f "$OUT/drafter-$1/model/config.json" ] ||
    $H train-drafter --target "$TARGET" --data "$REGEN" --distant-repeats 0.5 --init-from "$2/model" \
      --out "$OUT/drafter-$1" --steps "$3" --lr 5e-4 --warmup 30 --batch 4 --threads 1 --eval-every 100 \
      --checkpoint-every 100 >> "$OUT/$1.log" 2>&1
}
both train "hyflash $BEFORE/drafter-hyflash-base $STEPS" "swa $BEFORE/drafter-swa-matched $STEPS"
[ -f "$RESULT.json" ] || {  # the exports only where a probe is still to run
  export_drafter "$OUT/export-hyflash-before" "$BEFORE/drafter-hyflash-base/model"
  export_drafter "$OUT/export-swa-before" "$BEFORE/drafter-swa-matched/model"
  export_drafter "$OUT/export-hyflash-repeats" "$OUT/drafter-hyflash/model"
  export_drafter "$OUT/export-swa-repeats" "$OUT/drafter-swa/model"
}
evidence_probe "$RESULT" "$OUT"/export-{hyflash,swa}-{before,repeats} --memory-history 256

V2=${V2:-checkpoints/drafters-v2} STEPS_GDN=${STEPS_GDN:-400}
both train "gdn $V2/drafter-gdn $STEPS_GDN" "swa-v2 $V2/drafter-swa $STEPS_GDN"
[ -f "${RESULT}_gdn.json" ] || {
  for name in gdn swa; do export_drafter "$OUT/export-$name-v2-before" "$V2/drafter-$name/model"; done
  export_drafter "$OUT/export-gdn-v2-repeats" "$OUT/drafter-gdn/model"
  export_drafter "$OUT/export-swa-v2-repeats" "$OUT/drafter-swa-v2/model"
}
evidence_probe "${RESULT}_gdn" "$OUT"/export-{gdn,swa}-v2-{before,repeats}
