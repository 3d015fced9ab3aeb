"""Multi-step word problems (3-5 operations, 2-3-digit numbers) with worked steps.

Held out by *template*: every sentence frame (opening, each event, the question) belongs to either the
training pool or the held-out pool, and a test problem is built from held-out frames only. The held-out
frames reuse the cue words of training frames ("more", "another", "half", "equal", "gives ... to") in new
phrasings, so the mapping sentence -> operation can be generalised but never memorised.

The worked answer never echoes the verb, only the arithmetic ("Then 152 - 35 = 117."): the reply format of a
held-out problem is therefore the same as for a training one, and only the reading of the prompt is new.
Intermediate numbers depend on earlier generated ones, which is what makes these chains sequential.
"""
from __future__ import annotations

import random

from .tasks_base import Example, integers, retry, user

NAMES = [
    "Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Lily", "Max", "Emma", "Noah", "Ella", "Jack", "Ivy", "Ben",
    "Lucy", "Omar", "Nina", "Ravi", "Sara", "Hugo", "Maya", "Finn", "Anna", "Eli", "Rosa", "Kai", "Iris",
    "Dan", "Ruby", "Theo", "Lena", "Adam", "Jade", "Paul", "Nora", "Luis", "Amy", "Ivan", "Kate", "Yuki",
]
OBJECTS = [
    "apples", "marbles", "coins", "stickers", "pencils", "cards", "shells", "stamps", "books", "cookies",
    "balloons", "beads", "buttons", "candies", "crayons", "eggs", "flowers", "nuts", "oranges", "pebbles",
    "pens", "rocks", "seeds", "toys", "tickets", "blocks", "cupcakes", "feathers", "ribbons", "lemons",
]
CONTAINERS = [("boxes", "box"), ("bags", "bag"), ("jars", "jar"), ("baskets", "basket"), ("packs", "pack"),
              ("crates", "crate"), ("bowls", "bowl"), ("trays", "tray")]
PREFIXES = ["", "", "Then ", "Later, ", "Next, ", "After that, "]  # only before frames that start with a name

# (frame, fixed factor or None). Training frames first, held-out frames second in each pair of lists.
ADD = (["{N} buys {x} more {obj}.", "{N} finds {x} more {obj}.", "{M} gives {N} {x} {obj}.",
        "{N} picks up {x} more {obj}.", "{N} gets {x} {obj} from {M}.", "{N} wins {x} {obj} at the fair.",
        "{N} collects {x} more {obj}.", "{N} buys another {x} {obj}.", "{N}'s friend {M} brings {x} more {obj}.",
        "{N} earns {x} more {obj}.", "{M} sends {N} {x} {obj}.", "{N} makes {x} more {obj}."],
       ["{N} finds another {x} {obj} in the garden.", "{M} brings {N} {x} more {obj}.",
        "{N} is given {x} more {obj} by {M}.", "At the shop, {N} buys {x} more {obj}."])
SUB = (["{N} gives {x} {obj} to {M}.", "{N} loses {x} {obj}.", "{N} sells {x} {obj}.", "{N} uses {x} {obj}.",
        "{M} takes {x} {obj} from {N}.", "{N} gives away {x} {obj}.", "{N} throws away {x} {obj}.",
        "{N} lends {x} {obj} to {M}.", "{N} spends {x} {obj}.", "{N} trades away {x} {obj}."],
       ["{N} sells {x} of the {obj} to {M}.", "Sadly, {N} loses {x} of the {obj}.",
        "{N} gives {x} of the {obj} away to {M}.", "{M} takes away {x} of {N}'s {obj}."])
MUL = ([("{N} doubles the number of {obj}.", 2), ("The number of {obj} that {N} has triples.", 3),
        ("{N} now has {k} times as many {obj} as before.", None), ("{N} doubles the {obj}.", 2)],
       [("{N} manages to double the {obj}.", 2), ("Now {N} has {k} times as many {obj}.", None)])
