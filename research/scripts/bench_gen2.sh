#!/usr/bin/env bash
# Issue 14: the second-generation drafters measured before they are installed as the embedded pair: each
# exported with the second-generation target straight from its run folder (int4 HyFlash beside fp32), then
# `hyflash bench` on held-out prompts, greedy and at T = 1 (seeded), 16 prompts per bucket, 64 tokens.
# A calibrated HyFlash drafter (hybrid.json in its model folder) adds the hybrid row.
# Usage: research/scripts/bench_gen2.sh [NAMES...]   (default: hyflash swa; RUNS=, OUT=, EXPORTS= to move folders;
#        RUNS=checkpoints/drafters-v2 on a fresh clone: the committed weights of the finished runs)
# tau does not depend on the machine's load; the tokens/s columns are figures only on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
source research/scripts/lib.sh
TARGET=${TARGET:-checkpoints/target-v3h-copy6} RUNS=${RUNS:-runs/reference-v2}
EXPORTS=${EXPORTS:-runs/exports/gen2} OUT=${OUT:-research/results/bench_gen2}
names=("$@")
[ $# -gt 0 ] || names=(hyflash swa)
exports=()
export_one() {  # name, model folder, export flags: exported again when the model folder changed since
  local out=$EXPORTS-$1 model=$2; shift 2
  export_drafter "$out" "$model" "$@"
  exports+=("$out")
}
for name in "${names[@]}"; do
  export_one "$name" "$RUNS/drafter-$name/model"
  [ "$name" != hyflash ] || export_one hyflash-int4 "$RUNS/drafter-hyflash/model" --quantize int4
done
for t in 0 1; do
  out=$OUT$([ "$t" = 0 ] || echo "_t$t")
  $H bench "${exports[@]}" --buckets 256,512,1024,2048 --prompts-per-bucket 16 --max-new-tokens 64 \
    --temperature "$t" --seed 0 --threads 2 --plot "$out.png" --json > "$out.json.partial"
  mv "$out.json.partial" "$out.json"
done
