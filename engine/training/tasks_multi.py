"""Tasks with several valid answers whose tokens depend on each other.

"Name three different even numbers between 10 and 40", "give a permutation of the digits 1 2 3 4",
"four different animals", "two numbers that add up to 50". Training targets are drawn uniformly from the
valid answers, so every answer slot's marginal is flat: a decoder that commits several slots from one
forward pass picks them independently and collides ("14, 14, 14"), while one token per step conditions each
slot on the ones already written. The checker accepts any valid answer.

Training also draws *dense* items (``DENSE_SHARE`` of distinct and category items, training split only):
up to six items from a pool barely larger than that. With 16 animals and 4 slots, knowing that "bear" and
"pig" are taken is worth only log(16/14) nats per slot, a signal a small model leaves unlearned (the bundled
model's slots stayed flat, "pig" at 0.074 beside "bear, pig,"); when 5 of 7 are taken the last slots are
nearly determined, and the exclusion it must learn is the same. Category prompts name no range, so their
dense items ask for more: up to ``len(pool) - 2`` of a category, counts seven to twelve spelled out (training
only). Animals (16) kept repeating one ("frog, frog, cat, frog") with six of 16 the most ever asked.
Training also draws two-number sums more often (``TRAIN_KIND_WEIGHTS``): their failures are the second
number off by ten, a subtraction the model gets too little practice at. Held-out items are drawn as before.
"""
from __future__ import annotations

import random
import re

from .tasks_base import COUNT_WORDS, Example, in_split, join_list, parse_items, retry, user

CATEGORIES = {
    "animals": ["cat", "dog", "horse", "cow", "pig", "sheep", "goat", "fox", "wolf", "bear", "lion", "tiger",
                "owl", "duck", "frog", "mouse"],
    "colors": ["red", "blue", "green", "yellow", "orange", "purple", "pink", "brown", "black", "white", "gray"],
    "fruits": ["apple", "banana", "pear", "grape", "orange", "lemon", "peach", "plum", "cherry", "mango",
               "melon", "kiwi"],
    "vegetables": ["carrot", "potato", "onion", "pea", "bean", "corn", "tomato", "pepper", "cabbage", "lettuce"],
    "sports": ["soccer", "tennis", "golf", "hockey", "rugby", "cricket", "baseball", "basketball", "volleyball",
               "swimming"],
    "instruments": ["piano", "guitar", "violin", "drum", "flute", "trumpet", "harp", "cello"],
}
PERM_WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree", "book", "cup", "star", "fish"]
PROPERTIES = {
    "even numbers": lambda v: v % 2 == 0,
    "odd numbers": lambda v: v % 2 == 1,
    "numbers": lambda v: True,
    "multiples of 5": lambda v: v % 5 == 0,
}
DISTINCT_FRAMES = ["Name {n} different {prop} between {lo} and {hi}.", "Give me {n} different {prop} between {lo} and {hi}.",
                   "Write {n} different {prop} that are between {lo} and {hi}."]
CATEGORY_FRAMES = ["Write a list of {n} different {cat}.", "Name {n} different {cat}.", "List {n} {cat}, with no repeats."]
PERM_FRAMES = ["Give a permutation of the digits {d}.", "Write the digits {d} in any order.", "Rearrange the digits {d}."]
WORD_PERM_FRAMES = ["Write these words in any order: {w}.", "Shuffle these words: {w}.", "Put these words in any order: {w}."]
SUM_FRAMES = ["Give two numbers that add up to {n}.", "Name two positive numbers whose sum is {n}.",
              "Write two numbers that sum to {n}."]
