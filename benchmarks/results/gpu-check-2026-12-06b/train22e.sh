#!/usr/bin/env bash
# #22, second warm start of 2026-12-06: from train22d's weights (gpu-check-2026-12-06a, copied into INIT before
# the call), with everyday arithmetic drawn more often (0.31 -> 0.40 of the mix): train22d's everyday misses
# are mostly wrong quotients and products of held-out operand pairs ("904 ÷ 8 = 118."). Run from the repository
# root as one device call (about 9 minutes), then `bash scripts/eval_tiny_cpu.sh` with MODEL at its weights.
INIT=${INIT:-assets/models/tiny-chat} MINUTES=7 WALL=470 SEED=41 EVAL_NEW=40 EVAL_LIMIT=25 PF=100 DECODERS=llada,flash-cache \
  EXTRA="--tokens-per-step 80000 --pool 3000000 --block-view-share 0.65 --families word:0.17,multi:0.13,arith:0.02,\
lists:0.02,multiturn:0.02,chat:0.01,everyday:0.40,everyday_word:0.12,everyday_lists:0.06,everyday_chat:0.02,\
out_of_scope:0.03" bash scripts/train_tiny_h200.sh
