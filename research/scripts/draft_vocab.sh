#!/usr/bin/env bash
# Issue 16: a reduced draft vocabulary on the reference pair. The HyFlash drafter of
# research/scripts/ablation_regen.sh (corpus labels, STEPS steps, the full 4,096-token head) against the same
# recipe with --draft-vocab 1024 (the head scores the 1,024 most frequent corpus tokens), benched side
# by side on held-out prompts: tau per bucket and draft_read ms per round.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
TARGET=${TARGET:-reference} STEPS=${STEPS:-600} OUT=${OUT:-runs/ablation} RESULT=${RESULT:-research/results/draft_vocab.json}
[ -f "$OUT/drafter-corpus/model/model.safetensors" ] || { echo "run research/scripts/ablation_regen.sh first" >&2; exit 2; }
$H train-drafter --target "$TARGET" --data data/corpus --out "$OUT/drafter-dv1024" --memory mamba2 --window 128 \
  --intermediate-size 512 --markov-rank 32 --steps "$STEPS" --batch 4 --threads 1 --draft-vocab 1024
[ -f "$OUT/export-dv1024/manifest.json" ] ||
  $H export --target "$TARGET" --drafter "$OUT/drafter-dv1024/model" --out "$OUT/export-dv1024" --format onnx --force
$H bench "$OUT/export-corpus" "$OUT/export-dv1024" --buckets 256,512,1024,2048 --prompts-per-bucket "${PROMPTS:-8}" \
  --max-new-tokens 64 --threads 1 --json > "$RESULT"
.venv/bin/python -c "
import json; from hyflash.runtime_py.bench import markdown_tables
r = json.load(open('$RESULT')); print(markdown_tables(r))
for d, ms in r['graph_ms'].items(): print(d, {g: round(v, 3) for g, v in ms.items()})"
