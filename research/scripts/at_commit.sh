#!/usr/bin/env bash
# Run a command against the project's code at another commit, side by side with this checkout:
#   research/scripts/at_commit.sh COMMIT python -m hyflash.cli profile ...
#   research/scripts/at_commit.sh COMMIT python research/scripts/train_step_memory.py
# The commit is checked out in a temporary worktree and laid out as the installed package (hyflash/ with
# models/, export/, runtime_py/, train/ inside it) first on PYTHONPATH, so `hyflash.*` imports resolve
# to that commit's files; the editable install's finder (which maps hyflash.models etc. to this
# checkout) comes after the path and never sees them. `python` is this checkout's .venv.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
commit=$1; shift
tmp=$(mktemp -d)
trap 'git -C "$here" worktree remove --force "$tmp/wt" 2>/dev/null; rm -rf "$tmp"' EXIT
git -C "$here" worktree add -q --detach "$tmp/wt" "$commit"
mkdir -p "$tmp/pkg/hyflash"
for f in "$tmp/wt/hyflash/"*; do ln -s "$f" "$tmp/pkg/hyflash/"; done
for d in models export runtime_py train; do ln -s "$tmp/wt/$d" "$tmp/pkg/hyflash/$d"; done
[ "${1:-}" = python ] && { shift; set -- "$here/.venv/bin/python" "$@"; }
PYTHONSAFEPATH=1 PYTHONPATH="$tmp/pkg" "$@"  # safe path: not the cwd (this checkout) first
