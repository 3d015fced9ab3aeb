"""The API's pure parts: the committed prefix of an out-of-order answer, stop strings, the request parser."""
from __future__ import annotations

import random

import pytest

from flash_dllm.app.api_keys import api_key_for
from flash_dllm.app.openai_request import ApiError, block_length_for, parse_chat_request
from flash_dllm.app.openai_stream import CommittedPrefix, TextStream, partial_stop, returned_tokens, stop_at
from flash_dllm.engine import GenerationSettings, validate

USER = [{"role": "user", "content": "hi"}]


def body(**fields) -> dict:
    return {"model": "m", "messages": USER, **fields}


# ---------------------------------------------------------------------------- committed prefix
def test_the_prefix_grows_only_when_its_first_cells_are_all_committed():
    prefix = CommittedPrefix(6)
    assert not prefix.apply([2, 4], [12, 14], None) and prefix.length == 0
    assert prefix.apply([0], [10], None) and prefix.token_ids() == [10]
    assert prefix.apply([1], [11], None) and prefix.token_ids() == [10, 11, 12]
    assert not prefix.complete
    # the end token lands on cell 3: the answer is cells 0-2, and cell 4 (committed earlier) is padding
    assert not prefix.apply([3], [99], 4) and prefix.complete and prefix.token_ids() == [10, 11, 12]


def test_under_the_official_end_rule_the_prefix_ends_at_the_first_end_token():
    """No padding follows the end token (cells after it decode on, also into ordinary tokens): the answer ends
    where the first end token committed, and a later, earlier end token moves the end back."""
    prefix = CommittedPrefix(6, end_tokens=frozenset({99, 98}))
    assert prefix.apply([0, 4, 5], [10, 99, 7], None) and prefix.token_ids() == [10] and not prefix.complete
    assert prefix.apply([1, 3], [11, 5], None) and prefix.token_ids() == [10, 11]
    assert not prefix.apply([2], [98], None) and prefix.complete and prefix.token_ids() == [10, 11]


def test_any_commit_order_gives_the_same_final_prefix():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 40)
        tokens = [rng.randrange(1000) for _ in range(n)]
        order = list(range(n))
        rng.shuffle(order)
        prefix, seen = CommittedPrefix(n), []
        while order:
            k = rng.randint(1, 4)
            step, order = order[:k], order[k:]
            prefix.apply(step, [tokens[c] for c in step], None)
            seen.append(prefix.token_ids())
        assert prefix.complete and prefix.token_ids() == tokens
        assert all(b[:len(a)] == a for a, b in zip(seen, seen[1:]))  # never taken back


# ---------------------------------------------------------------------------- text and stop strings
def test_stop_helpers():
    assert stop_at("abc END def", ["END", "c E"]) == 2
    assert stop_at("abc", ["x"]) is None
    assert partial_stop("hello EN", ["END"]) == 2 and partial_stop("hello", ["END"]) == 0
    assert partial_stop("xab", ["abc", "bz"]) == 2


def test_text_stream_sends_each_part_once_holding_back_possible_stops_and_broken_characters():
    stream = TextStream(["###"])
    assert stream.update("Hello") == "Hello"
    assert stream.update("Hello wor\ufffd") == " wor"  # an incomplete character waits for its next byte
    assert stream.update("Hello world #") == "ld "  # "#" may start the stop string
    assert stream.update("Hello world #!") == "#!"
    assert stream.update("Hello world #! ##") == " "
    assert stream.update("Hello world #! ### more") == "" and stream.stopped
    assert stream.sent == "Hello world #! "
    assert stream.update("Hello world #! ### more and more", final=True) == ""


def test_text_stream_final_text_flushes_what_was_held_back():
    stream = TextStream(["STOP"])
    assert stream.update("ab ST") == "ab "
    assert stream.update("ab ST", final=True) == "ST" and not stream.stopped
    assert stream.sent == "ab ST"


def test_streamed_parts_join_to_the_final_text_for_random_prefixes():
    rng = random.Random(1)
    for _ in range(100):
        final = "".join(rng.choice("ab #\ufffdxy") for _ in range(rng.randint(0, 30)))
        stops = [rng.choice(["#", "ab", "# x", "yy"])]
        stream, parts = TextStream(stops), []
        for cut in sorted(rng.sample(range(len(final) + 1), min(5, len(final) + 1))):
            parts.append(stream.update(final[:cut]))
        parts.append(stream.update(final, final=True))
        at = stop_at(final, stops)
        assert "".join(parts) == (final if at is None else final[:at])


