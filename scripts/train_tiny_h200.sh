#!/usr/bin/env bash
# One device call on the H200: train the bundled tiny-chat model (compiled, bf16), fresh or warm-started from
# INIT, then copy the sharded weights and a tarball of the small files to $OUT and evaluate held-out accuracy.
#   MINUTES (7.5) training minutes, WALL (500) seconds after start by which training ends, INIT (unset) a
#   model folder to warm-start from, PF (100) items per family, DECODERS and EVAL_LIMIT (60 s) for the probe.
export PY=${PY:-python3}; set -o pipefail; export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
S=/tmp/shim/flash_dllm; mkdir -p $S; for d in engine kernels app assets; do ln -sfn $PWD/$d $S/$d; done; export PYTHONPATH=/tmp/shim
R=/tmp/run; rm -rf $R; mkdir -p $R
ARGS="--out $R/tiny-chat --seed ${SEED:-0} --minutes ${MINUTES:-7.5} --wall-limit ${WALL:-500}"
[ -n "$INIT" ] && ARGS="$ARGS --init-from $INIT --lr ${LR:-1e-3} --warmup 100"
timeout $(( ${WALL:-500} + 40 )) $PY -m flash_dllm.engine.training.train $ARGS $EXTRA 2>&1 | tee $R/train.log | grep -v "^train:" | grep -v "it/s\]" | tail -60
cp $R/tiny-chat/model*.safetensors $OUT/
(cd $R && tar czf $OUT/tiny-chat-small.tgz tiny-chat/*.json tiny-chat/*.jinja tiny-chat-loss.png train.log)
timeout $(( ${EVAL_LIMIT:-60} + 30 )) $PY -m flash_dllm.engine.training.evaluate --model $R/tiny-chat --per-family ${PF:-100} \
  --decoders ${DECODERS:-llada,fast-dllm-0.9,one-pass-per-block} --time-limit ${EVAL_LIMIT:-60} --out $OUT/probe.json 2>&1 | grep -v Warn | tail -14
ls -la $OUT
