"""Everyday arithmetic: the forms people actually type ("what's 41 plus 7", "12*11", "what is 8 + 9").

All four operations; operands of one, two and three digits in any mix; symbols ``+ - * × x / ÷`` with and
without spaces, or words (plus, minus, times, multiplied by, divided by, over, take away); openings such as
"what's", "how much is", "calculate", or none; lower case, no question mark, stray spaces.

The reply is always ``a op b = r.`` with the operation normalised to ``+ - × ÷`` (so "12*11" is answered
"12 × 11 = 132."), the format the old arithmetic family already uses.

Ranges (what a 19M model can answer in one line, without a scratchpad):
* addition and subtraction: each operand 1-3 digits; a tenth of subtractions go below zero ("3 - 8 = -5.");
* multiplication: one factor 1-12 and the other 1-999, or both 10-20 ("12 × 11");
* division: exact only. The divisor is 1-12 (or 13-99 for a quarter of items), the quotient at least 1, the
  dividend at most 999; questions with a remainder are not generated (the reply format has no remainder).

Held out two ways, so the reported accuracy is generalisation: by number (a hash of the operation and the
operand pair, the unordered pair for + and ×, reserves ~10 % of pairs for the test split) and by template (a
Latin square over (opening, expression form): every opening and every form is trained, but ~1 in 5 of their
pairings appears only in the test split). A test item is a held-out pair in a held-out pairing; no word of
a test prompt is new to training (a test checks that).
"""
from __future__ import annotations

import random

from .tasks_base import Example, held_out, in_split, retry, user

# Expression forms: (operation, text). "{a}"/"{b}" are the operands as typed.
FORMS = [
    ("add", "{a} + {b}"), ("add", "{a}+{b}"), ("add", "{a} plus {b}"), ("add", "{a} +{b}"),
    ("sub", "{a} - {b}"), ("sub", "{a}-{b}"), ("sub", "{a} minus {b}"), ("sub", "{a} take away {b}"),
    ("mul", "{a} * {b}"), ("mul", "{a}*{b}"), ("mul", "{a} × {b}"), ("mul", "{a}×{b}"), ("mul", "{a} x {b}"),
    ("mul", "{a}x{b}"), ("mul", "{a} times {b}"), ("mul", "{a} multiplied by {b}"),
    ("div", "{a} / {b}"), ("div", "{a}/{b}"), ("div", "{a} ÷ {b}"), ("div", "{a}÷{b}"),
    ("div", "{a} divided by {b}"), ("div", "{a} over {b}"),
]
# Openings around an expression "{e}"; "?" marks where a question mark may go (dropped half of the time).
OPENINGS = [
    "What is {e}?", "What's {e}?", "Whats {e}?", "How much is {e}?", "Calculate {e}", "Compute {e}",
    "{e}", "{e} = ?", "{e} =", "{e}?", "Can you calculate {e}?", "Please calculate {e}", "What is {e} equal to?",
    "Tell me {e}", "Solve {e}", "Quick question: what is {e}?", "Work out {e}", "Hey, what's {e}?",
    "I need {e}", "What do you get for {e}?",
]
# Sentences that name the operation in words (no "{e}"): each is its own opening for the Latin square.
WORDED = [
    ("add", "Add {a} and {b}"), ("add", "What is the sum of {a} and {b}?"), ("add", "Add {a} to {b}"),
    ("sub", "Subtract {b} from {a}"), ("sub", "What is the difference between {a} and {b}?"),
    ("sub", "Take {b} away from {a}"),
    ("mul", "Multiply {a} by {b}"), ("mul", "What is the product of {a} and {b}?"), ("mul", "Multiply {a} and {b}"),
    ("div", "Divide {a} by {b}"), ("div", "What is the quotient of {a} and {b}?"), ("div", "Please divide {a} by {b}"),
]
# Training only: more sentences that name the operation, so that the order of the reply's operands is read from
# the sentence's words ("from", "by", "into" put the second number first) rather than from where the numbers
# stand. None is a held-out sentence of WORDED; they are the phrasings people also type.
TRAIN_ONLY_WORDED = [
    ("add", "Increase {a} by {b}"), ("add", "Sum {a} and {b}"), ("add", "Put {a} and {b} together"),
    ("add", "What is {a} and {b} added together?"),
    ("sub", "Take away {b} from {a}"), ("sub", "Remove {b} from {a}"), ("sub", "Deduct {b} from {a}"),
    ("sub", "Decrease {a} by {b}"), ("sub", "Minus {b} from {a}"), ("sub", "What is left if you take {b} from {a}?"),
    ("mul", "Times {a} by {b}"), ("mul", "Multiply {a} with {b}"), ("mul", "What is {a} lots of {b}?"),
    ("div", "Split {a} into {b} equal parts"), ("div", "How many times does {b} go into {a}?"),
    ("div", "Share {a} between {b}"),
    # The same operations in more sentence shapes: the operand that "from", "off", "onto" or "by" marks is read
    # from the words wherever it stands (the held-out sentences of WORDED are none of these).
    ("add", "Add up {a} and {b}"), ("add", "Add together {a} and {b}"),
    ("add", "Plus {a} and {b}"), ("add", "Total {a} and {b}"), ("add", "What do you get if you add {a} and {b}?"),
    ("add", "Combine {a} and {b}"), ("add", "Put {a} onto {b}"),
    ("sub", "Take {b} off {a}"), ("sub", "Knock {b} off {a}"),
    ("sub", "From {a} take away {b}"), ("sub", "From {a} subtract {b}"), ("sub", "Start at {a} and take away {b}"),
    ("sub", "What is {b} less than {a}?"), ("sub", "Take off {b} from {a}"), ("sub", "Count back {b} from {a}"),
    ("mul", "Multiply {a} times {b}"), ("mul", "Multiply together {a} and {b}"), ("mul", "Find the product of {a} and {b}"),
    ("mul", "What is {a} groups of {b}?"),
    ("div", "Divide {a} into groups of {b}"), ("div", "Share {a} equally between {b}"), ("div", "Find {a} divided by {b}"),
    ("div", "How many groups of {b} are in {a}?"),
]
SYMBOL = {"add": "+", "sub": "-", "mul": "×", "div": "÷"}
OP_WEIGHTS = {"add": 1.0, "sub": 1.0, "mul": 1.0, "div": 1.0}  # the test split: all four alike
# Training only: the bundled model already adds and subtracts up to three digits (the old arith family);
# multiplying beyond the times table and dividing are new to it, so training draws them more often.
TRAIN_OP_WEIGHTS = {"add": 0.6, "sub": 0.8, "mul": 1.3, "div": 1.7}
WORDED_SHARE = 0.15
TRAIN_WORDED_SHARE = 0.3  # training sees sentences twice as often: each is rarer than a symbol form
SQUARE_PERIOD = 5


