"""The API over random weights: on the GPU at LLaDA-8B / Dream-7B geometry (bf16, Triton kernels, CUDA graphs),
on the CPU at a tiny geometry (the same code, so the test is checked where there is no GPU).

16 streaming requests through /v1 at once all finish, each stream's text equal to its engine request's answer
and its usage to the engine's counts. The time to each stream's first text and the aggregate tokens/s, against
the same requests one after another, are printed for the README's benchmark record (the continuous scheduler's
target, 1.5x, is the engine's to meet and is not asserted here)."""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from api_testing import SubmitSpy, openai_client, served_api

from flash_dllm.app.api import ApiConfig
from flash_dllm.app.models import ModelHost
from flash_dllm.engine.config import ModelConfig

pytest.importorskip("openai")  # the dev extra; an image without it skips these tests
ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
TINY = ModelConfig("llada", 64, 2, 4, 4, 16, 128, 300, 1e4, 1e-5, 1024, False, False, 299, 298)


class ByteTokenizer:
    """Text prompts for a random-weight engine: each UTF-8 byte is a token id above ``base``; answers decode as
    their ids (a random model writes no words)."""

    def __init__(self, cfg: ModelConfig, base: int):
        self.end_ids, self.base = frozenset({cfg.eos_id}), base

    def encode(self, conversation, use_chat_template: bool = True) -> list[int]:
        text = conversation if isinstance(conversation, str) else "\n".join(m["content"] for m in conversation)
        return [self.base + byte for byte in text.encode()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def piece(self, token_id: int) -> str:
        return str(token_id)


def random_weight_engine(name: str, cfg: ModelConfig, device: str, base: int):
    from flash_dllm.engine.engine import Engine, pick_backend
    from flash_dllm.engine.geometry import random_model

    dev = torch.device(device)
    model = random_model(cfg, dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    return Engine(model, ByteTokenizer(cfg, base), name, Path(name), pick_backend(None, dev), graphs=dev.type == "cuda")


def stream_one(base_url: str, model: str, prompt: str, max_tokens: int) -> dict:
    started = time.perf_counter()
    first, parts, usage, reason = None, [], None, None
    for chunk in openai_client(base_url).chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.perf_counter() - started
            parts.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            reason = chunk.choices[0].finish_reason
    return {"text": "".join(parts), "usage": usage, "reason": reason, "first_s": first,
            "elapsed_s": time.perf_counter() - started}


def check_concurrent_streams(engine, monkeypatch, n: int, max_tokens: int, serial: int) -> None:
    spy = SubmitSpy(engine, monkeypatch)
    prompts = [f"request {i}: " + "tell me something " * (i % 5 + 1) for i in range(n)]
    with served_api(ModelHost(engine, name=engine.name), ApiConfig()) as base_url:
        stream_one(base_url, engine.name, "warm up", 32)  # kernels compiled, graphs captured once
        spy.requests.clear()
        started = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(lambda p: stream_one(base_url, engine.name, p, max_tokens), prompts))
        together_s = time.perf_counter() - started
        by_prompt = {}
        for request in spy.requests:
            prompt = request.prompt[0]["content"] if isinstance(request.prompt, list) else request.prompt
            by_prompt[prompt] = request.result(0)
        started = time.perf_counter()
        alone = [stream_one(base_url, engine.name, p, max_tokens) for p in prompts[:serial]]
        alone_s = (time.perf_counter() - started) / serial * n  # the same n requests one after another
    for prompt, answer in zip(prompts, answers):
        result = by_prompt[prompt]
        assert answer["text"] == result.text, prompt
        assert answer["usage"].completion_tokens == len(result.token_ids) <= max_tokens
        assert answer["reason"] == ("stop" if result.finish_reason == "eos" else "length")
    for answer, again in zip(answers, alone):
        assert answer["text"] == again["text"] or not ON_GPU  # bf16 batching may round differently
    tokens = sum(a["usage"].completion_tokens for a in answers)
    firsts = sorted(a["first_s"] for a in answers if a["first_s"] is not None)
    print(f"\n{engine.name}: {n} streams x {max_tokens} tokens: together {together_s:.2f} s "
          f"({tokens / together_s:.1f} tok/s), one after another ~{alone_s:.2f} s "
          f"({tokens / alone_s:.1f} tok/s), ratio {alone_s / together_s:.2f}; first text after "
          f"{firsts[0]:.2f}-{firsts[-1]:.2f} s (median {firsts[len(firsts) // 2]:.2f} s)" if firsts else "")


def test_concurrent_streams_over_random_weights_on_cpu(monkeypatch):
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check_concurrent_streams(random_weight_engine("tiny-random", TINY, "cpu", base=16), monkeypatch,
                                 n=16, max_tokens=32, serial=4)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device (and compiled Triton kernels)")
@pytest.mark.parametrize("geometry, max_tokens", [("llada-8b", 256), ("dream-7b", 64)])
def test_concurrent_streams_at_full_geometry_on_the_gpu(geometry, max_tokens, monkeypatch):
    from flash_dllm.engine.geometry import GEOMETRY

    engine = random_weight_engine(geometry, GEOMETRY[geometry], "cuda", base=1000)
    try:
        check_concurrent_streams(engine, monkeypatch, n=16, max_tokens=max_tokens, serial=4)
    finally:
        del engine
        torch.cuda.empty_cache()
