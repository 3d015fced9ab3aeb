"""List tasks: sort (both ways), reverse, count, largest, second largest. Held out by a hash of the list."""
from __future__ import annotations

import random

from .tasks_base import Example, exact, in_split, join_list, retry, user

WORDS = ["cat", "sun", "tree", "book", "lamp", "rain", "ship", "moon", "bird", "door", "fish", "star", "cake",
         "road", "milk", "hat", "key", "cup", "bell", "leaf"]

FRAMES = {
    "sort_up": (["Sort these numbers from smallest to largest: {items}.", "Put these numbers in increasing order: {items}.",
                 "Sort in ascending order: {items}."], "From smallest to largest: {out}."),
    "sort_down": (["Sort these numbers from largest to smallest: {items}.", "Put these numbers in decreasing order: {items}.",
                   "Sort in descending order: {items}."], "From largest to smallest: {out}."),
    "reverse": (["Reverse this list: {items}.", "Write this list backwards: {items}.",
                 "What is this list in reverse order: {items}?"], "Reversed: {out}."),
    "count": (["How many items are in this list: {items}?", "Count the items in this list: {items}.",
               "How many things are in this list: {items}?"], "There are {out} items in the list."),
    "largest": (["What is the largest number in this list: {items}?", "Which number is the biggest: {items}?",
                 "Find the largest number: {items}."], "The largest number is {out}."),
    "second": (["What is the second largest number in this list: {items}?",
                "Which number is the second biggest: {items}?", "Find the second largest number: {items}."],
               "The second largest number is {out}."),
}
KIND_WEIGHTS = {"sort_up": 3, "sort_down": 2, "reverse": 2, "count": 1.5, "largest": 1.5, "second": 2}


def _numbers(rng: random.Random, n: int) -> list[int]:
    high = 99 if rng.random() < 0.6 else 999  # mostly two digits, some three
    return rng.sample(range(1, high + 1), n)


def list_task(rng: random.Random, split: str, kind: str | None = None) -> Example:
    kind = kind or rng.choices(list(KIND_WEIGHTS), list(KIND_WEIGHTS.values()))[0]
    questions, answer = FRAMES[kind]

    def make():
        if kind == "count":
            n = rng.randint(2, 12)
            items = rng.sample(WORDS, n) if rng.random() < 0.5 else _numbers(rng, n)
            out = n
        elif kind == "reverse":
            n = rng.randint(3, 8)
            items = rng.sample(WORDS, n) if rng.random() < 0.3 else _numbers(rng, n)
            out = join_list(items[::-1])
        else:
            items = _numbers(rng, rng.randint(4, 8))
            ordered = sorted(items, reverse=kind != "sort_up")
            out = {"sort_up": join_list(ordered), "sort_down": join_list(ordered),
                   "largest": ordered[0], "second": ordered[1]}[kind]
        if not in_split(split, kind, tuple(items)):
            return None
        text = rng.choice(questions).format(items=join_list(items))
        return Example("lists", kind, [user(text)], answer.format(out=out), {"items": items})

    return retry(make)


GENERATORS = {"lists": list_task}
CHECKERS = {"lists": exact}
