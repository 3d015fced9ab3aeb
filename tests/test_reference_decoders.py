"""The `llada` reference decoder: schedule, block order, EOS handling, batching, chat template, live events."""
import pytest
import torch

import flash_dllm.engine.decode_loop as decode_loop
from flash_dllm.engine.engine import Engine
from flash_dllm.engine.events import CanvasStart, StepEvent
from flash_dllm.engine.model import forward_full, forward_hidden
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.tokenizer import PromptError

PROMPT = "Tell me a story"


def llada(**changes) -> GenerationSettings:
    return GenerationSettings(method="llada").with_overrides(**changes)


def load(folder) -> Engine:
    return Engine.load(str(folder), device="cpu")


def without_end_tokens(engine: Engine) -> Engine:
    """Zero the head rows of EOS and end-of-turn: their logit is 0 while the best of ~300 random logits is
    far above, so no answer ends early and every schedule runs to the last cell."""
    head = engine.model.lm_head.clone()
    head[sorted(engine.tokenizer.end_ids)] = 0.0
    engine.model.lm_head = head
    return engine


def events_of(engine, prompts, settings):
    events = []
    results = engine.generate(prompts, settings, on_event=events.append)
    return results, [e for e in events if isinstance(e, StepEvent)]


@pytest.fixture(params=["llada", "dream"])
def folder(request, tiny_llada, tiny_dream):
    return tiny_llada if request.param == "llada" else tiny_dream


@pytest.mark.parametrize("gen_length,block_length,steps,expected", [
    (16, 8, 6, [3, 3, 2, 3, 3, 2]),  # 8 masks over 3 steps per block: the remainder goes first
    (10, 5, 4, [3, 2, 3, 2]),
    (8, 8, 8, [1] * 8),
])
def test_commit_counts_follow_the_even_schedule(tiny_llada, gen_length, block_length, steps, expected):
    engine = without_end_tokens(load(tiny_llada))
    settings = llada(gen_length=gen_length, block_length=block_length, steps=steps)
    results, steps_seen = events_of(engine, [PROMPT], settings)
    assert [len(e.committed) for e in steps_seen] == expected
    assert results[0].steps == len(expected) and results[0].forward_passes == len(expected)
    assert len(results[0].token_ids) == gen_length and results[0].finish_reason == "length"


def test_each_step_commits_the_most_confident_cells_of_the_current_block(folder):
    """Replay every step with a plain forward: the committed cells are the top-k confidences among the masked
    cells of the current block, with the argmax tokens, and block k+1 starts only when block k is full."""
    engine = without_end_tokens(load(folder))
    block = 4
    results, steps_seen = events_of(engine, [PROMPT], llada(gen_length=12, block_length=block, steps=6))
    prompt = engine.tokenizer.encode(PROMPT)
    mask = engine.model.config.mask_id
    canvas = [None] * 12
    for event in steps_seen:
        first_open = min(c for c in range(12) if canvas[c] is None)
        current = first_open // block
        assert all(c // block == current for c in event.committed), "a cell outside the current block"
        ids = prompt + [mask if t is None else t for t in canvas]
        with torch.no_grad():
            probs = torch.softmax(forward_full(engine.model, torch.tensor([ids]))[0, len(prompt):].double(), -1)
        conf, tokens = probs.max(-1)
        open_cells = [c for c in range(current * block, (current + 1) * block) if canvas[c] is None]
        ranked = sorted(open_cells, key=lambda c: -conf[c].item())
        assert sorted(event.committed) == sorted(ranked[: len(event.committed)])
        for cell, token in zip(event.committed, event.tokens):
            assert token == tokens[cell].item()
            canvas[cell] = token
    assert canvas == results[0].token_ids


def eos_biased(folder) -> tuple[Engine, GenerationSettings]:
    """Raise the end-of-turn row of the head along the mean hidden direction of the answer cells, just enough
    that the answer ends inside the first block after a few real tokens."""
    engine = load(folder)
    settings = llada(gen_length=16, block_length=8, end_rule="stop")
    end_of_turn = max(engine.tokenizer.end_ids - {engine.model.config.eos_id})
    prompt = engine.tokenizer.encode(PROMPT)
    with torch.no_grad():
        ids = torch.tensor([prompt + [engine.model.config.mask_id] * 16])
        direction = forward_hidden(engine.model, ids)[0, len(prompt):].mean(0)
    head = engine.model.lm_head.clone()
    for tenth in range(1, 80):
        engine.model.lm_head = head.clone()
        engine.model.lm_head[end_of_turn] += tenth / 10 * direction / direction.norm()
        result = engine.generate([PROMPT], settings)[0]
        if result.finish_reason == "eos" and 1 <= len(result.token_ids) < 7:
            return engine, settings
    pytest.fail("no bias ends the answer inside the first block")


def test_end_token_stops_the_answer(folder):
    engine, settings = eos_biased(folder)
    results, steps_seen = events_of(engine, [PROMPT], settings)
    result = results[0]
    end = len(result.token_ids)
    assert result.finish_reason == "eos"
    assert not set(result.token_ids) & engine.tokenizer.end_ids, "the end token is part of the answer"
    assert result.text == engine.tokenizer.decode(result.token_ids)
    assert "<|eot_id|>" not in result.text and "<|im_end|>" not in result.text and "<|endoftext|>" not in result.text
    assert [e.padding_from for e in steps_seen if e.padding_from is not None] == [end + 1]
    shown = {c: t for e in steps_seen for c, t in zip(e.committed, e.tokens)}
    assert sorted(shown) == list(range(end + 1)), "padding after the end cell was shown, or a cell is missing"
    assert shown[end] in engine.tokenizer.end_ids  # the canvas marks where the answer ended; the text does not
    assert all(c < settings.block_length for e in steps_seen for c in e.window), "a later block was decoded"
    steps_per_block = settings.total_steps // settings.n_blocks
    assert result.steps == len(steps_seen) <= steps_per_block
    assert result.forward_passes == result.steps


def test_batch_equals_single_runs(folder):
    """Prompts of different lengths (so the batch is left-padded) decode to the same greedy tokens as alone."""
    engine = load(folder)
    prompts = ["Hi", "What is the capital of France? Answer briefly.", "Count: one two three"]
    settings = llada(gen_length=16, block_length=8, steps=8)
    batch = engine.generate(prompts, settings)
    singles = [engine.generate([p], settings)[0] for p in prompts]
    assert [r.token_ids for r in batch] == [r.token_ids for r in singles]
    assert [r.finish_reason for r in batch] == [r.finish_reason for r in singles]
    assert [r.forward_passes for r in batch] == [r.forward_passes for r in singles]


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "And now?"},
]
EXPECTED_TEXT = {
    "llada": "<|startoftext|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nAnd now?<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "dream": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
             "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n",
}


