#!/usr/bin/env bash
# ad-hoc device run (#22): warm start of the bundled model from the shipped weights with the operation-naming
# sentences the CPU follow-up could not teach in 4M positions; same mix as the shipped 2026-12-05 H200 run
INIT=assets/models/tiny-chat MINUTES=5.5 WALL=330 SEED=17 EVAL_NEW=40 EVAL_LIMIT=25 PF=100 DECODERS=llada,flash-cache \
  EXTRA="--tokens-per-step 80000 --pool 3000000 --block-view-share 0.65 --families word:0.20,multi:0.14,arith:0.02,\
lists:0.04,multiturn:0.03,chat:0.01,everyday:0.28,everyday_word:0.16,everyday_lists:0.06,everyday_chat:0.02,\
out_of_scope:0.04" bash scripts/train_tiny_h200.sh
