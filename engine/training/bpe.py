"""A small byte-level BPE tokenizer with LLaDA's special tokens and chat template.

Saved through ``transformers.PreTrainedTokenizerFast.save_pretrained`` so that ``AutoTokenizer.from_pretrained``
loads it offline, chat template included. Digits are always single tokens (one per digit, the first one
carrying the space before the number), which keeps arithmetic digit-aligned: a merged "117" token would make
the model learn every 3-digit number as a separate symbol.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from flash_dllm.engine.tiny import LLADA_SPECIALS, LLADA_TEMPLATE

BOS, EOS, HEADER_START, HEADER_END, EOT, MASK = LLADA_SPECIALS  # <|startoftext|> ... <|mdm_mask|>
CHAT_TEMPLATE = LLADA_TEMPLATE  # the engine's copy of LLaDA-8B-Instruct's template: one definition, one behaviour


def render_prompt(messages: list[dict[str, str]]) -> str:
    """The chat template in plain Python (fast for millions of examples); tests pin it to the Jinja one."""
    parts = [BOS]
    for message in messages:
        parts.append(f"{HEADER_START}{message['role']}{HEADER_END}\n\n{message['content'].strip()}{EOT}")
    parts.append(f"{HEADER_START}assistant{HEADER_END}\n\n")
    return "".join(parts)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, min_frequency: int = 4):
    """Train the BPE on rendered conversations; the six specials get ids 0-5."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" ?[0-9]"), behavior="isolated"),  # " 1", "1", "7": digit-aligned numbers
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(LLADA_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer, folder: str | Path):
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json with the chat template."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=EOS, mask_token=MASK,
        additional_special_tokens=[HEADER_START, HEADER_END, EOT], chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(str(folder))
    # transformers 5 names its own backend class and keeps the template in chat_template.jinja; the generic
    # class name and an inline template keep the folder loadable by transformers 4.x (pyproject allows 4.56+)
    config_path = Path(folder) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE,
                  additional_special_tokens=[HEADER_START, HEADER_END, EOT])
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return fast


def special_ids(tokenizer) -> dict[str, int]:
    """Ids of the specials in a ``tokenizers.Tokenizer`` (or anything with ``token_to_id``)."""
    return {name: tokenizer.token_to_id(name) for name in LLADA_SPECIALS}


def load_backend(folder: str | Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
