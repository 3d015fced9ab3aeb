#!/usr/bin/env bash
# One device call on the H200: warm-start the bundled tiny-chat model and train further (compiled, bf16),
# then copy the sharded weights and a tarball of the small files to $OUT and probe accuracy.
export PY=${PY:-python3}; set -o pipefail; export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
S=/tmp/shim/flash_dllm; mkdir -p $S; for d in engine kernels app assets; do ln -sfn $PWD/$d $S/$d; done; export PYTHONPATH=/tmp/shim
R=/tmp/run; rm -rf $R; mkdir -p $R
timeout 430 $PY -m flash_dllm.engine.training.train --out $R/tiny-chat --init-from assets/models/tiny-chat --seed 1 --lr 1.2e-3 --warmup 150 --minutes 6 --wall-limit 380 $EXTRA 2>&1 | tee $R/train.log | grep -v "^train:"
cp $R/tiny-chat/model*.safetensors $OUT/
(cd $R && tar czf $OUT/tiny-chat-small.tgz tiny-chat/*.json tiny-chat/*.jinja tiny-chat-loss.png train.log)
timeout 50 $PY -m flash_dllm.engine.training.evaluate --model $R/tiny-chat --per-family ${PF:-100} --decoders fast-dllm-0.9,one-pass-per-block,llada --time-limit 35 --out $OUT/probe.json 2>&1 | grep -v Warn | tail -14
ls -la $OUT
