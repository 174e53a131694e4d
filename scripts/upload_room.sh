#!/usr/bin/env bash
# Room in the device tool's 64 MiB upload (tracked files + carried paths) for the staged binaries and wheels: moves
# the large tracked paths that the GPU tests and benchmarks of scripts/gpu_test.sh, gpu_serve.sh and gpu_spill*.sh do
# not read out of the tree, and back.
#   here:  bash scripts/upload_room.sh out     # before the device call
#          bash scripts/upload_room.sh in      # right after it, and before any commit: `git add -A` while they are
#                                              # out records them as deleted
# Moved, not linked (the upload follows links). `out` refuses when the store already holds a path (an earlier `out`
# without `in`: moving again would nest the directories), `in` when the tree already has it.
set -eu
cd "$(dirname "$0")/.."
AWAY=.bigstore/upload_room
MOVED="models/demo/model.safetensors tests/golden/fixtures/v4/cases tests/fixtures/exl3 bench/results/raw"
grep -qxF "/.bigstore/" .git/info/exclude 2>/dev/null || echo "/.bigstore/" >> .git/info/exclude
case "${1:-}" in
  out)
    for p in $MOVED; do
      [ -e "$AWAY/$p" ] && { echo "upload_room: $AWAY/$p already exists: run 'in' first" >&2; exit 1; }
    done
    for p in $MOVED; do
      [ -e "$p" ] || continue
      mkdir -p "$AWAY/$(dirname "$p")"
      mv -T "$p" "$AWAY/$p"
    done
    tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    echo "upload: $tree bytes of tracked and unignored files, plus the carried paths (limit 67108864 in all);" \
         "put them back with: bash scripts/upload_room.sh in"
    ;;
  in)
    for p in $MOVED; do
      [ -e "$AWAY/$p" ] || continue
      [ -e "$p" ] && { echo "upload_room: $p exists in the tree; leaving $AWAY/$p" >&2; exit 1; }
      mkdir -p "$(dirname "$p")"
      mv -T "$AWAY/$p" "$p"
    done
    echo "tracked files missing from the tree: $(git status --short | grep -c '^ D' || true)"
    ;;
  *)
    echo "usage: $0 out|in" >&2
    exit 2
    ;;
esac
