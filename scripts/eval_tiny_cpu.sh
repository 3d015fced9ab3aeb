#!/usr/bin/env bash
# Held-out evaluation of a tiny-chat folder on a CPU: the targets of issue #22 and the old targets, re-measured on
# the same held-out items (the first N of each family's fixed test set), in two one-thread processes.
#   MODEL (assets/models/tiny-chat), N (200) items per family, N_OLD (100) items per family for the old targets at
#   one token per step (a full forward per committed token: ~12 minutes for 100 word problems on one core), OUT
#   (benchmarks/results), TAG (cpu) file-name part. On a 2-core machine (2026-12-05) process 2 took 44 minutes and
#   process 1's flash-cache part 26 (free-phrased lists alone 16: long wrong answers).
# Process 1, the everyday targets: flash-cache (the page's default: the balanced preset) on the five everyday
#   families, then llada at one token per step on everyday arithmetic, word problems and out-of-scope prompts.
# Process 2, the old targets: llada at one token per step and one pass per block on word and multi-answer
#   problems, then flash-cache on every old family.
# Results: $OUT/tiny-chat-eval-$TAG-{everyday,old}*.json, logs beside them; each prints a markdown table.
set -euo pipefail
MODEL=${MODEL:-assets/models/tiny-chat}; N=${N:-200}; N_OLD=${N_OLD:-100}; OUT=${OUT:-benchmarks/results}; TAG=${TAG:-cpu}
PY=${PY:-python3}; mkdir -p "$OUT"
EVAL="$PY -m flash_dllm.engine.training.evaluate --model $MODEL --device cpu --per-family"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
(
  $EVAL $N --families everyday,everyday_word,out_of_scope,everyday_lists,everyday_chat --decoders flash-cache \
    --out "$OUT/tiny-chat-eval-$TAG-everyday.json"
  $EVAL $N --families everyday,everyday_word,out_of_scope --decoders llada --out "$OUT/tiny-chat-eval-$TAG-everyday-llada.json"
) > "$OUT/tiny-chat-eval-$TAG-everyday.log" 2>&1 &
first=$!
(
  $EVAL $N_OLD --families word,multi --decoders llada,one-pass-per-block --out "$OUT/tiny-chat-eval-$TAG-old-llada.json"
  $EVAL $N --families word,arith,lists,multi,multiturn,chat --decoders flash-cache --out "$OUT/tiny-chat-eval-$TAG-old.json"
) > "$OUT/tiny-chat-eval-$TAG-old.log" 2>&1 &
second=$!
status=0
wait $first || status=1
wait $second || status=1
grep -h -v "Warn" "$OUT/tiny-chat-eval-$TAG-everyday.log" "$OUT/tiny-chat-eval-$TAG-old.log" | grep "^|" || true
exit $status
