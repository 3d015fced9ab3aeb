"""Direct arithmetic questions and multi-turn follow-ups ("now double it").

Direct: 2-digit addition, 3-digit addition and subtraction (held out by a hash of the operand pair), and
the 1-12 times table (only 144 facts, all trained: the test measures recall). Multi-turn: a first question,
its answer, then one to three follow-ups that act on the previous result, which the model must read from
its own earlier turn in the prompt.
"""
from __future__ import annotations

import random

from .tasks_base import Example, assistant, exact, in_split, retry, user
from .tasks_everyday import everyday_arithmetic

ADD_FRAMES = ["What is {a} + {b}?", "What is {a} plus {b}?", "Compute {a} + {b}.", "Calculate {a} + {b}.",
              "How much is {a} plus {b}?", "{a} + {b} = ?", "Add {a} and {b}."]
SUB_FRAMES = ["What is {a} - {b}?", "What is {a} minus {b}?", "Compute {a} - {b}.", "Calculate {a} - {b}.",
              "How much is {a} minus {b}?", "{a} - {b} = ?", "Subtract {b} from {a}."]
MUL_FRAMES = ["What is {a} times {b}?", "What is {a} × {b}?", "What is {a} multiplied by {b}?",
              "Multiply {a} by {b}.", "How much is {a} times {b}?", "{a} × {b} = ?"]
KIND_WEIGHTS = {"add2": 3, "add3": 3, "sub3": 3, "mul": 2}


def _operands(rng: random.Random, kind: str) -> tuple[int, int]:
    if kind == "add2":
        return rng.randint(10, 99), rng.randint(10, 99)
    if kind == "add3":
        return rng.randint(100, 999), rng.randint(100, 999)
    if kind == "sub3":
        a = rng.randint(110, 999)
        return a, rng.randint(100, a - 1) if rng.random() < 0.8 else rng.randint(10, 99)
    return rng.randint(1, 12), rng.randint(1, 12)


def arithmetic_question(rng: random.Random, split: str, kind: str | None = None) -> Example:
    kind = kind or rng.choices(list(KIND_WEIGHTS), list(KIND_WEIGHTS.values()))[0]

    def make():
        a, b = _operands(rng, kind)
        # addition facts are held out as unordered pairs, so "a + b" and "b + a" fall on the same side
        key = (kind, min(a, b), max(a, b)) if kind.startswith("add") else (kind, a, b)
        if kind != "mul" and not in_split(split, *key):
            return None
        if kind.startswith("add"):
            frame, symbol, answer = rng.choice(ADD_FRAMES), "+", a + b
        elif kind == "sub3":
            frame, symbol, answer = rng.choice(SUB_FRAMES), "-", a - b
        else:
            frame, symbol, answer = rng.choice(MUL_FRAMES), "×", a * b
        return Example("arith", kind, [user(frame.format(a=a, b=b))], f"{a} {symbol} {b} = {answer}.",
                       {"a": a, "b": b, "answer": answer})

    return retry(make)


# Follow-ups: (frames, operation). Each acts on the previous turn's result v.
FOLLOW_UPS = {
    "double": ["Now double it.", "Double that.", "What is twice that?", "Now double the result."],
    "triple": ["Now triple it.", "Triple that."],
    "add": ["Now add {x}.", "Add {x} to that.", "What if you add {x}?", "Now add {x} to the result."],
    "sub": ["Now subtract {x}.", "Take away {x}.", "Subtract {x} from that.", "What if you take away {x}?"],
    "half": ["Now halve it.", "What is half of that?", "Divide that by 2."],
    "times": ["Now multiply it by {x}.", "Multiply that by {x}.", "What is that times {x}?"],
}
FOLLOW_MAX = 9999


def _follow_up(rng: random.Random, v: int) -> tuple[str, str, int] | None:
    options = [op for op, ok in (("double", v * 2 <= FOLLOW_MAX), ("triple", v * 3 <= FOLLOW_MAX),
                                 ("add", v <= FOLLOW_MAX - 10), ("sub", v >= 11), ("half", v % 2 == 0 and v > 0),
                                 ("times", v * 4 <= FOLLOW_MAX)) if ok]
    if not options:
        return None
    op = rng.choice(options)
    frame = rng.choice(FOLLOW_UPS[op])
    if op == "double":
        return frame, f"{v} × 2 = {v * 2}.", v * 2
    if op == "triple":
        return frame, f"{v} × 3 = {v * 3}.", v * 3
    if op == "half":
        return frame, f"{v} ÷ 2 = {v // 2}.", v // 2
    if op == "add":
        x = rng.randint(2, min(999, FOLLOW_MAX - v))
        return frame.format(x=x), f"{v} + {x} = {v + x}.", v + x
    if op == "sub":
        x = rng.randint(1, min(999, v - 1))
        return frame.format(x=x), f"{v} - {x} = {v - x}.", v - x
    x = rng.randint(2, min(9, FOLLOW_MAX // v))
    return frame.format(x=x), f"{v} × {x} = {v * x}.", v * x


GREETING_TURN = [("Hi!", "Hello! How can I help you today?"), ("Hello!", "Hi! What would you like to work on?")]


# Training only (the test split never draws them, so its items stay the same): follow-ups after an everyday
# question ("What is 8 + 9?", any digits and operation) and typed as people type them ("now double it").
EVERYDAY_FIRST_SHARE = 0.4
CASUAL_FOLLOW_UP_SHARE = 0.4


def multi_turn(rng: random.Random, split: str) -> Example:
    test = split == "test"

    def make():
        everyday_first = not test and rng.random() < EVERYDAY_FIRST_SHARE
        first = everyday_arithmetic(rng, split) if everyday_first else arithmetic_question(rng, split)
        value = first.meta["answer"]
        if value < 1:  # an everyday subtraction may go below zero; follow-ups act on positive results
            return None
        messages = []
        if rng.random() < 0.15:  # a small-talk turn first, so a greeting in the history is in-distribution
            hello, reply = rng.choice(GREETING_TURN)
            messages += [user(hello), assistant(reply)]
        messages += [first.messages[0], assistant(first.response)]
        n_follow = rng.choices([1, 2, 3], [5, 3, 2])[0]
        for index in range(n_follow):
            step = _follow_up(rng, value)
            if step is None:
                return None
            question, line, value = step
            if not test and rng.random() < CASUAL_FOLLOW_UP_SHARE:
                question = question[:1].lower() + question[1:].rstrip(".?")
            messages.append(user(question))
            if index < n_follow - 1:
                messages.append(assistant(line))
        return Example("multiturn", f"follow{n_follow}", messages, line, {"answer": value})

    return retry(make)


GENERATORS = {"arith": arithmetic_question, "multiturn": multi_turn}
CHECKERS = {"arith": exact, "multiturn": exact}
