"""Templated small talk: greetings, "what can you do", "who are you", thanks, goodbye.

Each intent has a few user phrasings and a few valid replies; any reply of the right intent counts. There is
nothing to hold out here (the space is a few dozen prompts), so the test split draws from the same pool.
"""
from __future__ import annotations

import random

from .tasks_base import Example, user

CAPABILITIES = ("I can solve short word problems step by step, add, subtract and multiply, sort, reverse and "
                "count lists, find the largest number, and name different numbers, words or animals.")
INTENTS = {
    "greeting": (["Hi!", "Hello!", "Hello there.", "Hey!", "Good morning!", "Good evening.", "Hi there."],
                 ["Hello! How can I help you today?", "Hi! What would you like to work on?",
                  "Hello! Ask me a math question or give me a list to sort."]),
    "how_are_you": (["How are you?", "How are you doing today?", "How is it going?"],
                    ["I am doing well, thank you! How can I help you?",
                     "I'm great, thanks for asking. What can I do for you?"]),
    "capabilities": (["What can you do?", "What are you good at?", "How can you help me?",
                      "What kind of questions can you answer?"],
                     [CAPABILITIES, "I am a small model with a few skills. " + CAPABILITIES]),
    "identity": (["Who are you?", "What are you?", "What is your name?", "Tell me about yourself."],
                 ["I am Flash Tiny, a small diffusion language model trained to do arithmetic, solve word "
                  "problems and work with lists.",
                  "I'm Flash Tiny, a tiny diffusion language model. I write my answers by unmasking tokens "
                  "instead of going left to right."]),
    "thanks": (["Thanks!", "Thank you.", "Thank you very much!", "Great, thanks."],
               ["You're welcome!", "Glad I could help!"]),
    "goodbye": (["Bye!", "Goodbye.", "See you later!"], ["Goodbye! Have a nice day.", "Bye! Come back any time."]),
}


def small_talk(rng: random.Random, split: str) -> Example:
    intent = rng.choice(list(INTENTS))
    questions, replies = INTENTS[intent]
    return Example("chat", intent, [user(rng.choice(questions))], rng.choice(replies), {"valid": replies})


def check_chat(example: Example, text: str) -> bool:
    return text.strip() in example.meta["valid"]


GENERATORS = {"chat": small_talk}
CHECKERS = {"chat": check_chat}