def test_multi_turn_conversation_uses_the_chat_template(folder):
    engine = load(folder)
    family = engine.model.config.family
    expected = engine.tokenizer.tokenizer(EXPECTED_TEXT[family], add_special_tokens=False)["input_ids"]
    assert engine.tokenizer.encode(CONVERSATION) == expected
    gradio_style = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in CONVERSATION]
    with pytest.raises(PromptError, match="must be text"):  # the app flattens Gradio's parts (app/chats.py)
        engine.tokenizer.encode(gradio_style)
    events = []
    result = engine.generate([CONVERSATION], llada(gen_length=8, block_length=8, steps=4), on_event=events.append)[0]
    assert result.prompt_tokens == len(expected)
    start = next(e for e in events if isinstance(e, CanvasStart))
    assert start.prompt_tail == [engine.tokenizer.piece(t) for t in expected[-len(start.prompt_tail):]]


def test_events_arrive_while_decoding(tiny_llada, monkeypatch):
    """The callback for step k runs after forward pass k+1 and before forward pass k+2 starts."""
    engine = load(tiny_llada)
    forwards = []
    real_forward = decode_loop.forward_cached

    def counting_forward(*args, **kwargs):
        forwards.append(1)
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(decode_loop, "forward_cached", counting_forward)
    seen = []
    engine.generate([PROMPT], llada(gen_length=8, block_length=4, steps=8),
                    on_event=lambda e: seen.append((e.step, len(forwards))) if isinstance(e, StepEvent) else None)
    assert seen == [(k, k + 1) for k in range(8)]


def test_fit_conversation_drops_the_oldest_turns_until_the_answer_fits(tiny_llada):
    engine = load(tiny_llada)  # max context 512; the byte tokenizer spends one token per character
    system = {"role": "system", "content": "Be brief."}
    history = []
    for turn in range(6):
        history += [{"role": "user", "content": f"question {turn} " + "x" * 60},
                    {"role": "assistant", "content": f"answer {turn} " + "y" * 60}]
    conversation = [system] + history + [{"role": "user", "content": "last question"}]
    settings = llada(gen_length=256, block_length=32, steps=8)
    fitted, dropped = engine.fit_conversation(conversation, settings)
    assert dropped > 0 and fitted[0] == system and fitted[-1] == conversation[-1]
    assert fitted[1]["role"] == "user" and fitted == [system] + conversation[1 + dropped:]
    assert len(engine.tokenizer.encode(fitted)) + 256 <= 512
    longer = [system] + conversation[dropped:]  # one message more than fitted (its answer)
    assert len(engine.tokenizer.encode(longer)) + 256 > 512
    assert engine.fit_conversation(conversation[-3:], settings) == (conversation[-3:], 0)  # fits: untouched
    engine.generate([fitted], settings.with_overrides(steps=8))  # the trimmed conversation is accepted