DENSE_SHARE = 0.4
KIND_WEIGHTS = {"distinct": 3, "category": 2, "perm_digits": 2, "perm_words": 1, "sum_pair": 2}
TRAIN_KIND_WEIGHTS = {**KIND_WEIGHTS, "sum_pair": 3}
TRAIN_COUNT_WORDS = {**COUNT_WORDS, 7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
SUM_LINE = re.compile(r"^(\d+) \+ (\d+) = (\d+)\.$")


def _distinct(rng, split):
    if split == "train" and rng.random() < DENSE_SHARE:
        return _distinct_dense(rng, split)
    prop = rng.choice(list(PROPERTIES))
    n = rng.randint(2, 5)
    lo = rng.randint(10, 80)
    hi = rng.randint(lo + 10, min(99, lo + 60)) if lo + 10 <= 99 else 99
    pool = [v for v in range(lo + 1, hi) if PROPERTIES[prop](v)]
    if len(pool) < n + 2 or not in_split(split, "distinct", prop, lo, hi, n):
        return None
    return _distinct_example(rng, prop, n, lo, hi, pool)


def _distinct_dense(rng, split):
    """n of 4-6 numbers from a range holding only n + 1 to n + 3 of them."""
    prop = rng.choice(list(PROPERTIES))
    n = rng.randint(4, 6)
    step = {"even numbers": 2, "odd numbers": 2, "numbers": 1, "multiples of 5": 5}[prop]
    lo = rng.randint(10, 80)
    hi = lo + step * (n + rng.randint(1, 3)) + 1
    if hi > 99:
        return None
    pool = [v for v in range(lo + 1, hi) if PROPERTIES[prop](v)]
    if not n + 1 <= len(pool) <= n + 3 or not in_split(split, "distinct", prop, lo, hi, n):
        return None
    return _distinct_example(rng, prop, n, lo, hi, pool)


def _distinct_example(rng, prop, n, lo, hi, pool):
    text = rng.choice(DISTINCT_FRAMES).format(n=COUNT_WORDS[n], prop=prop, lo=lo, hi=hi)
    head = f"{COUNT_WORDS[n].capitalize()} different {prop} between {lo} and {hi}"
    return Example("multi", "distinct", [user(text)], f"{head}: {join_list(rng.sample(pool, n))}.",
                   {"head": head, "n": n, "valid": pool})


def _category(rng, split):
    cat = rng.choice(list(CATEGORIES))
    dense = split == "train" and rng.random() < DENSE_SHARE
    n = rng.randint(4, min(12, len(CATEGORIES[cat]) - 2)) if dense else rng.randint(2, 5)
    # only ~100 distinct prompts exist, so they are shared by both splits; the answers are drawn afresh
    count = TRAIN_COUNT_WORDS[n]
    text = rng.choice(CATEGORY_FRAMES).format(n=count, cat=cat)
    head = f"{count.capitalize()} different {cat}"
    out = rng.sample(CATEGORIES[cat], n)
    return Example("multi", "category", [user(text)], f"{head}: {join_list(out)}.",
                   {"head": head, "n": n, "valid": CATEGORIES[cat]})


def _perm_digits(rng, split):
    digits = rng.sample(range(1, 10), rng.randint(3, 6))
    if not in_split(split, "perm", tuple(sorted(digits))):
        return None
    text = rng.choice(PERM_FRAMES).format(d=" ".join(map(str, digits)))
    head = "Here is one permutation"
    out = rng.sample(digits, len(digits))
    return Example("multi", "perm_digits", [user(text)], f"{head}: {' '.join(map(str, out))}.",
                   {"head": head, "items": sorted(map(str, digits))})


def _perm_words(rng, split):
    words = rng.sample(PERM_WORDS, rng.randint(3, 5))
    if not in_split(split, "words", tuple(sorted(words))):
        return None
    text = rng.choice(WORD_PERM_FRAMES).format(w=join_list(words))
    head = "Here they are"
    out = rng.sample(words, len(words))
    return Example("multi", "perm_words", [user(text)], f"{head}: {join_list(out)}.",
                   {"head": head, "items": sorted(words)})


def _sum_pair(rng, split):
    n = rng.randint(20, 199)
    if not in_split(split, "sum", n):
        return None
    a = rng.randint(1, n - 1)
    return Example("multi", "sum_pair", [user(rng.choice(SUM_FRAMES).format(n=n))], f"{a} + {n - a} = {n}.", {"n": n})


MAKERS = {"distinct": _distinct, "category": _category, "perm_digits": _perm_digits, "perm_words": _perm_words,
          "sum_pair": _sum_pair}


def multi_answer(rng: random.Random, split: str, kind: str | None = None) -> Example:
    weights = TRAIN_KIND_WEIGHTS if split == "train" else KIND_WEIGHTS
    kind = kind or rng.choices(list(weights), list(weights.values()))[0]
    return retry(lambda: MAKERS[kind](rng, split))


def check_multi(example: Example, text: str) -> bool:
    """Any valid answer counts; the wording before the colon must be the trained one."""
    text, meta = text.strip(), example.meta
    if example.kind == "sum_pair":
        match = SUM_LINE.match(text)
        if not match:
            return False
        a, b, total = map(int, match.groups())
        return a >= 1 and b >= 1 and a + b == total == meta["n"]
    if not text.endswith(".") or ":" not in text or text.rsplit(":", 1)[0] != meta["head"]:
        return False
    items = parse_items(text)
    if example.kind in ("perm_digits", "perm_words"):
        return sorted(items) == meta["items"]
    valid = {str(v) for v in meta["valid"]}
    return len(items) == meta["n"] and len(set(items)) == len(items) and all(item in valid for item in items)


GENERATORS = {"multi": multi_answer}
CHECKERS = {"multi": check_multi}
