"""What the model is for, and what it is not: free-phrased small talk and the out-of-scope reply.

``everyday_chat``: greetings, thanks, goodbyes and questions about itself as people type them ("hi", "whats
your name", "are you chatgpt", "what can you do") answered with the old chat family's replies, so both
families teach one voice. A quarter of each intent's phrasings are test-only; nothing else is held out (the
space is small and the test measures robustness to phrasing).

``out_of_scope``: facts, code, stories and poems, other languages, opinions and advice, live information,
actions in the world. Every such prompt gets ONE short, friendly reply that says what the model can do
(``OUT_OF_SCOPE_REPLY``), never an attempt. Held out by template and by filler: each topic's frames and
fillers are split, and a test prompt uses a test-only frame or a test-only filler (or is a test-only fixed
prompt), so no test prompt is ever a training prompt. Unlike the arithmetic families, test prompts do
contain words training never saw (a real user's question does too): what is measured is that the model
declines what it was not taught, not that it recombines known parts.
Prompts with numbers are included ("Who won the World Cup in 2018?") so that "has digits" is not a shortcut
to "arithmetic".
"""
from __future__ import annotations

import random

from .tasks_base import Example, retry, user
from .tasks_chat import INTENTS

OUT_OF_SCOPE_REPLY = ("Sorry, I can't help with that. I am a small demo model: I can do small arithmetic, "
                      "lists and short word problems.")

# intent -> (training phrasings, test-only phrasings); replies are the chat family's
CHAT_PHRASINGS = {
    "greeting": (["hi", "hello", "hey", "hi there", "hey there", "hello!!", "hiya", "good morning",
                  "morning", "good afternoon", "hey!", "yo", "hello, anyone there?", "hi :)"],
                 ["hey hey", "hello there!", "good evening!", "hi!!"]),
    "how_are_you": (["how are you", "how are you?", "how r u", "how's it going", "how are things",
                     "how are you today", "you ok?"],
                    ["how are you doing", "how is it going?"]),
    "capabilities": (["what can you do", "what can you do?", "what can u do", "help", "what do you know",
                      "what can I ask you", "what are you for", "how do I use you", "what can you help with",
                      "what are your skills"],
                     ["what can you help me with?", "what should I ask you", "help me"]),
    "identity": (["who are you", "what are you", "whats your name", "what's your name?", "are you a robot",
                  "are you chatgpt", "are you an ai", "who made you", "tell me about you", "introduce yourself"],
                 ["who are you?", "what is your name", "are you a bot?"]),
    "thanks": (["thanks", "thank you", "thx", "ty", "thank you so much", "thanks a lot", "great, thanks!",
                "cool thanks"],
               ["thanks!!", "thank you!", "many thanks"]),
    "goodbye": (["bye", "goodbye", "see you", "see ya", "bye bye", "good night", "cya", "talk later"],
                ["bye!", "see you later", "goodbye!"]),
}


def everyday_chat(rng: random.Random, split: str) -> Example:
    intent = rng.choice(list(CHAT_PHRASINGS))
    train, test = CHAT_PHRASINGS[intent]
    text = rng.choice(test if split == "test" else train)
    if rng.random() < 0.3:
        text = text[:1].upper() + text[1:]
    replies = INTENTS[intent][1]
    return Example("everyday_chat", intent, [user(text)], rng.choice(replies), {"valid": replies})


