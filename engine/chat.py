"""Tokenizer and chat template from the model folder, through transformers' AutoTokenizer (no remote code)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from flash_dllm.engine.config import ModelConfig

END_OF_TURN = {"llada": "<|eot_id|>", "dream": "<|im_end|>"}


class PromptError(ValueError):
    """An empty or malformed prompt / conversation."""


@dataclass
class ChatTokenizer:
    tokenizer: object
    config: ModelConfig

    @property
    def end_ids(self) -> frozenset[int]:
        """EOS plus the family's end-of-turn token: the answer ends at the first one committed."""
        ids = {self.config.eos_id}
        eot = self.tokenizer.convert_tokens_to_ids(END_OF_TURN[self.config.family])
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if isinstance(eot, int) and eot >= 0 and eot != unk:
            ids.add(eot)
        return frozenset(ids)

    def encode(self, conversation, use_chat_template: bool = True) -> list[int]:
        """A prompt string or a list of {"role", "content"} messages -> token ids."""
        messages = normalise_conversation(conversation)
        if use_chat_template and getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:  # raw prompt (base models, few-shot evaluation): the messages' texts as is, joined by blank lines
            text = "\n\n".join(m["content"] for m in messages)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise PromptError("the prompt encodes to no tokens")
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    @lru_cache(maxsize=65536)
    def piece(self, token_id: int) -> str:
        """Display text of one token for the canvas (special tokens keep their name)."""
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text if text else self.tokenizer.convert_ids_to_tokens(token_id) or ""

    def __hash__(self) -> int:  # lru_cache on a method needs a hashable instance
        return id(self)


def normalise_conversation(conversation) -> list[dict]:
    """Accept a string, OpenAI-style messages, or Gradio 6 messages (content as a list of text parts)."""
    if isinstance(conversation, str):
        conversation = [{"role": "user", "content": conversation}]
    messages = []
    for message in conversation or []:
        content = message.get("content", "")
        if isinstance(content, list):  # Gradio 6: [{"type": "text", "text": ...}, ...]
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        role = message.get("role", "user")
        if role not in ("system", "user", "assistant"):
            raise PromptError(f"unknown chat role {role!r}; use system, user or assistant")
        messages.append({"role": role, "content": str(content)})
    if not any(m["role"] == "user" and m["content"].strip() for m in messages):
        raise PromptError("the prompt is empty")
    return messages


def load_tokenizer(folder: str | Path, config: ModelConfig) -> ChatTokenizer:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # transformers warns that config.json names a model class it lacks
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except (ValueError, OSError) as first_error:
        # Dream's tokenizer_config names a remote-code class; its files are plain Qwen2 BPE.
        from transformers import PreTrainedTokenizerFast

        try:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
        except Exception:
            raise ValueError(f"cannot load the tokenizer of {folder}: {first_error}") from None
    return ChatTokenizer(tokenizer=tokenizer, config=config)
