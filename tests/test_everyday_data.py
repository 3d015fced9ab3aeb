"""The everyday families (issue #22): answers are right, splits never meet, checkers reject wrong replies,
the issue's own prompts are in distribution, and the bundled tokenizer represents every character."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from flash_dllm.engine.training import data, tasks_everyday, tasks_everyday_word, tasks_scope
from flash_dllm.engine.training.tasks_base import held_out

BUNDLED = Path(__file__).resolve().parents[1] / "assets" / "models" / "tiny-chat"
HASHED = ("everyday", "everyday_word", "everyday_lists", "out_of_scope")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "×": lambda a, b: a * b, "÷": lambda a, b: a / b}
LINE = re.compile(r"^(\d+) ([-+×÷]) (\d+) = (-?\d+)\.$")


def _train_prompts(family: str, n: int = 20000) -> set[str]:
    rng = random.Random(f"train-{family}")
    return {data.sample(rng, "train", family).messages[-1]["content"] for _ in range(n)}


@pytest.mark.parametrize("split", ["train", "test"])
def test_everyday_arithmetic_is_right_and_reads_the_prompt(split):
    rng = random.Random(split)
    symbols = set()
    for _ in range(2000):
        example = data.sample(rng, split, "everyday")
        a, op, b, r = LINE.match(example.response).groups()
        assert OPS[op](int(a), int(b)) == int(r)
        assert 1 <= int(a) <= 999 and 1 <= int(b) <= 999
        assert re.findall(r"\d+", example.messages[-1]["content"]) in ([a, b], [b, a])  # the operands asked
        symbols.add(op)
    assert symbols == set(OPS)


def test_everyday_arithmetic_covers_every_typed_form_in_training():
    rng = random.Random(1)
    texts = [data.sample(rng, "train", "everyday").messages[-1]["content"].lower() for _ in range(6000)]
    for needle in ("+", "-", "*", "×", "x", "/", "÷", "plus", "minus", "times", "divided by", "what's",
                   "how much is", "calculate"):
        assert any(needle in t for t in texts), needle
    assert any(re.search(r"\d[*x×/÷+-]\d", t) for t in texts)  # without spaces
    assert any(not t.endswith("?") and t.startswith("what") for t in texts)  # no question mark
    digits = {(len(str(e.meta["a"])), len(str(e.meta["b"])))
              for e in (data.sample(rng, "train", "everyday") for _ in range(3000)) if e.kind == "add"}
    assert digits == {(i, j) for i in (1, 2, 3) for j in (1, 2, 3)}


def test_everyday_test_items_are_held_out_by_numbers_and_by_template():
    for example in data.test_set("everyday", 300):
        assert tasks_everyday.is_held_out_pair(example.kind, example.meta["a"], example.meta["b"])
        frame = example.meta["frame"]
        assert (tasks_everyday.worded_held_out(frame[1]) if frame[0] == "worded"
                else tasks_everyday.template_held_out(*frame))
    rng = random.Random(2)
    for _ in range(3000):
        example = data.sample(rng, "train", "everyday")
        assert not tasks_everyday.is_held_out_pair(example.kind, example.meta["a"], example.meta["b"])
        frame = example.meta["frame"]
        if frame[0] == "worded-train":  # a training-only sentence: never one of the held-out ones
            held = {t for i, (_, t) in enumerate(tasks_everyday.WORDED) if tasks_everyday.worded_held_out(i)}
            assert tasks_everyday.TRAIN_ONLY_WORDED[frame[1]][1] not in held
            continue
        assert not (tasks_everyday.worded_held_out(frame[1]) if frame[0] == "worded"
                    else tasks_everyday.template_held_out(*frame))


def test_training_only_list_phrasings_are_no_test_phrasing():
    """The widened training phrasings of list requests leave every held-out phrasing held out."""
    from flash_dllm.engine.training import tasks_everyday_lists as lists

    tests = {frame.removeprefix("test:") for frames, _ in lists.FRAMES.values() for frame in frames
             if frame.startswith("test:")}
    train_only = {frame for frames in lists.TRAIN_ONLY.values() for frame in frames}
    assert len(tests) == len(lists.FRAMES) and not tests & train_only
    assert not any(frame.startswith("test:") for frame in train_only)


def test_training_only_word_problem_phrasings_stay_out_of_the_test_split():
    """"gives 5 to her friend" and "does she have left" are trained; no test story uses a relation or a
    training-only question, and the training split does."""
    relations = re.compile(r"\b(friend|sister|brother|mom|dad|teacher|classmate|neighbour|cousin)\b")
    for example in data.test_set("everyday_word", 300):
        text = example.messages[-1]["content"]
        assert "equally" in text or not relations.search(text), text
        assert "have left now" not in text.lower()
    rng, seen = random.Random(3), 0
    for _ in range(3000):
        text = data.sample(rng, "train", "everyday_word").messages[-1]["content"]
        seen += bool("equally" not in text and relations.search(text))
    assert seen > 50


def test_training_only_out_of_scope_questions_stay_out_of_the_test_split():
    """Questions with a year in them ("What happened in 1987?") are trained; the test split never draws one."""
    assert all(example.kind != "train_only" for example in data.test_set("out_of_scope", 300))
    rng = random.Random(6)
    drawn = [data.sample(rng, "train", "out_of_scope") for _ in range(400)]
    with_year = [e for e in drawn if e.kind == "train_only" and re.search(r"\b(19|20)\d\d\b", e.messages[-1]["content"])]
    assert with_year and all(e.response == tasks_scope.OUT_OF_SCOPE_REPLY for e in with_year)


@pytest.mark.parametrize("family", HASHED)
def test_no_held_out_prompt_is_ever_a_training_prompt(family):
    train = _train_prompts(family)
    test = [e.messages[-1]["content"] for e in data.test_set(family, 300)]
    assert not set(test) & train


@pytest.mark.parametrize("family", ["everyday", "everyday_word", "everyday_lists"])
def test_held_out_everyday_prompts_use_only_words_seen_in_training(family):
    """By design these held-out templates recombine trained parts (out_of_scope deliberately does not)."""
    seen = set()
    for text in _train_prompts(family, 30000):
        seen |= set(re.findall(r"[a-z']+", text.lower()))
    for example in data.test_set(family, 300):
        words = set(re.findall(r"[a-z']+", example.messages[-1]["content"].lower()))
        assert words <= seen, words - seen


def test_everyday_word_problems_are_right_one_or_two_steps():
    rng = random.Random(4)
    for split in ("train", "test"):
        for _ in range(1000):
            example = data.sample(rng, split, "everyday_word")
            lines = example.response.split(". ")
            steps = [LINE.match(line + ".") for line in lines[:-1]]
            assert all(steps) and 1 <= len(steps) == example.meta["steps"] <= 2, example.response
            value = None
            for step in steps:
                a, op, b, r = step.groups()
                assert value is None or int(a) == value  # each step acts on the previous result
                assert OPS[op](int(a), int(b)) == int(r) and int(r) >= 0
                value = int(r)
            assert example.response.endswith(f"The answer is {value}.") and value == example.meta["answer"]


def test_issue_prompts_are_in_distribution():
    """The prompts of issue #22, numbers, names and objects aside, are what the generators write."""
    people = re.compile(r"\b(" + "|".join(tasks_everyday_word.PEOPLE).lower() + r")\b")
    things = re.compile(r"\b(" + "|".join(tasks_everyday_word.OBJECT_WORDS) + r")\b")

    def shape(text):
        text = re.sub(r"\d+", "N", text.lower().rstrip("?").strip())
        return things.sub("O", people.sub("P", text))

    rng = random.Random(5)
    shapes = set()
    for family in ("everyday", "everyday_word"):
        for split in ("train", "test"):
            shapes |= {shape(data.sample(rng, split, family).messages[-1]["content"]) for _ in range(20000)}
    for prompt in ("What is 8 + 9?", "What is 2+2?", "what's 41 plus 7", "What is 12 * 11?",
                   "Tom has 3 apples and buys 5 more. How many apples does he have?"):
        assert shape(prompt) in shapes, prompt


