#!/usr/bin/env bash
# ad-hoc device run (#22): a second warm start, from train22.sh's weights (copied over assets/models/tiny-chat for the call), everyday
# arithmetic 0.28 -> 0.31 and everyday word problems 0.16 -> 0.13
INIT=assets/models/tiny-chat MINUTES=6 WALL=420 SEED=29 EVAL_NEW=40 EVAL_LIMIT=25 PF=100 DECODERS=llada,flash-cache \
  EXTRA="--tokens-per-step 80000 --pool 3000000 --block-view-share 0.65 --families word:0.20,multi:0.14,arith:0.02,\
lists:0.03,multiturn:0.02,chat:0.01,everyday:0.31,everyday_word:0.13,everyday_lists:0.08,everyday_chat:0.02,\
out_of_scope:0.04" bash scripts/train_tiny_h200.sh
