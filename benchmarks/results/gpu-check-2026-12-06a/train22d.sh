#!/usr/bin/env bash
# #22, run 2026-12-06 on an H100 (train22d.log, probe-*-22d.json beside it): a warm start from the shipped weights
# with the data added after them: training-only lists of single digits and small numbers ("sort 5 3 9 1"), and
# out-of-scope questions on mathematics beyond the four operations ("what is 15% of 80", "sqrt 49", "7^3"),
# one-line multiplications/divisions in more sentences, and follow-ups after everyday questions ("now double it").
# The 2026-12-06 run's mix and length. Run it from the repository root as one device call (about 8 minutes),
# then `bash scripts/eval_tiny_cpu.sh` with MODEL at the weights it returns.
INIT=assets/models/tiny-chat MINUTES=6 WALL=420 SEED=37 EVAL_NEW=40 EVAL_LIMIT=25 PF=100 DECODERS=llada,flash-cache \
  EXTRA="--tokens-per-step 80000 --pool 3000000 --block-view-share 0.65 --families word:0.19,multi:0.13,arith:0.02,\
lists:0.02,multiturn:0.02,chat:0.01,everyday:0.31,everyday_word:0.15,everyday_lists:0.08,everyday_chat:0.02,\
out_of_scope:0.05" bash scripts/train_tiny_h200.sh
