#!/usr/bin/env bash
# The main job on its embedded default: installs what is missing, builds, writes
# the default GPT (2 layers, hidden 128, 4 heads, seq 64, vocab 256, batch 8)
# and compiles it with ptc-opt, printing a summary of the model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BIN=${PTC_BUILD_DIR:-build}/bin
OUT=${PTC_OUT_DIR:-out}
mkdir -p "$OUT"

"$BIN/ptc-model" gpt --layers 2 --hidden 128 --heads 4 --seq 64 --vocab 256 --batch 8 -o "$OUT/gpt.mlir"
echo "wrote $OUT/gpt.mlir"
"$BIN/ptc-opt" "$OUT/gpt.mlir" --ptc-summarize-model -o "$OUT/gpt.checked.mlir"
echo "verified and summarized; IR in $OUT/gpt.checked.mlir"
