"""Tokenised training pool grouped by length, built in parallel worker processes.

Layout of one example (LLaDA SFT): the template-rendered prompt, left-padded to a multiple of
``PROMPT_QUANTUM`` (padding is excluded from attention through the key mask, and RoPE positions start at the
first real token, so padding changes nothing), then an answer window of W positions: the response tokens,
``<|eot_id|>``, and ``<|endoftext|>`` up to W. Examples with the same (prompt bucket, W) share a batch, so
padding stays small (the probe lost 53 % of its positions to one fixed layout).

W is the smallest window that fits most of the time, but 20 % of examples get 128 (the engine's default
canvas) and 15 % any fitting window, so that a short reply on a long canvas is in distribution at inference.
Measured on the mixture: bucketing alone leaves 18 % of positions as padding (the probe's single layout:
53 %); the long-canvas shares raise that to about 40 %, the price of answering well at any gen length.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import numpy as np

from . import data
from .bpe import EOS, EOT, render_prompt

PROMPT_QUANTUM = 16
WINDOWS = (16, 32, 48, 64, 96, 128, 256)  # multiples of 16 keep the attention length aligned
MAX_PROMPT = 256


@dataclass
class WindowPolicy:
    """Which answer window (canvas) an example gets: the model must stop well on any canvas it may be given.

    A share goes to ``long_window`` (the engine's default gen length), a share to any fitting window drawn
    uniformly, the rest to the smallest window that fits (least padding). A model trained only on
    smallest-fit windows answers in garbage on a longer canvas (measured on the first tiny-cpu: 0 %).
    """

    p_long: float = 0.2
    p_any: float = 0.15
    long_window: int = 128
    windows: tuple[int, ...] = WINDOWS

    def pick(self, rng: random.Random, need: int) -> int | None:
        fitting = [w for w in self.windows if w >= need]
        if not fitting:
            return None
        u = rng.random()
        if u < self.p_long and self.long_window in fitting:
            return self.long_window
        if u < self.p_long + self.p_any:
            return rng.choice(fitting)
        return fitting[0]


@dataclass
class Bucket:
    prompts: np.ndarray  # [n, P] int16, left-padded with EOS
    answers: np.ndarray  # [n, W] int16: response, EOT, EOS padding
    prompt_lens: np.ndarray  # [n] int16 real prompt tokens
    families: np.ndarray  # [n] uint8 index into data.FAMILIES


@dataclass
class Pool:
    buckets: dict[tuple[int, int], Bucket] = field(default_factory=dict)

    @property
    def n_examples(self) -> int:
        return sum(len(b.answers) for b in self.buckets.values())

    def padding_share(self, eos_id: int) -> float:
        """Share of all positions that are prompt padding or answer padding (EOS after the EOT)."""
        total = pad = 0
        for (p, w), b in self.buckets.items():
            total += len(b.answers) * (p + w)
            pad += int((p - b.prompt_lens.astype(np.int64)).sum()) + int((b.answers == eos_id).sum())
        return pad / max(total, 1)


def encode_examples(tokenizer, examples, rng: random.Random, policy: WindowPolicy, eos_id: int, eot_id: int):
    """Encode and group examples by (prompt bucket, window). Returns {key: list of rows}."""
    prompts = tokenizer.encode_batch([render_prompt(e.messages) for e in examples])
    answers = tokenizer.encode_batch([e.response for e in examples])
    grouped: dict[tuple[int, int], list] = {}
    for example, prompt, answer in zip(examples, prompts, answers):
        ids = answer.ids + [eot_id]
        window = policy.pick(rng, len(ids))
        p_len = len(prompt.ids)
        if window is None or p_len > MAX_PROMPT:
            continue  # never happens with the shipped generators; kept so a new task cannot crash a run
        p_bucket = -(-p_len // PROMPT_QUANTUM) * PROMPT_QUANTUM
        row_p = [eos_id] * (p_bucket - p_len) + prompt.ids
        row_a = ids + [eos_id] * (window - len(ids))
        grouped.setdefault((p_bucket, window), []).append((row_p, row_a, p_len, data.FAMILIES.index(example.family)))
    return grouped


def _to_bucket(rows) -> Bucket:
    return Bucket(
        prompts=np.asarray([r[0] for r in rows], dtype=np.int16),
        answers=np.asarray([r[1] for r in rows], dtype=np.int16),
        prompt_lens=np.asarray([r[2] for r in rows], dtype=np.int16),
        families=np.asarray([r[3] for r in rows], dtype=np.uint8),
    )


def _worker(args) -> dict[tuple[int, int], Bucket]:
    tokenizer_json, seed, count, mix_items, policy = args
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    eos_id, eot_id = tokenizer.token_to_id(EOS), tokenizer.token_to_id(EOT)
    rng = random.Random(seed)
    mix = dict(mix_items)  # (family, weight) pairs
    grouped: dict[tuple[int, int], list] = {}
    for start in range(0, count, 4096):
        chunk = [data.sample(rng, "train", rng.choices(list(mix), list(mix.values()))[0])
                 for _ in range(min(4096, count - start))]
        for key, rows in encode_examples(tokenizer, chunk, rng, policy, eos_id, eot_id).items():
            grouped.setdefault(key, []).extend(rows)
    return {key: _to_bucket(rows) for key, rows in grouped.items()}


class PoolStream:
    """Shards of the pool generated by worker processes while training runs.

    Workers are forked when the stream is created, which must happen before CUDA is initialised (a forked
    child of a CUDA process is unsafe); they stay idle until ``start()``, so that torch.compile can have the
    CPUs first (on the H200 a compile under 14 busy workers took 91 s). ``ready()`` returns the shards finished
    since the last call without waiting, so the training loop can poll it every few steps;
    ``ready(block=True)`` waits for at least one.
    """

    def __init__(self, tokenizer, n_examples: int, seed: int, workers: int = 1, mix: dict | None = None,
                 policy: WindowPolicy = WindowPolicy(), shard_size: int = 25_000):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # processes, not tokenizer threads, do the work
        n_shards = max(1, -(-n_examples // shard_size))
        sizes = [n_examples // n_shards + (i < n_examples % n_shards) for i in range(n_shards)]
        mix = mix or data.TRAIN_MIX  # {family: weight}, as data.parse_mix gives it
        self.jobs = [(tokenizer.to_str(), seed * 100_003 + i, size, tuple(mix.items()), policy)
                     for i, size in enumerate(sizes) if size]
        self.procs = None
        if workers > 1:
            import multiprocessing as mp

            self.procs = mp.get_context("fork").Pool(workers)
        self.pending = list(self.jobs)
        self.started = False
        self.delivered = 0

    def start(self):
        if not self.started and self.procs is not None:
            self.pending = [self.procs.apply_async(_worker, (job,)) for job in self.jobs]
        self.started = True

    @property
    def done(self) -> bool:
        return not self.pending

    def ready(self, block: bool = False) -> list[dict[tuple[int, int], Bucket]]:
        self.start()
        if self.procs is None:  # in-process: everything at once, on the first call
            parts, self.pending = [_worker(job) for job in self.pending], []
        else:
            parts = [r.get() for r in self.pending if r.ready()]  # (in submission order when several are done)
            self.pending = [r for r in self.pending if not r.ready()]
            if block and not parts and self.pending:
                parts.append(self.pending.pop(0).get())
            if not self.pending:
                self.close()
        self.delivered += len(parts)
        return parts

    def close(self):
        if self.procs is not None:
            self.procs.terminate()
            self.procs = None

