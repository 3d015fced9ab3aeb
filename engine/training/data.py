"""The chat data of the bundled tiny model: a mixture of checkable task families, and their checkers.

Families (each a module ``tasks_*.py``):
* ``word``      3-5-operation word problems with worked steps, held out by whole templates;
* ``arith``     direct questions: 2-digit and 3-digit addition, 3-digit subtraction, the times table;
* ``lists``     sort, reverse, count, largest, second largest;
* ``multi``     several valid answers with dependent tokens (different numbers, permutations, sums);
* ``multiturn`` follow-ups on the previous answer ("now double it");
* ``chat``      templated small talk;
* ``everyday``  arithmetic as people type it: + - × ÷, 1-3-digit operands, symbols or words (tasks_everyday);
* ``everyday_word``  one- and two-step word problems in everyday wording (tasks_everyday_word);
* ``everyday_lists`` list and counting requests in free phrasing (tasks_everyday_lists);
* ``everyday_chat``  greetings and questions about itself in free phrasing (tasks_scope);
* ``out_of_scope``   facts, code, stories, other languages...: one reply that says what it can do (tasks_scope).

``sample(rng, "train")`` draws a training conversation; ``test_set(family, n)`` returns a fixed, seeded list of
held-out items; ``check(example, text)`` says whether a reply is correct (any valid one for ``multi``).
"""
from __future__ import annotations

import random

from . import (tasks_arith, tasks_chat, tasks_everyday, tasks_everyday_lists, tasks_everyday_word, tasks_lists,
               tasks_multi, tasks_scope, tasks_word)
from .tasks_base import Example, Generator, assistant

GENERATORS: dict[str, Generator] = {}
CHECKERS = {}
for _module in (tasks_word, tasks_arith, tasks_lists, tasks_multi, tasks_chat, tasks_everyday, tasks_everyday_word,
                tasks_everyday_lists, tasks_scope):
    GENERATORS.update(_module.GENERATORS)
    CHECKERS.update(_module.CHECKERS)

OLD_FAMILIES = ("word", "arith", "lists", "multi", "multiturn", "chat")
EVERYDAY_FAMILIES = ("everyday", "everyday_word", "everyday_lists", "everyday_chat", "out_of_scope")
FAMILIES = OLD_FAMILIES + EVERYDAY_FAMILIES  # the order is the pool's family index: append only
# Shares of training conversations. Word problems get the most because their chains are the slowest to
# learn (the probe's last family to saturate) and their answers are the longest; multi-answer items get more
# than their length asks for, because the exclusion they teach is a weak signal (see tasks_multi).
# The everyday families take 40 % of the conversations but far less of the positions (their answers are one
# or two short lines); the old families keep 60 % as replay, so a warm start learns the new forms without
# forgetting the old targets. everyday gets the most of the new share: its multiplications and divisions are
# new skills, the rest mostly new phrasings of trained ones.
TRAIN_MIX = {"word": 0.30, "arith": 0.02, "lists": 0.04, "multi": 0.18, "multiturn": 0.04, "chat": 0.02,
             "everyday": 0.18, "everyday_word": 0.10, "everyday_lists": 0.04, "everyday_chat": 0.03,
             "out_of_scope": 0.05}
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are Flash Tiny, a small diffusion language model.",
                  "Answer briefly and show your steps.", "You are a friendly math tutor."]
SYSTEM_RATE = 0.1  # share of conversations that open with a system message (the template supports it)
# Training only: a share of the everyday conversations come as the second turn of a chat, after an exchange
# of another family, so the model answers the last question whatever came before (an out-of-scope question
# asked after a sum must still get the out-of-scope reply, not more arithmetic). Test items stay single-turn.
FOLLOW_UP_RATE = 0.2
EARLIER_TURN_FAMILIES = ("everyday", "everyday_chat", "everyday_lists", "out_of_scope", "arith", "chat", "lists")
TEST_SEED = 20261202


def parse_mix(spec: str) -> dict[str, float]:
    """``"word,multi"`` or ``"word:0.5,multi:0.3"`` -> {family: weight}; a bare name takes its TRAIN_MIX weight."""
    mix = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, weight = item.partition(":")
        if name not in TRAIN_MIX:
            raise ValueError(f"unknown task family {name!r} (known: {', '.join(FAMILIES)})")
        mix[name] = float(weight) if weight else TRAIN_MIX[name]
        if not mix[name] > 0:
            raise ValueError(f"family {name!r} needs a positive weight, not {weight}")
    if not mix:
        raise ValueError("no task family given")
    return mix


def sample(rng: random.Random, split: str = "train", family: str | None = None) -> Example:
    family = family or rng.choices(list(TRAIN_MIX), list(TRAIN_MIX.values()))[0]
    example = GENERATORS[family](rng, split)
    if split == "train" and family in EVERYDAY_FAMILIES and rng.random() < FOLLOW_UP_RATE:
        earlier = GENERATORS[rng.choice(EARLIER_TURN_FAMILIES)](rng, split)
        example.messages[:0] = [*earlier.messages, assistant(earlier.response)]
    if rng.random() < SYSTEM_RATE:
        example.messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    return example


def check(example: Example, text: str) -> bool:
    return CHECKERS[example.family](example, text)


def prompt_key(example: Example) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in example.messages)


def test_set(family: str, n: int, seed: int = TEST_SEED) -> list[Example]:
    """``n`` held-out items of one family, the same on every machine and run.

    Prompts are distinct where the family has enough of them; the small ones (chat) repeat prompts.
    """
    rng = random.Random(f"{seed}-{family}")
    items, seen = [], set()
    for _ in range(n * 20):
        if len(items) == n:
            break
        example = sample(rng, "test", family)
        key = prompt_key(example)
        if key not in seen:
            seen.add(key)
            items.append(example)
    while len(items) < n:
        items.append(sample(rng, "test", family))
    return items
