"""Batches for the training loop and a fixed validation set of held-out items.

``Batcher`` draws one length bucket per step (with probability proportional to its tokens, so every example
is visited equally often) and a batch of about ``tokens_per_step`` positions from it. ``ValidationSet``
scores held-out items with fixed mask ratios and fixed masks, so its loss is comparable across steps.
"""
from __future__ import annotations

import random

import numpy as np
import torch

from . import data
from .bpe import EOS, EOT
from .objective import loss_terms, stratified_t
from .pool import WindowPolicy, encode_examples

VAL_SEED = data.TEST_SEED + 1  # held-out items, drawn apart from the evaluation's fixed sets


class Batcher:
    MAX_ROWS = 4000  # compiled graphs carry guards such as rows <= 4096; staying under them avoids recompiles

    def __init__(self, tokens_per_step: int, device, seed: int, eos_id: int):
        self.tokens_per_step, self.device, self.eos_id = tokens_per_step, device, eos_id
        self.tensors, self.useful, self.order, self.cursor = {}, {}, {}, {}
        self.reseed(seed)

    def reseed(self, seed: int):
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        self.order = {k: self.np_rng.permutation(len(u)) for k, u in self.useful.items()}
        self.cursor = {k: 0 for k in self.useful}

    @property
    def n_examples(self) -> int:
        return sum(len(u) for u in self.useful.values())

    def padding_share(self) -> float:
        total = sum(len(u) * sum(k) for k, u in self.useful.items())
        return 1 - sum(int(u.sum()) for u in self.useful.values()) / max(total, 1)

    def add(self, part: dict):
        """Append a shard's buckets (the pool grows while training runs)."""
        for key, bucket in part.items():
            new = tuple(torch.from_numpy(a.astype(np.int64) if a.ndim == 1 else a).to(self.device)
                        for a in (bucket.prompts, bucket.prompt_lens, bucket.answers))
            useful = bucket.prompt_lens.astype(np.int64) + (bucket.answers != self.eos_id).sum(1)
            if key in self.tensors:
                new = tuple(torch.cat([old, add]) for old, add in zip(self.tensors[key], new))
                useful = np.concatenate([self.useful[key], useful])
            self.tensors[key], self.useful[key] = new, useful
            self.order[key], self.cursor[key] = self.np_rng.permutation(len(useful)), 0

    def next(self):
        """((prompt [B,P] int64, prompt_lens [B], answers [B,W] int64), positions, useful positions)."""
        # a bucket is drawn from once it fills at least half a step: small batches would leave the compiled
        # graph's size range (a recompile) and waste the GPU; tiny pools (tests) fall back to every bucket
        keys = [k for k, u in self.useful.items() if self._size(k) * sum(k) >= self.tokens_per_step // 2]
        keys = keys or [k for k, u in self.useful.items() if len(u) >= 2]
        # each bucket is drawn in proportion to its tokens, so every example is visited equally often
        key = self.rng.choices(keys, [len(self.useful[k]) * sum(k) for k in keys])[0]
        size, n = self._size(key), len(self.useful[key])
        if self.cursor[key] + size > n:
            self.order[key] = self.np_rng.permutation(n)
            self.cursor[key] = 0
        idx = self.order[key][self.cursor[key]:self.cursor[key] + size]
        self.cursor[key] += size
        index = torch.from_numpy(idx).to(self.device, non_blocking=True)
        prompts, lens, answers = self.tensors[key]
        batch = (prompts.index_select(0, index).long(), lens.index_select(0, index), answers.index_select(0, index).long())
        return batch, size * sum(key), int(self.useful[key][idx].sum())

    def _size(self, key) -> int:
        return max(1, min(len(self.useful[key]), self.tokens_per_step // sum(key), self.MAX_ROWS))


class ValidationSet:
    def __init__(self, tokenizer, families, per_family: int, policy: WindowPolicy, device, eps: float = 1e-3):
        """Held-out items of each family, in their smallest window, with fixed t and masks."""
        self.device = device
        # "word@train": unseen word problems built from the *training* templates; next to "word" (held-out
        # templates) it separates a template-generalisation gap from plain undertraining
        self.families = list(families) + (["word@train"] if "word" in families else [])
        eos_id, eot_id = tokenizer.token_to_id(EOS), tokenizer.token_to_id(EOT)
        smallest = WindowPolicy(p_long=0.0, p_any=0.0, windows=policy.windows)
        gen = torch.Generator().manual_seed(VAL_SEED)
        self.batches = []
        for family in self.families:
            if family == "word@train":
                rng = random.Random(VAL_SEED)
                examples = [data.sample(rng, "train", "word") for _ in range(per_family)]
            else:
                examples = data.test_set(family, per_family, seed=VAL_SEED)
            grouped = encode_examples(tokenizer, examples, random.Random(0), smallest, eos_id, eot_id)
            for rows in grouped.values():
                prompt = torch.tensor([r[0] for r in rows])
                answers = torch.tensor([r[1] for r in rows])
                t = stratified_t(len(rows), eps, "cpu", gen)
                masked = torch.rand(answers.shape, generator=gen) < t[:, None]
                lens = torch.tensor([r[2] for r in rows])
                self.batches.append((family, *(x.to(device) for x in (prompt, lens, answers, masked, t))))

    @torch.no_grad()
    def evaluate(self, params, model_cfg, mask_id: int, bf16: bool):
        """Per-family mean weighted loss and argmax accuracy on masked positions."""
        sums = {f: [0.0, 0, 0, 0] for f in self.families}
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            for family, prompt, lens, answers, masked, t in self.batches:
                weighted, _, correct, count = loss_terms(params, model_cfg, mask_id, prompt, lens, answers, masked, t)
                row = sums[family]
                row[0] += float(weighted.sum())
                row[1] += len(weighted)
                row[2] += int(correct.sum())
                row[3] += int(count.sum())
        losses = {f: s[0] / max(s[1], 1) for f, s in sums.items()}
        accs = {f: s[2] / max(s[3], 1) for f, s in sums.items()}
        return losses, accs
