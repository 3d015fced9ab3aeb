#!/usr/bin/env bash
# ad-hoc device run (#22): warm start of the bundled model from the shipped weights, with the widened training
# phrasings of everyday arithmetic sentences and list requests (tasks_everyday.TRAIN_ONLY_WORDED,
# tasks_everyday_lists.TRAIN_ONLY); the shipped run's mix with free-phrased lists 0.06 -> 0.08 (old lists and
# multi-turn one point each less)
INIT=assets/models/tiny-chat MINUTES=5.5 WALL=330 SEED=23 EVAL_NEW=40 EVAL_LIMIT=25 PF=100 DECODERS=llada,flash-cache \
  EXTRA="--tokens-per-step 80000 --pool 3000000 --block-view-share 0.65 --families word:0.20,multi:0.14,arith:0.02,\
lists:0.03,multiturn:0.02,chat:0.01,everyday:0.28,everyday_word:0.16,everyday_lists:0.08,everyday_chat:0.02,\
out_of_scope:0.04" bash scripts/train_tiny_h200.sh