@pytest.mark.parametrize("family", data.EVERYDAY_FAMILIES)
def test_checkers_reject_wrong_replies(family):
    rng = random.Random(family)
    for _ in range(100):
        example = data.sample(rng, "test", family)
        assert data.check(example, example.response)
        numbers = re.findall(r"\d+", example.response)
        if numbers:
            last = numbers[-1]
            at = example.response.rfind(last)
            wrong = example.response[:at] + str(int(last) + 1) + example.response[at + len(last):]
            assert not data.check(example, wrong), wrong
        assert not data.check(example, "Paris is the capital of France.")
        assert not data.check(example, "")
    declined = data.sample(rng, "test", "out_of_scope")
    assert data.check(declined, tasks_scope.OUT_OF_SCOPE_REPLY)
    assert not data.check(declined, "Sure! Here is a story about a dragon.")


def test_out_of_scope_prompts_never_look_like_in_scope_ones():
    """A declined prompt must not also be an in-scope prompt of another family (the model could not learn both)."""
    declined = _train_prompts("out_of_scope", 5000) | {e.messages[-1]["content"] for e in data.test_set("out_of_scope", 300)}
    rng = random.Random(6)
    for family in (f for f in data.FAMILIES if f != "out_of_scope"):
        for _ in range(2000):
            assert data.sample(rng, "train", family).messages[-1]["content"] not in declined, family


