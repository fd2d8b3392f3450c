#!/usr/bin/env bash
# Long-range evidence on the real pair's chat data: each drafter's held-out tau (teacher-forced, the target's
# own choices as labels) on ROWS held-out conversations as they are, and on the same conversations with a
# distant repeat in every row (a span of 48-96 tokens copied again 128-256 tokens after itself, anchors only
# in the copy: what the target continues there lies beyond a 128-token window). One training step at lr
# 1e-12 is the evaluation (the weights do not move). DRAFTERS: LABEL=FOLDER ... (default: the shipped
# drafter and gpu_train.sh's fresh HyFlash and window drafter). -> results/long_range.json
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
ROWS=${ROWS:-32}
OUTD=${OUTD:-runs/long-range}
DRAFTERS=${DRAFTERS:-"hyflash-shipped=smollm2-135m-instruct hyflash-fresh=runs/smollm2-hyflash-gpu/model window-fresh=runs/smollm2-swa-gpu/model"}
for item in $DRAFTERS; do
  label=${item%%=*} folder=${item#*=}
  for kind in plain distant; do
    extra=(); [ "$kind" = distant ] && extra=(--distant-repeats 1.0)
    $HF train-drafter --target smollm2-135m-instruct --data data/chat/smollm2-regen --no-feature-cache \
        --init-from "$folder" --steps 1 --lr 1e-12 --warmup 1 --batch 1 --eval-every 1 --eval-rows "$ROWS" \
        --threads 2 --seed 0 "${extra[@]}" --out "$OUTD/$label-$kind" > "$OUTD.$label-$kind.log" 2>&1
  done
done
.venv/bin/python - "$OUTD" $DRAFTERS <<'PY'
import json, sys
from pathlib import Path
out, report = Path(sys.argv[1]), {}
for item in sys.argv[2:]:
    label = item.split("=", 1)[0]
    for kind in ("plain", "distant"):
        last = [json.loads(x) for x in (out / f"{label}-{kind}" / "log.jsonl").read_text().splitlines()][-1]
        report.setdefault(label, {})[kind] = {"heldout_tau": round(last["heldout_tau"], 4),
                                              "heldout_ce": round(last["heldout_ce"], 4)}
path = Path("research/smollm2-drafter/results/long_range.json")
path.write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report, indent=1))
PY
