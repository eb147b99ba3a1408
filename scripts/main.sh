#!/usr/bin/env bash
# The main job on its embedded default: installs what is missing, builds, then
#  1. tokenizes real English text every Debian machine has (/usr/share/common-licenses),
#  2. writes the default GPT (2 layers, hidden 128, 4 heads, seq 64, vocab 256, batch 8),
#  3. compiles it with ptc-opt (autodiff, AdamW, sharding over a dp=2 x tp=2 mesh:
#     data parallel x Megatron tensor parallel, memory plan) into a plan,
#  4. trains it with ptc-run on 4 MPI ranks and shows the loss fall.
# Outputs go to out/ (PTC_OUT_DIR): corpus.bin, gpt.mlir, gpt.plan, run.jsonl, final.safetensors.
#   PTC_STEPS (default 1000), PTC_CORPUS (a text file to use instead of the licenses),
#   PTC_MESH (default dp:2,tp:2; empty: one process; e.g. pp:2,dp:2 for pipeline stages),
#   PTC_MICROBATCHES (default 1; micro-batches per step), PTC_SCHEDULE (default 1f1b)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BIN=${PTC_BUILD_DIR:-build}/bin
OUT=${PTC_OUT_DIR:-out}
STEPS=${PTC_STEPS:-1000}
MESH=${PTC_MESH-dp:2,tp:2}
RANKS=1
MESH_OPT=""
if [ -n "$MESH" ]; then
  MESH_OPT=" mesh=$MESH"
  for axis in ${MESH//,/ }; do RANKS=$((RANKS * ${axis#*:})); done
fi
MESH_OPT+=" microbatches=${PTC_MICROBATCHES:-1} schedule=${PTC_SCHEDULE:-1f1b}"
mkdir -p "$OUT"

if [ -n "${PTC_CORPUS:-}" ]; then
  "$BIN/ptc-tokenize" -o "$OUT/corpus.bin" "$PTC_CORPUS"
else
  # Regular files only: several licenses are symlinks to one another.
  find /usr/share/common-licenses -type f -print0 | sort -z | xargs -0 "$BIN/ptc-tokenize" -o "$OUT/corpus.bin"
fi
"$BIN/ptc-model" gpt --layers 2 --hidden 128 --heads 4 --seq 64 --vocab 256 --batch 8 -o "$OUT/gpt.mlir"
"$BIN/ptc-opt" "$OUT/gpt.mlir" --ptc-summarize-model \
  --ptc-compile="plan=$OUT/gpt.plan optimizer=adamw lr=1e-3 beta2=0.95 weight-decay=0.1 max-grad-norm=1.0$MESH_OPT" \
  -o "$OUT/gpt.compiled.mlir"
NP=()
if [ "$RANKS" -gt 1 ]; then NP=(--np "$RANKS" --threads 1); fi
"$BIN/ptc-run" "$OUT/gpt.plan" "${NP[@]}" --data "$OUT/corpus.bin" --steps "$STEPS" --log-every 100 \
  --metrics "$OUT/run.jsonl" --save "$OUT/final.safetensors"

# First loss vs the mean of the last 50 steps.
/usr/bin/python3 - "$OUT/run.jsonl" <<'PY'
import json, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1])]
tail = losses[-50:]
print(f"loss {losses[0]:.3f} at step 1 -> {sum(tail) / len(tail):.3f} (mean of the last {len(tail)} steps)")
PY
