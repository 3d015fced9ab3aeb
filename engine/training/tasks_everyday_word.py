"""Everyday word problems: one or two steps, small numbers, the wording people use.

    "Tom has 3 apples and buys 5 more. How many apples does he have?"  ->  "3 + 5 = 8. The answer is 8."

Two kinds of problem:
* *stories*: an opening ("Tom has 3 apples", "There are 12 cookies in the jar") and one or two events,
  joined the ways people write them ("... and buys 5 more.", "He buys 5 more.", "Then he eats 2."), then a
  question; each event adds or takes away;
* *one-liners* for × and ÷ ("A box holds 6 eggs. How many eggs are in 4 boxes?", "Share 20 cookies
  equally among 4 friends...").

The reply lists each step as ``a op b = c.`` and ends with ``The answer is N.`` (the old word family's last
line), so it is short and checkable.

Held out by template and by numbers: the joins and the events form a Latin square (every join and every
event is trained, ~1 in 4 of their pairings is test-only), a quarter of the questions and of the one-liner
templates are test-only; a test story has at least one held-out part and nothing else, a training story
none. The numbers of a test item are a hash-held-out tuple as well. No word of a test prompt is new to
training (a test checks that).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .tasks_base import Example, held_out, retry, user

PEOPLE = {"Tom": "he", "Sam": "he", "Ben": "he", "Leo": "he", "Max": "he", "Jack": "he", "Omar": "he",
          "Ravi": "he", "Anna": "she", "Mia": "she", "Lily": "she", "Emma": "she", "Sara": "she", "Zoe": "she",
          "Nina": "she", "Rosa": "she"}
OBJECT_WORDS = ["apples", "cookies", "marbles", "pencils", "stickers", "cards", "books", "candies", "eggs",
                "balloons", "coins", "toys", "oranges", "cupcakes", "flowers", "shells"]
PLACES = {"box": "boxes", "jar": "jars", "bag": "bags", "basket": "baskets", "bowl": "bowls"}


@dataclass(frozen=True)
class Event:
    """A verb phrase with its subject left out: ``{x}`` is its number, ``{M}`` another person."""

    text: str  # present tense
    past: str
    sign: int  # +1 adds to the count, -1 takes away
    scene: str  # "own" (a person's things) or "place" (things in a container)


EVENTS = [
    Event("buys {x} more", "bought {x} more", 1, "own"), Event("gets {x} more", "got {x} more", 1, "own"),
    Event("finds {x} more", "found {x} more", 1, "own"), Event("wins {x} more", "won {x} more", 1, "own"),
    Event("gets {x} more from {M}", "got {x} more from {M}", 1, "own"),
    Event("eats {x}", "ate {x}", -1, "own"), Event("gives {x} to {M}", "gave {x} to {M}", -1, "own"),
    Event("loses {x}", "lost {x}", -1, "own"), Event("gives away {x}", "gave away {x}", -1, "own"),
    Event("sells {x}", "sold {x}", -1, "own"),
    Event("puts in {x} more", "put in {x} more", 1, "place"), Event("adds {x} more", "added {x} more", 1, "place"),
    Event("takes out {x}", "took out {x}", -1, "place"), Event("takes {x}", "took {x}", -1, "place"),
    Event("eats {x} of them", "ate {x} of them", -1, "place"),
]
OPENINGS = {"own": ["{N} has {a} {obj}", "{N} had {a} {obj}"],
            "place": ["There are {a} {obj} in the {place}", "There were {a} {obj} in the {place}"]}
# How an event follows the sentence before it: {S} subject as a sentence start, {s} mid-sentence.
JOINS = ["{prev} and {ev}.", "{prev}. {S} {ev}.", "{prev}. Then {s} {ev}.", "{prev}, then {s} {ev}.",
         "{prev}. After that {s} {ev}."]
QUESTIONS = {"own": ["How many {obj} does {s} have?", "How many {obj} does {s} have now?",
                     "How many {obj} does {N} have left?", "How many does {s} have now?",
                     "How many {obj} are left?", "how many {obj} does {N} have now"],
             "place": ["How many {obj} are in the {place} now?", "How many {obj} are left in the {place}?",
                       "How many {obj} are there now?", "How many are in the {place} now?"]}
ONE_LINERS = {  # (operation, template); {g} groups, {k} per group, the answer is g * k or a / k
    "mul": ["A {place} holds {k} {obj}. How many {obj} are in {g} {places}?",
            "{N} buys {g} {places} of {obj} with {k} {obj} in each {place}. How many {obj} does {s} have?",
            "There are {g} {places} with {k} {obj} in each. How many {obj} are there?",
            "{N} has {g} {places}. Each {place} has {k} {obj}. How many {obj} does {s} have?",
            "One {place} has {k} {obj}. How many {obj} are in {g} {places}?",
            "{N} gets {k} {obj} each day for {g} days. How many {obj} does {s} get?"],
    "div": ["{N} shares {a} {obj} equally among {k} friends. How many {obj} does each friend get?",
            "{N} puts {a} {obj} into {k} {places} equally. How many {obj} are in each {place}?",
            "There are {a} {obj} in {k} equal {places}. How many {obj} are in each {place}?",
            "{a} {obj} are shared equally by {k} friends. How many {obj} does each friend get?",
            "{N} has {a} {obj} and puts them into {k} {places} equally. How many are in each {place}?",
            "{N} splits {a} {obj} into {k} equal {places}. How many {obj} are in each {place}?"],
}
# Training only (the test split never draws them, so the held-out items stay the same): the other person as
# people name them ("gives 5 to her friend", where {M} is otherwise a name; "friend" must not read as sharing)
# and "left" asked with a pronoun ("How many candies does she have left?").
TRAIN_ONLY_OTHERS = ["{pos} friend", "a friend", "{pos} sister", "{pos} brother", "{pos} mom", "{pos} dad",
                     "{pos} teacher", "a classmate", "{pos} neighbour", "{pos} cousin"]
TRAIN_ONLY_QUESTIONS = {"own": ["How many {obj} does {s} have left?", "How many does {s} have left?",
                                "how many {obj} does {s} have left now", "How many {obj} are left now?"],
                        "place": ["How many {obj} are left?", "How many are left in the {place}?"]}
# Training only: more sentences for the one-line multiplications and divisions, so that "each", "every" and
# "equally" are read as the operation in sentences beyond the six of ONE_LINERS (whose held-out ones start "There
# are": the trained ones rarely do, and the model answered them as stories). None is a held-out sentence.
TRAIN_ONLY_ONE_LINERS = {
    "mul": ["There are {g} {places} and each {place} has {k} {obj}. How many {obj} are there in all?",
            "{g} {places} each hold {k} {obj}. How many {obj} altogether?",
            "There are {g} {places}. Every {place} has {k} {obj} in it. How many {obj} in total?",
            "If each of {g} {places} has {k} {obj}, how many {obj} are there?",
            "{N} sees {g} {places} with {k} {obj} inside each one. How many {obj} does {s} see?"],
    "div": ["There are {a} {obj}, split evenly into {k} {places}. How many {obj} go in each {place}?",
            "{a} {obj} are packed into {k} {places} with the same number in each. How many {obj} are in one {place}?",
            "There are {a} {obj} for {k} {places}, the same in every {place}. How many {obj} does each {place} get?",
            "{N} divides {a} {obj} between {k} {places}. How many {obj} are in each {place}?"],
}
TRAIN_ONLY_ONE_LINER_SHARE = 0.4  # of training one-liners
TRAIN_ONLY_SHARE = 0.3  # of training stories: another person as a relation; a question from TRAIN_ONLY_QUESTIONS
POSSESSIVE = {"he": "his", "she": "her"}
SQUARE_PERIOD = 4
ONE_LINER_SHARE = 0.3
TWO_STEP_SHARE = 0.5
MAX_START = 50


def join_held_out(join: int, event: int) -> bool:
    return (join + event) % SQUARE_PERIOD == 0


def question_held_out(scene: str, index: int) -> bool:
    return index % 4 == 1


def one_liner_held_out(op: str, index: int) -> bool:
    return index % 4 == 2


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _story(rng: random.Random, train_only: bool = False):
    """train_only: the training split's extra phrasings may replace the other person and the question (the
    test split passes False and draws exactly the random numbers it always did)."""
    scene = rng.choice(["own", "own", "place"])
    name, other = rng.sample(list(PEOPLE), 2)
    pronoun = PEOPLE[name]
    place = rng.choice(list(PLACES))
    slots = dict(N=name, M=other, obj=rng.choice(OBJECT_WORDS), place=place, places=PLACES[place])
    if train_only and rng.random() < TRAIN_ONLY_SHARE:
        slots["M"] = rng.choice(TRAIN_ONLY_OTHERS).format(pos=POSSESSIVE[pronoun])
    past = rng.random() < 0.4
    count = rng.randint(2, MAX_START) if rng.random() < 0.8 else rng.randint(2, 20)
    opening = rng.choice([o for o in OPENINGS[scene] if ("had" in o or "were" in o) == past])
    text, held, numbers = opening.format(a=count, **slots), False, [count]
    lines, value = [], count
    subject = name if scene == "own" else rng.choice([n for n in PEOPLE if n != other])
    s = pronoun if scene == "own" else subject
    for index in range(rng.choices([1, 2], [1 - TWO_STEP_SHARE, TWO_STEP_SHARE])[0]):
        choices = [i for i, e in enumerate(EVENTS) if e.scene == scene]
        event_index = rng.choice(choices)
        event = EVENTS[event_index]
        if event.sign < 0 and value < 2:
            return None
        x = rng.randint(1, value - 1) if event.sign < 0 else rng.randint(1, 20)
        join = rng.randrange(len(JOINS))
        if scene == "place" and index == 0 and join == 0:
            join = 1  # "There are 5 cookies in the jar and takes 2" has no subject
        held |= join_held_out(join, event_index)
        phrase = (event.past if past else event.text).format(x=x, **slots)
        first = s if scene == "own" else subject
        text = JOINS[join].format(prev=text.rstrip("."), ev=phrase, S=_capital(first), s=first)
        new = value + event.sign * x
        lines.append(f"{value} {'+' if event.sign > 0 else '-'} {x} = {new}.")
        value = new
        numbers.append(x)
    # "left" asks what remains: only after something was taken away
    q_index = rng.choice([i for i, q in enumerate(QUESTIONS[scene]) if " left" not in q or event.sign < 0])
    held |= question_held_out(scene, q_index)
    question = QUESTIONS[scene][q_index]
    if train_only and event.sign < 0 and rng.random() < TRAIN_ONLY_SHARE:
        question = rng.choice(TRAIN_ONLY_QUESTIONS[scene])
    question = question.format(s=pronoun if scene == "own" else s, **slots)
    return f"{text} {_capital(question) if rng.random() < 0.8 else question}", lines, value, held, numbers


def _one_liner(rng: random.Random, train_only: bool = False):
    """train_only: the training split may draw a sentence of TRAIN_ONLY_ONE_LINERS (the test split passes False
    and draws exactly the random numbers it always did)."""
    op = rng.choice(["mul", "div"])
    index = rng.randrange(len(ONE_LINERS[op]))
    name = rng.choice(list(PEOPLE))
    place = rng.choice(list(PLACES))
    slots = dict(N=name, s=PEOPLE[name], obj=rng.choice(OBJECT_WORDS), place=place, places=PLACES[place])
    k, g = rng.randint(2, 12), rng.randint(2, 10)
    template, held = ONE_LINERS[op][index], one_liner_held_out(op, index)
    if train_only and rng.random() < TRAIN_ONLY_ONE_LINER_SHARE:
        template, held = rng.choice(TRAIN_ONLY_ONE_LINERS[op]), False
    if op == "mul":
        text = template.format(k=k, g=g, **slots)
        lines, value, numbers = [f"{g} × {k} = {g * k}."], g * k, [g, k]
    else:
        text = template.format(a=g * k, k=k, **slots)
        lines, value, numbers = [f"{g * k} ÷ {k} = {g}."], g, [g * k, k]
    return _capital(text), lines, value, held, numbers


def everyday_word_problem(rng: random.Random, split: str) -> Example:
    test = split == "test"

    def make():
        kind = "one_liner" if rng.random() < ONE_LINER_SHARE else "story"
        built = _one_liner(rng, train_only=not test) if kind == "one_liner" else _story(rng, train_only=not test)
        if built is None:
            return None
        text, lines, value, held, numbers = built
        if held != test or held_out("everyday_word", *numbers) != test:
            return None
        response = " ".join(lines) + f" The answer is {value}."
        return Example("everyday_word", f"{kind}{len(lines)}", [user(text)], response,
                       {"answer": value, "steps": len(lines)})

    return retry(make, tries=5000)


def check_everyday_word(example: Example, text: str) -> bool:
    return text.strip() == example.response


GENERATORS = {"everyday_word": everyday_word_problem}
CHECKERS = {"everyday_word": check_everyday_word}