# topic -> frames (a frame may hold one "{x}" filled from the topic's fillers); "test:" marks test-only
OOS_FRAMES = {
    "fact": ["What is the capital of {x}?", "Who is the president of {x}?", "What language do they speak in {x}?",
             "Tell me about {x}.", "test:Where is {x}?", "test:What is {x} famous for?", "How big is {x}?",
             "What is the population of {x}?"],
    "science": ["Why is the sky blue?", "What is photosynthesis?", "Explain {y}.", "What is {y}?",
                "How does {y} work?", "test:Can you explain {y} to me?", "test:why do cats purr",
                "Who invented the telephone?", "How far away is the moon?", "What is the speed of light?",
                "test:how hot is the sun", "How old is the universe?"],
    "code": ["Write a Python function that {z}.", "How do I {z} in JavaScript?", "write code to {z}",
             "test:Can you write a program that {z}?", "Fix my code: print('hello'", "What does git rebase do?",
             "test:how do I {z} in C++", "Write a SQL query to {z}.", "explain this code: for i in range(10): print(i)",
             "test:What is a pointer in C?"],
    "story": ["Write a long story about {w}.", "Tell me a story about {w}.", "Write a poem about {w}.",
              "test:Write a short story about {w}.", "Write an essay about {w}.", "Tell me a joke.",
              "Write a song about {w}", "test:can you write a poem on {w}", "Make up a fairy tale about {w}."],
    "language": ["Bonjour, comment ça va ?", "¿Cómo estás?", "Wie geht es dir?", "你好，你是谁？", "Ciao, come stai?",
                 "こんにちは、元気ですか？", "Привет, как дела?", "Olá, tudo bem?", "Translate 'good morning' into {v}.",
                 "How do you say thank you in {v}?", "test:Que fais-tu aujourd'hui ?", "test:¿Qué hora es?",
                 "test:Was ist das?", "test:今天天气怎么样？", "test:Translate 'I love you' into {v}.",
                 "Hallo, wer bist du?", "Speak {v} please."],
    "opinion": ["What do you think about {w}?", "Is {w} good or bad?", "test:Do you like {w}?",
                "What is the best movie ever?", "Should I quit my job?", "test:What is the meaning of life?",
                "Give me advice about {u}.", "test:Any tips for {u}?", "Who is the best football player?"],
    "live": ["What's the weather today?", "What time is it?", "What is the news today?",
             "Who won the game last night?", "test:What is the weather in {x} tomorrow?",
             "Who won the World Cup in 2018?", "What happened in 1969?", "test:Who won the election in 2020?",
             "What is the price of bitcoin?", "test:what day is it today"],
    "action": ["Book a flight to {x}.", "Set an alarm for 7 am.", "Send an email to my boss.",
               "Search the web for {w}.", "test:Order a pizza for me.", "Play some music.",
               "test:Call my mom.", "Open my calendar.", "Remind me at 5 pm to call Tom."],
}
OOS_FILLERS = {  # (training fillers, test-only fillers)
    "x": (["France", "Japan", "Brazil", "Canada", "Egypt", "India", "Spain", "Kenya", "Norway", "Mexico"],
          ["Italy", "Peru", "Vietnam"]),
    "y": (["gravity", "electricity", "a black hole", "DNA", "the internet", "a rainbow", "evolution", "magnetism"],
          ["a volcano", "quantum physics"]),
    "z": (["reverse a string", "read a file", "sort a list of names", "parse JSON", "make a web page",
           "connect to a database"], ["send an HTTP request", "draw a circle"]),
    "w": (["a dragon", "the sea", "my cat", "love", "a robot", "winter", "a lost dog", "space travel", "pizza",
           "football"], ["a haunted house", "friendship", "the moon"]),
    "v": (["French", "German", "Spanish", "Chinese", "Japanese"], ["Italian", "Korean"]),
    "u": (["cooking", "dating", "saving money", "learning to drive", "sleep"], ["job interviews", "gardening"]),
    "year": ([str(year) for year in range(1900, 2031)], []),  # TRAIN_ONLY_OOS only
    "n": ([str(n) for n in range(2, 100)], []),  # TRAIN_ONLY_OOS only
}


# Training only (the test split never draws them, so the held-out items stay the same): questions with
# numbers in them that are not sums (a year, a count of people, mathematics it cannot do), and short
# where/when/how-many fact questions, the shapes out-of-scope prompts are most often mistaken for arithmetic or small talk.
TRAIN_ONLY_OOS = [
    "What happened in {year}?", "Who was the president in {year}?", "What was the best song of {year}?",
    "Who won the Olympics in {year}", "What is the biggest city in {x}?", "How many people live in {x}?",
    "Where can I find {x} on a map?", "Where do penguins live?", "Where is the Eiffel Tower?",
    "When did World War 2 end?", "How many moons does Jupiter have?", "How tall is Mount Everest?",
    "How many players are on a football team?", "What is the tallest building in the world?",
    "When was {x} founded?", "Which team won in {year}?", "How old is the king of {x}?", "where is the nearest shop",
    # mathematics beyond its four operations on whole numbers, which it would otherwise answer as a sum
    "What is {n}% of 80?", "what is 25% of {n}", "What is the square root of {n}?", "sqrt {n}", "What is {n} squared?",
    "what is 2 to the power of {n}", "{n}^3", "What is {n}.5 + 1.25?", "What is 0.{n} times 4?",
    "Solve x + {n} = 100", "What is the factorial of {n}?", "Is {n} a prime number?", "What is log of {n}?",
    "What is sin {n}?", "Convert {n} miles to kilometers", "What is {n} in binary?",
]
TRAIN_ONLY_OOS_SHARE = 0.3  # of training out-of-scope items


def _frame_parts(frame: str) -> tuple[str, bool, str | None]:
    test = frame.startswith("test:")
    text = frame[5:] if test else frame
    slot = next((key for key in OOS_FILLERS if "{" + key + "}" in text), None)
    return text, test, slot


def out_of_scope(rng: random.Random, split: str) -> Example:
    test = split == "test"

    def make():
        if not test and rng.random() < TRAIN_ONLY_OOS_SHARE:
            topic, frame = "train_only", rng.choice(TRAIN_ONLY_OOS)
        else:
            topic = rng.choice(list(OOS_FRAMES))
            frame = rng.choice(OOS_FRAMES[topic])
        text, frame_test, slot = _frame_parts(frame)
        filler_test = False
        if slot is not None:
            train_fillers, test_fillers = OOS_FILLERS[slot]
            filler_test = test and rng.random() < 0.5
            text = text.replace("{" + slot + "}", rng.choice(test_fillers if filler_test else train_fillers))
        if (frame_test or filler_test) != test:
            return None
        if rng.random() < 0.3:
            text = text.lower()
        if text.endswith(("?", ".")) and rng.random() < 0.3:
            text = text[:-1]
        return Example("out_of_scope", topic, [user(text)], OUT_OF_SCOPE_REPLY, {"valid": [OUT_OF_SCOPE_REPLY]})

    return retry(make)


def check_valid_reply(example: Example, text: str) -> bool:
    return text.strip() in example.meta["valid"]


GENERATORS = {"everyday_chat": everyday_chat, "out_of_scope": out_of_scope}
CHECKERS = {"everyday_chat": check_valid_reply, "out_of_scope": check_valid_reply}
