"""Model configuration: one dataclass for both families, read from a Hugging Face config.json."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED = "LLaDA (GSAI-ML/LLaDA-8B-Instruct, GSAI-ML/LLaDA-1.5, GSAI-ML/LLaDA-8B-Base) and Dream (Dream-org/Dream-v0-Instruct-7B)"


class UnsupportedModelError(ValueError):
    """The folder is not a model family this engine implements."""


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "llada" or "dream"
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    mlp_hidden: int
    vocab_size: int  # rows of the embedding / head (may exceed the tokenizer's vocabulary)
    rope_theta: float
    norm_eps: float
    max_seq_len: int
    tie_embeddings: bool
    qkv_bias: bool
    mask_id: int
    eos_id: int
    pad_id: int | None = None

    @property
    def shift_logits(self) -> bool:
        """Dream keeps its autoregressive initialisation: the logits at position i-1 predict token i."""
        return self.family == "dream"

    @property
    def n_params(self) -> int:
        d, h = self.d_model, self.mlp_hidden
        qkv = d * (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        per_layer = qkv + self.n_heads * self.head_dim * d + 3 * d * h + 2 * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.n_layers * per_layer + d + head


def _llada(raw: dict) -> ModelConfig:
    d, heads = int(raw["d_model"]), int(raw["n_heads"])
    if raw.get("include_bias"):
        raise UnsupportedModelError("LLaDA checkpoints with include_bias=true are not supported")
    return ModelConfig(
        family="llada",
        d_model=d,
        n_layers=int(raw["n_layers"]),
        n_heads=heads,
        n_kv_heads=int(raw.get("n_kv_heads") or heads),
        head_dim=d // heads,
        mlp_hidden=int(raw["mlp_hidden_size"]),
        vocab_size=int(raw.get("embedding_size") or raw["vocab_size"]),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        max_seq_len=int(raw.get("max_sequence_length", 4096)),
        tie_embeddings=bool(raw.get("weight_tying", False)),
        qkv_bias=bool(raw.get("include_qkv_bias", False)),
        mask_id=int(raw.get("mask_token_id", 126336)),
        eos_id=int(raw.get("eos_token_id", 126081)),
        pad_id=raw.get("pad_token_id"),
    )


def _dream(raw: dict) -> ModelConfig:
    d, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    return ModelConfig(
        family="dream",
        d_model=d,
        n_layers=int(raw["num_hidden_layers"]),
        n_heads=heads,
        n_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or d // heads),
        mlp_hidden=int(raw["intermediate_size"]),
        vocab_size=int(raw["vocab_size"]),
        rope_theta=float(raw.get("rope_theta", 1e6)),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_seq_len=int(raw.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=True,  # Qwen2 layout: q/k/v always carry a bias
        mask_id=int(raw.get("mask_token_id", 151666)),
        eos_id=int(raw.get("eos_token_id", 151643)),
        pad_id=raw.get("pad_token_id"),
    )


def detect_family(raw: dict) -> str:
    model_type = str(raw.get("model_type", "")).lower()
    archs = " ".join(raw.get("architectures") or []).lower()
    if model_type == "llada" or "llada" in archs:
        return "llada"
    if model_type == "dream" or "dream" in archs:
        return "dream"
    name = model_type or archs or "unknown"
    raise UnsupportedModelError(f"unsupported model type {name!r}; supported: {SUPPORTED}")


def config_from_dict(raw: dict) -> ModelConfig:
    family = detect_family(raw)
    try:
        return _llada(raw) if family == "llada" else _dream(raw)
    except KeyError as missing:
        raise UnsupportedModelError(f"config.json of this {family} model lacks the key {missing}") from None


def load_config(folder: str | Path) -> ModelConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise UnsupportedModelError(f"{folder} has no config.json; supported: {SUPPORTED}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UnsupportedModelError(f"{path} is not valid JSON ({err})") from None
    return config_from_dict(raw)
