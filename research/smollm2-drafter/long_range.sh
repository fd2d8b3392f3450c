#!/usr/bin/env bash
# Long-range evidence on the real pair's chat data: each drafter's held-out tau (teacher-forced, the target's
# own choices as labels; `hyflash eval-drafter`) on ROWS held-out conversations as they are, and on the same
# conversations with a distant repeat in every row (a span of 48-96 tokens copied again 128-256 tokens after
# itself, anchors only in the copy: what the target continues there lies beyond a 128-token window).
# DRAFTERS: LABEL=FOLDER ... (default: the shipped drafter and gpu_train.sh's fresh HyFlash and window drafter).
# LIMITED: labels measured again with the memory cut to the last MEMORY_HISTORY features (default 128, the
# window: the memory then holds nothing the window does not see), as LABEL-memory128.
# -> results/long_range.json (entries of the labels run here replaced, the others kept)
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
ROWS=${ROWS:-32}
OUTD=${OUTD:-runs/long-range}
DRAFTERS=${DRAFTERS:-"hyflash-shipped=smollm2-135m-instruct hyflash-fresh=runs/smollm2-hyflash-gpu/model window-fresh=runs/smollm2-swa-gpu/model"}
LIMITED=${LIMITED:-hyflash-shipped}
MEMORY_HISTORY=${MEMORY_HISTORY:-128}
mkdir -p "$OUTD"
measure() {  # label folder kind [flags]
  local label=$1 folder=$2 kind=$3; shift 3
  local extra=(); [ "$kind" = distant ] && extra=(--distant-repeats 1.0)
  $HF eval-drafter --drafter "$folder" --target smollm2-135m-instruct --data data/chat/smollm2-regen \
      --no-feature-cache --rows "$ROWS" --threads 2 "${extra[@]}" "$@" --out "$OUTD/$label-$kind.json"
}
labels=()
for item in $DRAFTERS; do
  label=${item%%=*} folder=${item#*=}
  for kind in plain distant; do
    measure "$label" "$folder" "$kind"
    if [[ " $LIMITED " == *" $label "* ]]; then
      measure "$label-memory$MEMORY_HISTORY" "$folder" "$kind" --memory-history "$MEMORY_HISTORY"
    fi
  done
  labels+=("$label")
  [[ " $LIMITED " == *" $label "* ]] && labels+=("$label-memory$MEMORY_HISTORY")
done
.venv/bin/python - "$OUTD" "${labels[@]}" <<'PY'
import json, sys
from pathlib import Path
out, path = Path(sys.argv[1]), Path("research/smollm2-drafter/results/long_range.json")
report = json.loads(path.read_text()) if path.is_file() else {}
for label in sys.argv[2:]:
    report[label] = {}
    for kind in ("plain", "distant"):
        got = json.loads((out / f"{label}-{kind}.json").read_text())
        report[label][kind] = {"heldout_tau": round(got["tau"], 4), "heldout_ce": round(got["ce"], 4),
                               "rows": got["rows"], "memory_history": got["memory_history"]}
path.write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report, indent=1))
PY
