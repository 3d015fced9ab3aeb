"""Tokenizer and chat template from the model folder, through transformers' AutoTokenizer (no remote code)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from flash_dllm.engine.config import ModelConfig
from flash_dllm.engine.families import FAMILY_DEFAULTS


class PromptError(ValueError):
    """An empty or malformed prompt / conversation."""


@dataclass
class ChatTokenizer:
    tokenizer: object
    config: ModelConfig
    # display pieces by token id, per tokenizer: a cache shared across instances would keep every tokenizer
    # the app ever loaded alive after a model switch
    _pieces: dict[int, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def end_ids(self) -> frozenset[int]:
        """EOS plus the family's end tokens this tokenizer has (end of turn; DiffuCoder's <|dlm_pad|>): the
        answer ends at the first one committed."""
        ids = {self.config.eos_id}
        unk = getattr(self.tokenizer, "unk_token_id", None)
        for token in FAMILY_DEFAULTS[self.config.family].end_tokens:
            found = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(found, int) and found >= 0 and found != unk:
                ids.add(found)
        return frozenset(ids)

    def encode(self, conversation, use_chat_template: bool = True) -> list[int]:
        """A prompt string or a list of {"role", "content": str} messages -> token ids."""
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

    def piece(self, token_id: int) -> str:
        """Display text of one token for the canvas (special tokens keep their name)."""
        text = self._pieces.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            text = text if text else self.tokenizer.convert_ids_to_tokens(token_id) or ""
            self._pieces[token_id] = text
        return text


def normalise_conversation(conversation) -> list[dict]:
    """A string (one user message) or a list of {"role", "content": str} messages, checked. UI formats (such
    as Gradio's content parts) are the app's to flatten before they reach the engine."""
    if isinstance(conversation, str):
        conversation = [{"role": "user", "content": conversation}]
    messages = []
    for message in conversation or []:
        role, content = message.get("role", "user"), message.get("content", "")
        if role not in ("system", "user", "assistant"):
            raise PromptError(f"unknown chat role {role!r}; use system, user or assistant")
        if not isinstance(content, str):
            raise PromptError(f"a message's content must be text (got {type(content).__name__})")
        messages.append({"role": role, "content": content})
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
