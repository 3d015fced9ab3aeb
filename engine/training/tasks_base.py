"""Shared pieces of the task generators: the Example record, the held-out split rule, small helpers.

Every generator is a function ``(rng, split) -> Example``. ``split`` is "train" or "test"; a generator must
never return a test item for "train" (that is what keeps the evaluation honest), so each family decides its
held-out rule here in one place: a fixed hash of the item's parameters, or a disjoint set of templates.
"""
from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass, field
from typing import Callable

SPLITS = ("train", "test")
HELD_OUT_PERCENT = 10  # share of a numeric parameter space reserved for the test split

COUNT_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


@dataclass
class Example:
    """One chat item: the conversation so far (ending with a user turn) and one valid assistant reply."""

    family: str  # evaluation family (word, arith, lists, multi, multiturn, chat)
    kind: str  # sub-task inside the family; picks the checker
    messages: list[dict[str, str]]  # [{"role": "system"|"user"|"assistant", "content": ...}, ...]
    response: str  # one correct reply (the training target)
    meta: dict = field(default_factory=dict)  # what the checker needs (answer sets, the list, ...)


Generator = Callable[[random.Random, str], Example]
Checker = Callable[[Example, str], bool]


def held_out(*key) -> bool:
    """True for the fixed ~10 % of parameter tuples that only the test split may use."""
    digest = zlib.crc32(repr(key).encode())
    return digest % 100 < HELD_OUT_PERCENT


def in_split(split: str, *key) -> bool:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return held_out(*key) == (split == "test")


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def exact(example: Example, text: str) -> bool:
    return text.strip() == example.response.strip()


def join_list(items) -> str:
    return ", ".join(str(item) for item in items)


def parse_items(text: str) -> list[str]:
    """Items after the last colon, split on commas/spaces, trailing period dropped: "x: 3, 1, 2." -> [3,1,2]."""
    body = text.strip().rsplit(":", 1)[-1].strip().rstrip(".").strip()
    if not body:
        return []
    parts = body.split(",") if "," in body else body.split()
    return [part.strip() for part in parts if part.strip()]


def integers(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text)]


def retry(make: Callable[[], Example | None], tries: int = 1000) -> Example:
    """Rejection sampling: ``make`` returns None when its draw lands in the wrong split or is infeasible."""
    for _ in range(tries):
        example = make()
        if example is not None:
            return example
    raise RuntimeError("generator could not produce an item for this split")