DIV = ([("{N} gives away half of the {obj}.", 2), ("{N} splits the {obj} into {k} equal piles and keeps one pile.", None),
        ("{N} keeps only a third of the {obj}.", 3), ("{N} loses half of the {obj}.", 2)],
       [("{N} divides the {obj} into {k} equal groups and keeps one group.", None), ("{N} sells half of the {obj}.", 2)])
GROUP_ADD = (["{N} buys {k} {cont} with {b} {obj} in each {cont1}.", "{M} gives {N} {k} {cont} of {b} {obj} each.",
              "{N} finds {k} {cont} with {b} {obj} in each."],
             ["{N} picks up {k} {cont}, and each {cont1} holds {b} {obj}."])
GROUP_SUB = (["{N} sells {k} {cont} with {b} {obj} in each {cont1}.", "{N} gives away {k} {cont} of {b} {obj} each."],
             ["{N} packs {k} {cont} with {b} {obj} in each {cont1} and gives them to {M}."])
OPEN = (["{N} has {a} {obj}.", "At first, {N} has {a} {obj}.", "{N} starts with {a} {obj}."],
        ["{N} begins the day with {a} {obj}.", "In the morning, {N} has {a} {obj}."])
OPEN_GROUPS = (["{N} has {k} {cont} with {b} {obj} in each {cont1}.", "{N} has {k} {cont} of {b} {obj} each."],
               ["{N} owns {k} {cont}, and each {cont1} holds {b} {obj}."])
QUESTION = (["How many {obj} does {N} have now?", "How many {obj} does {N} have at the end?",
             "How many {obj} does {N} have left?"],
            ["What is the final number of {obj} that {N} has?", "In the end, how many {obj} does {N} have?"])

OP_WEIGHTS = {"add": 3.0, "sub": 3.0, "mul": 1.0, "div": 1.0, "group_add": 1.2, "group_sub": 1.0}
TRAIN_OP_COUNTS = ([2, 3, 4, 5], [1, 3, 3, 3])  # a few 2-step problems help the chains start to train
TEST_OP_COUNTS = ([3, 4, 5], [1, 1, 1])
MAX_VALUE = 999  # every intermediate result stays within three digits


def frames(split: str) -> set[str]:
    """Every sentence frame of one split (tests check that the two never meet)."""
    index = 1 if split == "test" else 0
    out = set()
    for pair in (ADD, SUB, GROUP_ADD, GROUP_SUB, OPEN, OPEN_GROUPS, QUESTION):
        out.update(pair[index])
    for pair in (MUL, DIV):
        out.update(frame for frame, _ in pair[index])
    return out


def _pool(pair, split):
    return pair[1] if split == "test" else pair[0]


def _sentence(rng: random.Random, frame: str, prefix: bool = True, **slots) -> str:
    slots["used"].append(frame)
    text = frame.format(**slots)
    if prefix and (frame.startswith("{N}") or frame.startswith("{M}")):
        text = rng.choice(PREFIXES) + text
    return text


