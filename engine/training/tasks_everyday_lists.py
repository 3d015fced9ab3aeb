"""List and counting requests in free phrasing: "sort 5 3 9 1", "whats the biggest of 4, 9 and 2",
"count from 3 to 8", "how many words: cat dog sun".

Replies are the old list family's lines ("From smallest to largest: 1, 3, 5, 9.") plus two new ones
("The smallest number is 1.", "Counting: 3, 4, 5, 6, 7, 8."). Items are typed with commas, spaces or
"and". Held out by template (a quarter of each kind's phrasings is test-only) and by items (a hash of the
kind and the items, as in the old list family); counting requests ("count from 3 to 8") by template only.
"""
from __future__ import annotations

import random

from .tasks_base import Example, in_split, join_list, retry, user
from .tasks_lists import WORDS

# kind -> (phrasings, reply); "test:" marks a test-only phrasing
FRAMES = {
    "sort_up": (["sort {items}", "sort these: {items}", "can you sort {items}", "put {items} in order",
                 "order these numbers {items}", "test:sort {items} please", "arrange {items} from small to big",
                 "sort {items} smallest first"], "From smallest to largest: {out}."),
    "sort_down": (["sort {items} from biggest to smallest", "put {items} in order, largest first",
                   "test:sort these from big to small: {items}", "order {items} from largest to smallest"],
                  "From largest to smallest: {out}."),
    "largest": (["which is biggest: {items}", "whats the largest of {items}", "biggest number in {items}?",
                 "test:which number is largest, {items}", "what is the max of {items}",
                 "which of these is the biggest {items}"], "The largest number is {out}."),
    "smallest": (["which is smallest: {items}", "whats the smallest of {items}", "smallest number in {items}?",
                  "test:which number is smallest, {items}", "what is the min of {items}",
                  "which of these is the smallest {items}"], "The smallest number is {out}."),
    "reverse": (["reverse {items}", "reverse this: {items}", "please reverse {items}", "test:can you reverse {items}",
                 "write {items} backwards"], "Reversed: {out}."),
    "count": (["how many items: {items}", "count these: {items}", "how many words are there: {items}",
               "test:count the items {items}", "how many things in {items}?",
               "how many numbers are there: {items}"], "There are {out} items in the list."),
    "count_to": (["count from {a} to {b}", "count to {b}", "can you count from {a} to {b}?",
                  "test:please count from {a} to {b}", "list the numbers from {a} to {b}",
                  "count up from {a} to {b}"], "Counting: {out}."),
}
# Training only: more phrasings of each request, so that the kind is read from its words ("big to small",
# "largest", "count") in whatever sentence they stand. None is a test phrasing of FRAMES; the test split never
# draws from here, so the held-out items stay the same.
TRAIN_ONLY = {
    "sort_up": ["sort {items} from smallest to biggest", "sort {items} from low to high",
                "sort these from small to big: {items}", "order these from smallest to largest: {items}",
                "put these in order: {items}", "sort {items} in ascending order", "sort the numbers {items}",
                "sort {items} for me", "sort these please: {items}", "could you sort {items}"],
    "sort_down": ["sort {items} from high to low", "sort these from largest to smallest: {items}",
                  "sort these from biggest to smallest: {items}", "sort {items} biggest first",
                  "arrange {items} from big to small", "sort {items} in descending order",
                  "put these in order from largest to smallest: {items}", "sort {items} from big to small please",
                  "can you sort {items} from largest to smallest", "sort these, largest first: {items}"],
    "largest": ["which number is biggest: {items}", "which number is the largest in {items}",
                "find the largest number: {items}", "what is the biggest number, {items}", "largest of {items}?",
                "which is the greatest: {items}", "tell me the largest of {items}"],
    "smallest": ["which number is lowest: {items}", "which number is the smallest in {items}",
                 "find the smallest number: {items}", "what is the lowest number, {items}", "smallest of {items}?",
                 "which is the least: {items}", "tell me the smallest of {items}"],
    "reverse": ["can you write {items} backwards", "reverse the list {items}", "please write {items} in reverse",
                "reverse the order of {items}", "reverse these please: {items}"],
    "count": ["how many are there: {items}", "count how many: {items}", "how many items are in {items}",
              "count these items please: {items}"],
    "count_to": ["please count to {b}", "count from {a} up to {b}", "count {a} to {b}", "can you count to {b} please",
                 "could you count from {a} to {b}"],
}
TRAIN_ONLY_SHARE = 0.5  # of training items: a phrasing from TRAIN_ONLY instead of FRAMES
# Training only: lists of single digits and small numbers ("sort 5 3 9 1"), which the 1-99 draw gives almost
# never all at once, so that short digit lists are read one number per item.
SMALL_NUMBER_SHARE = 0.2
KIND_WEIGHTS = {"sort_up": 2, "sort_down": 1, "largest": 1.5, "smallest": 1.5, "reverse": 1, "count": 1.5,
                "count_to": 1.5}


def _typed(rng: random.Random, items) -> str:
    """Items as people type them: "3, 1, 2", "3 1 2" or "3, 1 and 2"."""
    style = rng.random()
    words = [str(item) for item in items]
    if style < 0.4:
        return ", ".join(words)
    if style < 0.75:
        return " ".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def everyday_list(rng: random.Random, split: str) -> Example:
    kind = rng.choices(list(KIND_WEIGHTS), list(KIND_WEIGHTS.values()))[0]
    frames, reply = FRAMES[kind]
    test = split == "test"

    def make():
        if not test and rng.random() < TRAIN_ONLY_SHARE:
            frame = rng.choice(TRAIN_ONLY[kind])
        else:
            frame = rng.choice(frames)
        if frame.startswith("test:") != test:
            return None
        frame = frame.removeprefix("test:")
        if kind == "count_to":
            a = 1 if "{a}" not in frame else rng.randint(1, 30)
            b = rng.randint(a + 2, a + 12)
            items = list(range(a, b + 1))
            text, key = frame.format(a=a, b=b), (a, b)
            out = join_list(items)
        else:
            n = rng.randint(3, 8)
            if kind in ("count", "reverse") and rng.random() < 0.4:
                items = rng.sample(WORDS, n)
            elif not test and rng.random() < SMALL_NUMBER_SHARE:
                n = min(n, 6)
                items = rng.sample(range(0, 10 if rng.random() < 0.6 else 21), n)
            else:
                items = rng.sample(range(1, 100 if rng.random() < 0.7 else 1000), n)
            ordered = sorted(items, reverse=kind != "sort_up") if kind.startswith("sort") else items
            out = {"sort_up": join_list(ordered), "sort_down": join_list(ordered), "reverse": join_list(items[::-1]),
                   "largest": max(items) if kind == "largest" else None, "smallest": min(items) if kind == "smallest" else None,
                   "count": n}[kind]
            text, key = frame.format(items=_typed(rng, items)), tuple(items)
        if not in_split(split, "everyday_lists", kind, key) and kind != "count_to":
            return None
        if rng.random() < 0.3:
            text = text[:1].upper() + text[1:]
        response = reply.format(out=out)
        return Example("everyday_lists", kind, [user(text)], response, {"valid": [response], "items": items})

    return retry(make, tries=5000)


def check_everyday_list(example: Example, text: str) -> bool:
    return text.strip() == example.response


GENERATORS = {"everyday_lists": everyday_list}
CHECKERS = {"everyday_lists": check_everyday_list}