def test_the_mix_trains_every_family_and_keeps_a_replay_share_of_the_old_ones():
    mix = data.parse_mix(",".join(data.FAMILIES))
    assert set(mix) == set(data.FAMILIES) and all(w > 0 for w in mix.values())
    old = sum(mix[f] for f in data.OLD_FAMILIES) / sum(mix.values())
    assert 0.5 <= old <= 0.7
    assert data.FAMILIES[:6] == ("word", "arith", "lists", "multi", "multiturn", "chat")  # pool indices kept


def test_word_number_tuples_of_the_test_split_are_held_out():
    for example in data.test_set("everyday_word", 200):
        numbers = [int(n) for n in re.findall(r"\d+", example.messages[-1]["content"])]
        assert held_out("everyday_word", *numbers)
    assert tasks_everyday_word.join_held_out(0, 0) and not tasks_everyday_word.join_held_out(0, 1)


def test_the_bundled_tokenizer_represents_every_generated_character():
    """Byte-level BPE: new symbols (÷, ×, other scripts) need no new tokens; every text must round-trip."""
    if not (BUNDLED / "tokenizer.json").is_file():
        pytest.fail("the bundled tiny-chat tokenizer is missing")
    from flash_dllm.engine.training import bpe
    from flash_dllm.engine.training.pool import MAX_PROMPT

    tokenizer = bpe.load_backend(BUNDLED)
    rng = random.Random(7)
    for family in data.EVERYDAY_FAMILIES:
        for split in ("train", "test"):
            for _ in range(300):
                example = data.sample(rng, split, family)
                for text in (example.messages[-1]["content"], example.response):
                    assert tokenizer.decode(tokenizer.encode(text).ids) == text
                assert len(tokenizer.encode(bpe.render_prompt(example.messages)).ids) <= MAX_PROMPT


def test_training_draws_the_new_operations_more_often_than_the_test_split():
    rng = random.Random(8)
    train = [data.sample(rng, "train", "everyday").kind for _ in range(4000)]
    test = [e.kind for e in data.test_set("everyday", 400)]
    new_share = {name: sum(k in ("mul", "div") for k in kinds) / len(kinds) for name, kinds in
                 (("train", train), ("test", test))}
    assert new_share["train"] > new_share["test"] + 0.08, new_share
    assert abs(new_share["test"] - 0.5) < 0.08  # the test split weighs the four operations alike