def template_held_out(opening: int, form: int) -> bool:
    """The Latin square: the (opening, form) pairings only the test split uses."""
    return (opening + form) % SQUARE_PERIOD == 0


def worded_held_out(index: int) -> bool:
    return index % 3 == 2  # one of each operation's three worded sentences


def _digits(rng: random.Random) -> int:
    return rng.choices([1, 2, 3], [3, 4, 3])[0]


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(1 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)


def operands(rng: random.Random, op: str) -> tuple[int, int]:
    """One operand pair in the ranges of the module docstring."""
    if op == "add":
        return _number(rng, _digits(rng)), _number(rng, _digits(rng))
    if op == "sub":
        a, b = _number(rng, _digits(rng)), _number(rng, _digits(rng))
        return (a, b) if a >= b or rng.random() < 0.1 else (b, a)
    if op == "mul":
        if rng.random() < 0.2:
            return rng.randint(10, 20), rng.randint(10, 20)
        small, big = rng.randint(1, 12), _number(rng, _digits(rng))
        return (small, big) if rng.random() < 0.5 else (big, small)
    divisor = rng.randint(13, 99) if rng.random() < 0.25 else rng.randint(1, 12)
    quotient = rng.randint(1, 999 // divisor)
    return divisor * quotient, divisor


def result(op: str, a: int, b: int) -> int:
    return {"add": a + b, "sub": a - b, "mul": a * b, "div": a // b}[op]


def number_key(op: str, a: int, b: int) -> tuple:
    return ("everyday", op, min(a, b), max(a, b)) if op in ("add", "mul") else ("everyday", op, a, b)


def _surface(rng: random.Random, text: str) -> str:
    """How people type: a question mark or not, lower case or not, a stray space."""
    if text.endswith("?") and rng.random() < 0.5:
        text = text[:-1].rstrip()
    if rng.random() < 0.5:
        text = text.lower()
    if rng.random() < 0.05:
        text = text + " "
    return text


def everyday_arithmetic(rng: random.Random, split: str) -> Example:
    test = split == "test"
    weights = OP_WEIGHTS if test else TRAIN_OP_WEIGHTS
    op = rng.choices(list(weights), list(weights.values()))[0]

    def make():
        a, b = operands(rng, op)
        if not in_split(split, *number_key(op, a, b)):
            return None
        if not test and rng.random() < TRAIN_WORDED_SHARE:
            sentences = [("worded", i, t) for i, (o, t) in enumerate(WORDED) if o == op and not worded_held_out(i)]
            sentences += [("worded-train", i, t) for i, (o, t) in enumerate(TRAIN_ONLY_WORDED) if o == op]
            kind, index, sentence = rng.choice(sentences)
            text, frame = sentence.format(a=a, b=b), (kind, index)
        elif test and rng.random() < WORDED_SHARE:
            choices = [i for i, (o, _) in enumerate(WORDED) if o == op]
            index = rng.choice(choices)
            if worded_held_out(index) != test:
                return None
            text, frame = WORDED[index][1].format(a=a, b=b), ("worded", index)
        else:
            form = rng.choice([i for i, (o, _) in enumerate(FORMS) if o == op])
            opening = rng.randrange(len(OPENINGS))
            if template_held_out(opening, form) != test:
                return None
            text, frame = OPENINGS[opening].format(e=FORMS[form][1].format(a=a, b=b)), (opening, form)
        answer = result(op, a, b)
        line = f"{a} {SYMBOL[op]} {b} = {answer}."
        return Example("everyday", op, [user(_surface(rng, text))], line,
                       {"a": a, "b": b, "answer": answer, "frame": frame})

    return retry(make, tries=5000)


def check_everyday(example: Example, text: str) -> bool:
    """The reply line exactly, or, for + and ×, the same line with the operands swapped: "Add 2 to 17" answered
    "17 + 2 = 19." is right (the trained form writes the operands in the order they are named)."""
    reply = text.strip()
    if reply == example.response:
        return True
    if example.kind not in ("add", "mul"):
        return False
    a, b, answer = example.meta["a"], example.meta["b"], example.meta["answer"]
    return reply == f"{b} {SYMBOL[example.kind]} {a} = {answer}."


def is_held_out_pair(op: str, a: int, b: int) -> bool:
    return held_out(*number_key(op, a, b))


GENERATORS = {"everyday": everyday_arithmetic}
CHECKERS = {"everyday": check_everyday}
