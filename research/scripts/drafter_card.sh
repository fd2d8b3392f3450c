#!/usr/bin/env bash
# After the drafter runs of research/scripts/reference.sh (or reference_v2.sh): install each drafter as embedded
# reference data (config, bf16 weights and hybrid.json if calibrated, in the package; its training log and
# loss curve beside the model card), export each with the reference target, and measure held-out
# acceptance by context bucket with `hyflash bench`, greedy and at T = 1 (the model card's tables).
# Usage: research/scripts/drafter_card.sh [NAMES...]   (default: hyflash swa full gdn)
#        INSTALL=0 research/scripts/drafter_card.sh     (re-measure the embedded drafters: no install from runs/)
#        BENCH=0 research/scripts/drafter_card.sh       (install and export only)
#        RUNS=runs/reference-v2 TARGET_SRC=checkpoints/target-v3h-copy6 research/scripts/drafter_card.sh
#                                              (the second generation: the target installed too)
#        HYFLASH_RUN=runs/reference-v2/drafter-hyflash-lookup PLAIN=checkpoints/drafters-v2/drafter-hyflash/model \
#          RUNS=runs/reference-v2 research/scripts/drafter_card.sh
#                                              (the embedded HyFlash drafter from another run, here the one with
#                                              the lookup input; PLAIN: a drafter benched beside the embedded
#                                              ones, exported to $EXPORTS-hyflash-plain, not installed)
#        HYFLASH_RUN=runs/reference-v2/drafter-hyflash-lookup-more \
#          HYFLASH_BEFORE=checkpoints/drafters-v2/drafter-hyflash-lookup PLAIN=... RUNS=... research/scripts/drafter_card.sh
#                                              (the embedded HyFlash drafter, continued from an earlier run with
#                                              --init-from: its card's log holds both stages, one after the other)
# Exports go to $EXPORTS-<name> (default runs/exports/v2-<name>): delete them after installing new weights.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
RUNS=${RUNS:-runs} EXPORTS=${EXPORTS:-runs/exports/v2} PROMPTS=${PROMPTS:-8}
names=("$@")
[ $# -gt 0 ] || names=(hyflash swa full gdn)
if [ "${INSTALL:-1}" != 0 ] && [ -n "${TARGET_SRC:-}" ]; then
  cp "$TARGET_SRC"/{config.json,model.safetensors,tokenizer.json} hyflash/reference/target/
fi
exports=()
for name in "${names[@]}"; do
  if [ "${INSTALL:-1}" != 0 ]; then
    src=$RUNS/drafter-$name dest=hyflash/reference/drafter-$name card=research/reference/drafter-$name
    [ "$name" != hyflash ] || src=${HYFLASH_RUN:-$src}
    mkdir -p "$dest" "$card"
    rm -f "$dest/hybrid.json"
    cp "$src/model/config.json" "$src/model/model.safetensors" "$dest/"
    [ ! -f "$src/model/hybrid.json" ] || cp "$src/model/hybrid.json" "$dest/"
    cp "$src/log.jsonl" "$card/train_log.jsonl"
    if [ "$name" = hyflash ] && [ -n "${HYFLASH_BEFORE:-}" ]; then  # a run continued (--init-from): both stages
      .venv/bin/python -c "
import json; from pathlib import Path
first = [json.loads(x) for x in Path('$HYFLASH_BEFORE/log.jsonl').read_text().splitlines()]
then = [json.loads(x) for x in Path('$src/log.jsonl').read_text().splitlines()]
step, wall = first[-1]['step'], first[-1]['elapsed_s']
rows = first + [{**e, 'step': e['step'] + step, 'elapsed_s': e['elapsed_s'] + wall} for e in then]
Path('$card/train_log.jsonl').write_text(''.join(json.dumps(e) + '\\n' for e in rows))"
    fi
    .venv/bin/python -c "
from pathlib import Path; import json
from hyflash.train.evaluate import plot_training_log
print(json.dumps(plot_training_log(Path('$card/train_log.jsonl'), Path('$card/loss_curve.png'), 'drafter $name')))
" > "$card/train_summary.json"
  fi
  ref=reference$([ "$name" = hyflash ] || echo "-$name")
  [ -f "$EXPORTS-$name/manifest.json" ] ||
    $H export --target reference --drafter "$ref" --out "$EXPORTS-$name" --format onnx --force
  exports+=("$EXPORTS-$name")
done
# the int4 HyFlash drafter (ONNX MatMulNBits) beside the fp32 ones: how much tau quantization costs
[ -f "$EXPORTS-hyflash-int4/manifest.json" ] ||
  $H export --target reference --drafter reference --out "$EXPORTS-hyflash-int4" --format onnx --quantize int4 --force
exports+=("$EXPORTS-hyflash-int4")
if [ -n "${PLAIN:-}" ]; then
  [ -f "$EXPORTS-hyflash-plain/manifest.json" ] ||
    $H export --target reference --drafter "$PLAIN" --out "$EXPORTS-hyflash-plain" --format onnx --force
  exports+=("$EXPORTS-hyflash-plain")
fi
[ "${BENCH:-1}" != 0 ] || exit 0  # BENCH=0: install and export only
for t in 0 1; do  # greedy (bench.json) and sampled at T = 1 (bench_t1.json), seeded
  out=research/reference/bench$([ "$t" = 0 ] || echo "_t$t")
  $H bench "${exports[@]}" --buckets 256,512,1024,2048 --prompts-per-bucket "$PROMPTS" --max-new-tokens 64 \
    --temperature "$t" --seed 0 --threads 2 --plot "$out.png" --json > "$out.json.partial"
  mv "$out.json.partial" "$out.json"
  .venv/bin/python -c "
import json; from hyflash.runtime_py.bench import format_results, markdown_tables
r = json.load(open('$out.json')); print(format_results(r)); print(); print(markdown_tables(r))"
done