def test_everyday_questions_are_trained_as_follow_ups_too_and_tested_alone():
    """An out-of-scope question after a sum must still get the declining reply: training puts a share of the
    everyday conversations after an earlier exchange; the held-out items stay single-turn."""
    rng = random.Random(9)
    samples = [data.sample(rng, "train", "out_of_scope") for _ in range(600)]
    follow_ups = [e for e in samples if sum(m["role"] == "user" for m in e.messages) == 2]
    assert 0.1 < len(follow_ups) / len(samples) < 0.3
    for example in follow_ups:
        roles = [m["role"] for m in example.messages if m["role"] != "system"]
        assert roles == ["user", "assistant", "user"]
        assert example.response == tasks_scope.OUT_OF_SCOPE_REPLY
        assert example.messages[-1]["content"] not in {m["content"] for m in example.messages[:-1]}
    earlier = {e.messages[-3]["content"] for e in follow_ups}
    assert any(any(ch.isdigit() for ch in text) for text in earlier)  # sums come before declined questions
    for family in data.EVERYDAY_FAMILIES:
        assert all(sum(m["role"] == "user" for m in e.messages) == 1 for e in data.test_set(family, 50))


def test_training_only_sentences_say_the_operation_and_keep_the_reply_format():
    """The training-only sentences are drawn in training alone, and their replies are the usual ``a op b = r.``
    with the operands in the order the sentence means (``Remove 4 from 10`` -> ``10 - 4 = 6.``)."""
    rng = random.Random(10)
    seen = set()
    for _ in range(6000):
        example = data.sample(rng, "train", "everyday")
        frame = example.meta["frame"]
        if frame[0] != "worded-train":
            continue
        seen.add(frame[1])
        a, b = example.meta["a"], example.meta["b"]
        assert example.response == f"{a} {tasks_everyday.SYMBOL[example.kind]} {b} = {example.meta['answer']}."
        op, sentence = tasks_everyday.TRAIN_ONLY_WORDED[frame[1]]
        typed = example.messages[-1]["content"].strip().lower().rstrip("?").rstrip()
        assert op == example.kind and typed == sentence.format(a=a, b=b).lower().rstrip("?")
    assert seen == set(range(len(tasks_everyday.TRAIN_ONLY_WORDED)))
    assert all(e.meta["frame"][0] != "worded-train" for e in data.test_set("everyday", 300))


def test_everyday_checker_accepts_swapped_operands_only_where_they_commute():
    """"Add 2 to 17" -> "17 + 2 = 19." is right; "Take 2 away from 17" -> "2 - 17 = 15." is not."""
    checked = {}
    for example in data.test_set("everyday", 200):
        if example.kind in checked:
            continue
        a, b, answer = example.meta["a"], example.meta["b"], example.meta["answer"]
        if a == b:
            continue
        symbol = tasks_everyday.SYMBOL[example.kind]
        assert data.check(example, example.response) and data.check(example, " " + example.response + "\n")
        swapped = f"{b} {symbol} {a} = {answer}."
        assert data.check(example, swapped) == (example.kind in ("add", "mul")), (example.kind, swapped)
        assert not data.check(example, f"{b} {symbol} {a} = {answer + 1}.")
        assert not data.check(example, f"{a} {symbol} {b} = {answer + 1}.")
        assert not data.check(example, f"{a} {symbol} {b} = {answer}")  # the trained form ends with a full stop
        checked[example.kind] = True
    assert sorted(checked) == ["add", "div", "mul", "sub"]


def _sentence_pattern(sentence: str) -> re.Pattern:
    """A template as a regex: its numbers ({g} {k} {a}) captured, its words ({obj}, {place}, ...) any words."""
    pattern = re.escape(tasks_everyday_word._capital(sentence))
    pattern = re.sub(r"\\\{(g|k|a)\\\}", r"(\\d+)", pattern)
    return re.compile(re.sub(r"\\\{\w+\\\}", r"[\\w ]+", pattern))


