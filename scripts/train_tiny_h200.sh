#!/usr/bin/env bash
# One device call on the H200: train the bundled tiny-chat model (compiled, bf16), fresh or warm-started from
# INIT, then copy the sharded weights and a tarball of the small files to $OUT and evaluate held-out accuracy.
#   MINUTES (7.5) training minutes, WALL (480) seconds after start by which training ends, INIT (unset) a
#   model folder to warm-start from, EXTRA more trainer flags (e.g. --families with weights, data.parse_mix).
# Evaluation, two probes after training (each skips its later cells past its time limit):
#   the everyday families of issue #22 with flash-cache (the page's default: balanced preset) and one token per
#   step, PF_NEW (200) items each, EVAL_NEW (40 s) -> $OUT/probe-everyday.json;
#   the old families (the old targets, same held-out items) with DECODERS, PF (100) items, EVAL_LIMIT (30 s)
#   -> $OUT/probe.json.
export PY=${PY:-python3}; set -o pipefail; export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
S=/tmp/shim/flash_dllm; mkdir -p $S; for d in engine kernels app assets; do ln -sfn $PWD/$d $S/$d; done; export PYTHONPATH=/tmp/shim
R=/tmp/run; rm -rf $R; mkdir -p $R
ARGS="--out $R/tiny-chat --seed ${SEED:-0} --minutes ${MINUTES:-7.5} --wall-limit ${WALL:-480}"
[ -n "$INIT" ] && ARGS="$ARGS --init-from $INIT --lr ${LR:-1e-3} --warmup 100"
timeout $(( ${WALL:-480} + 40 )) $PY -m flash_dllm.engine.training.train $ARGS $EXTRA 2>&1 | tee $R/train.log | grep -v "^train:" | grep -v "it/s\]" | tail -60
cp $R/tiny-chat/model*.safetensors $OUT/
(cd $R && tar czf $OUT/tiny-chat-small.tgz tiny-chat/*.json tiny-chat/*.jinja tiny-chat-loss.png train.log)
EVAL="$PY -m flash_dllm.engine.training.evaluate --model $R/tiny-chat"
timeout $(( ${EVAL_NEW:-40} + 30 )) $EVAL --per-family ${PF_NEW:-200} --families everyday,everyday_word,out_of_scope,everyday_lists,everyday_chat \
  --decoders flash-cache,llada --time-limit ${EVAL_NEW:-40} --out $OUT/probe-everyday.json 2>&1 | grep -v Warn | tail -9
timeout $(( ${EVAL_LIMIT:-30} + 30 )) $EVAL --per-family ${PF:-100} --families word,multi,arith,lists,multiturn,chat \
  --decoders ${DECODERS:-llada,one-pass-per-block,flash-cache} --time-limit ${EVAL_LIMIT:-30} --out $OUT/probe.json 2>&1 | grep -v Warn | tail -10
ls -la $OUT