def _feasible(cur: int, remaining: int) -> list[str]:
    ops = []
    if cur <= MAX_VALUE - 10:
        ops.append("add")
    if cur >= 20:
        ops.append("sub")
    if cur * 2 <= MAX_VALUE:
        ops.append("mul")
    if any(cur % k == 0 and cur // k >= 10 for k in range(2, 10)):
        ops.append("div")
    if remaining >= 2 and cur <= MAX_VALUE - 20:
        ops.append("group_add")
    if remaining >= 2 and cur >= 30:
        ops.append("group_sub")
    return ops


def _step(rng, op, cur, split, slots):
    """Returns (sentence, worked line, new value, operations used) for one event."""
    if op == "add":
        x = rng.randint(10, min(499, MAX_VALUE - cur))
        return _sentence(rng, rng.choice(_pool(ADD, split)), x=x, **slots), f"{cur} + {x} = {cur + x}", cur + x, 1
    if op == "sub":
        x = rng.randint(10, cur - 10)
        return _sentence(rng, rng.choice(_pool(SUB, split)), x=x, **slots), f"{cur} - {x} = {cur - x}", cur - x, 1
    if op == "mul":
        frame, k = rng.choice(_pool(MUL, split))
        k = k or rng.choice([k for k in range(2, 6) if cur * k <= MAX_VALUE] or [2])
        if cur * k > MAX_VALUE:
            return None
        return _sentence(rng, frame, k=k, **slots), f"{cur} × {k} = {cur * k}", cur * k, 1
    if op == "div":
        frame, k = rng.choice(_pool(DIV, split))
        k = k or rng.choice([k for k in range(2, 10) if cur % k == 0 and cur // k >= 10] or [2])
        if cur % k or cur // k < 10:
            return None
        return _sentence(rng, frame, k=k, **slots), f"{cur} ÷ {k} = {cur // k}", cur // k, 1
    room = MAX_VALUE - cur if op == "group_add" else cur - 10
    k = rng.randint(2, 9)
    if room // k < 10:
        return None
    b = rng.randint(10, min(99, room // k))
    p = k * b
    pair = GROUP_ADD if op == "group_add" else GROUP_SUB
    sentence = _sentence(rng, rng.choice(_pool(pair, split)), k=k, b=b, **slots)
    new = cur + p if op == "group_add" else cur - p
    sign = "+" if op == "group_add" else "-"
    return sentence, f"{k} × {b} = {p}, and {cur} {sign} {p} = {new}", new, 2


def word_problem(rng: random.Random, split: str) -> Example:
    counts = TEST_OP_COUNTS if split == "test" else TRAIN_OP_COUNTS
    target = rng.choices(*counts)[0]

    def make():
        name, other = rng.sample(NAMES, 2)
        cont, cont1 = rng.choice(CONTAINERS)
        slots = dict(N=name, M=other, obj=rng.choice(OBJECTS), cont=cont, cont1=cont1, used=[])
        if rng.random() < 0.3:
            k, b = rng.randint(2, 9), rng.randint(10, 60)
            cur, used = k * b, 1
            sentences = [_sentence(rng, rng.choice(_pool(OPEN_GROUPS, split)), False, k=k, b=b, **slots)]
            lines = [f"{name} starts with {k} × {b} = {cur} {slots['obj']}."]
        else:
            cur, used = rng.randint(10, 500), 0
            sentences = [_sentence(rng, rng.choice(_pool(OPEN, split)), False, a=cur, **slots)]
            lines = [f"{name} starts with {cur} {slots['obj']}."]
        while used < target:
            ops = _feasible(cur, target - used)
            if not ops:
                return None
            op = rng.choices(ops, [OP_WEIGHTS[o] for o in ops])[0]
            step = _step(rng, op, cur, split, slots)
            if step is None:
                return None
            sentence, line, cur, n = step
            sentences.append(sentence)
            lines.append(f"Then {line}.")
            used += n
        question = rng.choice(_pool(QUESTION, split))
        slots["used"].append(question)
        sentences.append(question.format(**slots))
        lines.append(f"The answer is {cur}.")
        return Example("word", f"word{used}", [user(" ".join(sentences))], " ".join(lines),
                       {"answer": cur, "ops": used, "frames": slots["used"]})

    return retry(make)


def check_word(example: Example, text: str) -> bool:
    """Exact match of the whole worked answer (the intermediate numbers count too)."""
    return text.strip() == example.response


def final_answer_correct(example: Example, text: str) -> bool:
    """Looser reading used for a second column: the last integer is the answer."""
    numbers = integers(text)
    return bool(numbers) and numbers[-1] == example.meta["answer"]


GENERATORS = {"word": word_problem}
CHECKERS = {"word": check_word}