def test_training_only_one_liners_are_trained_alone_and_answered_in_the_sentence_order():
    """"There are 4 bags and each bag has 11 pens" is trained (x × y, or x ÷ y for the division sentences, in
    the order the numbers stand); no held-out one-liner is one of them and no test prompt reads as one."""
    word = tasks_everyday_word
    held = {t for op, ts in word.ONE_LINERS.items() for i, t in enumerate(ts) if word.one_liner_held_out(op, i)}
    assert not held & {t for ts in word.TRAIN_ONLY_ONE_LINERS.values() for t in ts}
    patterns = {(op, i): _sentence_pattern(t) for op, ts in word.TRAIN_ONLY_ONE_LINERS.items() for i, t in enumerate(ts)}
    rng, seen = random.Random(12), set()
    for _ in range(6000):
        example = data.sample(rng, "train", "everyday_word")
        for (op, index), pattern in patterns.items():
            match = pattern.fullmatch(example.messages[-1]["content"])
            if match is None:
                continue
            x, y = map(int, match.groups())
            r = x * y if op == "mul" else x // y
            assert op == "mul" or x % y == 0
            assert example.response == f"{x} {'×' if op == 'mul' else '÷'} {y} = {r}. The answer is {r}."
            seen.add((op, index))
    assert seen == set(patterns)
    for example in data.test_set("everyday_word", 300):
        assert not any(p.fullmatch(example.messages[-1]["content"]) for p in patterns.values())


def test_short_digit_lists_and_mathematics_beyond_the_four_operations_are_trained():
    """Training draws lists of small numbers ("sort 5 3 9 1") with right replies, and out-of-scope questions on
    percentages, roots and powers with the "what I can do" reply; the test split draws neither kind."""
    rng = random.Random(13)
    small = 0
    for _ in range(3000):
        example = data.sample(rng, "train", "everyday_lists")
        numbers = [int(n) for n in re.findall(r"\d+", example.messages[-1]["content"])]
        if example.kind.startswith("sort") and numbers and max(numbers) <= 20:
            small += 1
            reply = example.response.split(": ", 1)[1].rstrip(".")
            got = [int(n) for n in re.findall(r"\d+", reply)]
            assert got == sorted(numbers, reverse=example.kind == "sort_down"), example
    assert small > 30
    rng = random.Random(14)
    drawn = [data.sample(rng, "train", "out_of_scope") for _ in range(3000)]
    beyond_four = re.compile(r"%|\^|sqrt|square root|squared|power of")
    beyond = [e for e in drawn if beyond_four.search(e.messages[-1]["content"])]
    assert len(beyond) > 20 and all(e.response == tasks_scope.OUT_OF_SCOPE_REPLY for e in beyond)
    test_texts = [e.messages[-1]["content"] for e in data.test_set("out_of_scope", 300)]
    assert not any(beyond_four.search(t) for t in test_texts)


def test_follow_ups_are_trained_after_everyday_questions_and_typed_casually():
    """"What is 8 + 9?" then "now double it" is trained (the reply acts on the everyday answer); the test split
    keeps its old first questions and capitalised follow-ups."""
    from flash_dllm.engine.training import tasks_arith

    old_first = re.compile(r"^(\d+) ([-+×]) (\d+) = \?$|^(What is|Compute|Calculate|How much is|Add|Subtract|Multiply)")
    greetings = {hello for hello, _ in tasks_arith.GREETING_TURN}
    rng, everyday_first, casual = random.Random(15), 0, 0
    for _ in range(2000):
        example = data.sample(rng, "train", "multiturn")
        turns = [m for m in example.messages if m["role"] != "system"]
        if turns[0]["content"] in greetings:  # a greeting first
            turns = turns[2:]
        first_line = LINE.match(turns[1]["content"])
        assert first_line, turns[1]
        value = int(first_line.group(4))
        for question, answer in zip(turns[2::2], [*turns[3::2], {"content": example.response}]):
            step = LINE.match(answer["content"])
            assert step and int(step.group(1)) == value  # each follow-up acts on the previous answer
            value = int(step.group(4))
            casual += question["content"][:1].islower() and not question["content"].endswith(".")
        everyday_first += not old_first.match(turns[0]["content"])
    assert everyday_first > 200 and casual > 200
    for example in data.test_set("multiturn", 300):
        asked = [m["content"] for m in example.messages if m["role"] == "user" and m["content"] not in greetings]
        assert old_first.match(asked[0]), asked
        assert all(q[:1].isupper() and q.endswith((".", "?")) for q in asked[1:]), asked