# ---------------------------------------------------------------------------- requests
def test_block_length_divides_the_answer_length_and_never_changes_it():
    assert block_length_for(128, 32) == 32
    assert block_length_for(100, 32) == 25
    assert block_length_for(10, 32) == 10
    assert block_length_for(97, 32) == 97  # prime: one block rather than 97 blocks of one token
    for n in range(1, 400):
        block = block_length_for(n, 32)
        settings = parse_chat_request(body(max_tokens=n)).settings
        assert n % block == 0 and settings.gen_length == n and settings.block_length == block
        validate(settings)


def test_top_p_filters_method_dream_and_one_filters_nothing():
    """Dream's published sampling is temperature 0.2 with top-p 0.95: the API passes top_p on to method dream."""
    dream = parse_chat_request(body(method="dream", temperature=0.2, top_p=0.95, top_k=20)).settings
    assert (dream.method, dream.temperature, dream.top_p, dream.top_k) == ("dream", 0.2, 0.95, 20)
    for method in ("dream", "flash-cache"):  # OpenAI's neutral value passes with any method and filters nothing
        assert parse_chat_request(body(method=method, top_p=1)).settings.top_p is None


def test_a_request_becomes_engine_settings():
    chat = parse_chat_request(body(max_tokens=48, temperature=0.5, seed=7, stop="\n\n", method="fast-dllm",
                                   threshold=0.8, gamma=0.7, window=8, stream=True,
                                   stream_options={"include_usage": True}, n=1, top_p=1, user="me",
                                   messages=[{"role": "developer", "content": "Be brief."},
                                             {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                          {"type": "text", "text": "b"}]}]))
    s = chat.settings
    assert (s.gen_length, s.block_length, s.temperature, s.seed, s.method, s.threshold, s.gamma, s.window) == \
        (48, 24, 0.5, 7, "fast-dllm", 0.8, 0.7, 8)
    assert chat.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"}]
    assert chat.stop == ["\n\n"] and chat.stream and chat.include_usage
    defaults = parse_chat_request(body()).settings
    assert defaults.temperature == 0 and defaults.gen_length == GenerationSettings().gen_length
    seeds = {parse_chat_request(body(temperature=1.0)).settings.seed for _ in range(5)}
    assert len(seeds) > 1  # sampled requests without a seed differ


@pytest.mark.parametrize("fields, param, words", [
    (dict(model=None), "model", "model is required"),
    (dict(messages=None), "messages", "messages is required"),
    (dict(messages="hi"), "messages", "non-empty list"),
    (dict(messages=[{"role": "tool", "content": "x"}]), "messages[0].role", "not supported"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content", "text parts"),
    (dict(messages=[{"role": "user", "content": "\ud800"}]), "messages[0].content", "surrogate"),
    (dict(max_tokens=0), "max_tokens", "at least 1"),
    (dict(max_tokens="64"), "max_tokens", "integer"),
    (dict(max_tokens=True), "max_tokens", "integer"),
    (dict(max_tokens=100, block_length=32), "max_tokens", "96 or 128"),
    (dict(max_tokens=64, max_completion_tokens=32), "max_completion_tokens", "differ"),
    (dict(temperature=-1), "temperature", "temperature must be"),
    (dict(temperature=float("nan")), "temperature", "finite"),
    (dict(method="beam"), "method", "unknown method"),
    (dict(threshold=2), "threshold", "threshold must be in"),
    (dict(gamma=0), "gamma", "gamma must be"),
    (dict(window=0), "window", "window must be"),
    (dict(seed=-1), "seed", "seed must be"),
    (dict(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
    (dict(stop=[""]), "stop", "empty"),
    (dict(stream="yes"), "stream", "true or false"),
    (dict(stream_options={"include_usage": True}), "stream_options", "only allowed"),
    (dict(n=0), "n", "n must be between 1 and 8"),
    (dict(n=2.5), "n", "integer"),
    (dict(top_p=0.5), "top_p", "top p filters method dream's sampling only; method flash-cache"),
    (dict(top_k=4), "top_k", "top k filters method dream's"),
    (dict(method="dream", top_p=0), "top_p", "top p must be in (0, 1]"),
    (dict(tools=[{"type": "function"}]), "tools", "not supported"),
    (dict(tools=[{"type": "function", "function": {"name": "lookup", "parameters": {}}}]), "tools",
     "tools (a list of 1) is not supported"),
    (dict(treshold=0.5), "treshold", "Unrecognized"),
])
def test_bad_fields_are_refused_by_name(fields, param, words):
    with pytest.raises(ApiError) as refused:
        parse_chat_request({k: v for k, v in body(**fields).items() if v is not None})
    error = refused.value
    assert error.status == 400 and error.param == param and words in error.message, error.body()
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_api_keys_given_from_the_environment_or_generated_when_shared():
    assert api_key_for(None, shared=False, environ={}) == (None, False)
    assert api_key_for("k1", shared=False, environ={"FLASH_DLLM_API_KEY": "k2"}) == ("k1", False)
    assert api_key_for(None, shared=True, environ={"FLASH_DLLM_API_KEY": "k2"}) == ("k2", False)
    assert api_key_for(None, shared=False, environ={"FLASH_DLLM_API_KEY": ""}) == (None, False)
    key, generated = api_key_for(None, shared=True, environ={})
    assert generated and len(key) >= 24 and key != api_key_for(None, shared=True, environ={})[0]
    with pytest.raises(ValueError, match="empty"):
        api_key_for("  ", shared=False, environ={})


# ---------------------------------------------------------------------------- the answer loop, on scripted events
class ScriptedCall:
    """An EngineCall stand-in: scripted StepEvents, then a done request with ``final_text``."""

    def __init__(self, steps: list[tuple[list[int], int | None]], tokens: list[int], final_text: str):
        from flash_dllm.engine import GenerationResult, StepEvent

        # cumulative counters as the engine sends them: one forward pass and 0.1 s a step
        self.pending = [StepEvent(seq=0, step=i, committed=cells, tokens=[tokens[c] for c in cells],
                                  padding_from=end, forward_passes=i + 1, elapsed_s=0.1 * (i + 1))
                        for i, (cells, end) in enumerate(steps)]
        self.closed = False
        self.kernels = "torch"
        result = GenerationResult(text=final_text, token_ids=tokens, forward_passes=len(steps), steps=len(steps),
                                  elapsed_s=0.1, tokens_per_s=1.0, method="flash-cache", model="m",
                                  finish_reason="length", prompt_tokens=3)
        self.request = type("Done", (), {"prompt_tokens": 3, "done": False})()
        self.final = result

        class Events:
            def empty(inner):
                return not self.pending
        self.events = Events()

    async def next_event(self, timeout):
        if not self.pending:
            self.request.done = True
            return None
        return self.pending.pop(0)

    def close(self):
        self.closed = True

    def result(self):
        return self.final


def letters(ids: list[int]) -> str:
    """A tokenizer of one letter a token: 0 is "a", 1 "b", ..."""
    return "".join(chr(ord("a") + t) for t in ids)


def pairs(ids: list[int]) -> str:
    """A tokenizer of two letters a token: 0 is "ab", 1 "cd", ... (a stop string may start inside a token)."""
    return "".join(letters([2 * t, 2 * t + 1]) for t in ids)


def run_answer(call, stops=(), gen_length=5, decode=letters) -> list:
    import asyncio

    from flash_dllm.app.openai_call import answer
    from flash_dllm.app.openai_request import ChatRequest

    chat = ChatRequest("m", USER, GenerationSettings(gen_length=gen_length, block_length=gen_length), list(stops))

    async def collect():
        return [item async for item in answer(call, chat, decode, 0.01)]
    return asyncio.run(collect())


def test_the_answer_loop_sends_the_committed_prefix_only_in_order():
    from flash_dllm.app.openai_call import Outcome

    call = ScriptedCall([([2], None), ([0], None), ([1, 4], None), ([3], None)], [0, 1, 2, 3, 4], "abcde")
    items = [item for item in run_answer(call) if item != ""]
    assert items[:-1] == ["a", "bc", "de"] and not call.closed
    assert items[-1] == Outcome("length", 3, 5, items[-1].engine)


def test_the_answer_loop_stops_at_a_stop_string_and_cancels_the_request():
    call = ScriptedCall([([0, 1], None), ([2], None), ([3], None), ([4], None)], [0, 1, 2, 3, 4], "abcde")
    items = [item for item in run_answer(call, stops=["cd"]) if item != ""]
    assert items[:-1] == ["ab"] and items[-1].finish_reason == "stop" and call.closed
    assert call.pending  # the rest of the answer was never waited for
    # no result (the request was cancelled): the numbers come from the last step's counters, in the shape a
    # finished answer's have; the 2 tokens returned ("ab": the stop string "cd" is not) in 3 steps of one
    # forward pass each, 0.3 s
    assert items[-1].completion_tokens == 2
    assert items[-1].engine == {"method": GenerationSettings().method, "steps": 3, "forward_passes": 3,
                                "tokens_per_forward": 0.667, "tokens_per_s": 6.667, "elapsed_s": 0.3,
                                "kernels": "torch"}
    finished = [item for item in run_answer(ScriptedCall([([0, 1, 2, 3, 4], None)], [0, 1, 2, 3, 4], "abcde"))
                if item != ""][-1]
    assert set(finished.engine) == set(items[-1].engine)


def test_the_answer_loop_ends_at_the_end_token():
    # the end token lands on cell 2 in step 1: cells 3-4 (committed in step 0) are padding, never text
    call = ScriptedCall([([3, 4], None), ([0, 2], 3), ([1], None)], [0, 1, 7, 3, 4], "ab")
    call.final.finish_reason, call.final.token_ids = "eos", [0, 1]
    items = [item for item in run_answer(call) if item != ""]
    assert items[:-1] == ["a", "b"] and items[-1].finish_reason == "stop" and items[-1].completion_tokens == 2


def test_a_cut_answer_counts_the_tokens_returned_not_the_cells_committed_after_the_cut():
    # out of order: cells 3-7 commit before cell 2, so when "cd" shows up cells 0-7 are all committed
    call = ScriptedCall([([0, 1, 3, 4, 5, 6, 7], None), ([2], None), ([8], None)], list(range(9)), "abcdefghi")
    items = [item for item in run_answer(call, stops=["cd"], gen_length=9) if item != ""]
    assert items[:-1] == ["ab"] and call.closed
    outcome = items[-1]
    assert outcome.completion_tokens == 2  # "a", "b"; not the 8 committed cells
    assert outcome.engine["tokens_per_forward"] == 1.0 and outcome.engine["tokens_per_s"] == 10.0  # 2 in 2, 0.2 s


def test_a_token_the_stop_string_splits_counts_and_the_stop_strings_own_tokens_do_not():
    # tokens "ab" "cd" "ef" "gh": the stop string "de" starts inside "cd", whose "c" is returned
    call = ScriptedCall([([0, 1, 2, 3], None)], [0, 1, 2, 3], "abcdefgh")
    items = [item for item in run_answer(call, stops=["de"], gen_length=4, decode=pairs) if item != ""]
    assert items[:-1] == ["abc"] and items[-1].completion_tokens == 2
    call = ScriptedCall([([0, 1, 2, 3], None)], [0, 1, 2, 3], "abcdefgh")
    items = [item for item in run_answer(call, stops=["efg"], gen_length=4, decode=pairs) if item != ""]
    assert items[:-1] == ["abcd"] and items[-1].completion_tokens == 2  # "ef", "gh" are the stop and after it


def test_a_stop_string_found_in_the_finished_answer_counts_the_tokens_returned():
    # the events never show the whole answer committed: the stop string is found in the engine's result, whose
    # rates (of all 5 tokens) are redone over the 2 returned
    call = ScriptedCall([([0, 1], None)], [0, 1, 2, 3, 4], "abcde")
    items = [item for item in run_answer(call, stops=["cd"]) if item != ""]
    assert items[:-1] == ["ab"] and items[-1].finish_reason == "stop" and items[-1].completion_tokens == 2
    assert items[-1].engine["tokens_per_forward"] == 2.0 and items[-1].engine["tokens_per_s"] == 20.0


def test_returned_tokens_are_the_fewest_whose_text_begins_with_the_answer():
    ids = [0, 1, 2, 3]  # "ab" "cd" "ef" "gh"
    assert [returned_tokens(ids, text, pairs) for text in ("", "a", "ab", "abc", "abcdefgh")] == [0, 1, 1, 2, 4]
    assert returned_tokens(ids, "xyz", pairs) == 4  # a text the tokens do not make: no fewer to be sure of
