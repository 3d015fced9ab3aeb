"""Model configuration: one dataclass for both families, read from a Hugging Face config.json."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

SUPPORTED = "LLaDA (GSAI-ML/LLaDA-8B-Instruct, GSAI-ML/LLaDA-1.5, GSAI-ML/LLaDA-8B-Base) and Dream (Dream-org/Dream-v0-Instruct-7B)"


class UnsupportedModelError(ValueError):
    """The folder is not a model family this engine implements."""


@dataclass(frozen=True)
class MoEConfig:
    """Expert geometry of a mixture-of-experts MLP; each family fills in its router's rules."""
    n_experts: int
    top_k: int
    expert_hidden: int  # F of one routed expert
    n_shared_experts: int = 0  # always-on experts (a dense SwiGLU of n_shared_experts * shared_hidden)
    shared_hidden: int = 0


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
    # Block diffusion (LLaDA2): attention is causal across blocks of this many absolute positions and
    # bidirectional inside one, so committed blocks are cached exactly; None: bidirectional everywhere.
    block_size: int | None = None
    # Mixture of experts (LLaDA-MoE, LLaDA2): the family's router and expert geometry; None: a dense SwiGLU MLP.
    moe: "MoEConfig | None" = None

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


def _number(raw: dict, key: str, kind=int, default=None):
    """``raw[key]`` as an int (or float), naming the key when it is missing, null, text or a list."""
    value = raw.get(key, default) if default is not None else raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise UnsupportedModelError(f"config.json: {key} must be a{'n integer' if kind is int else ' number'} "
                                    f"(got {json.dumps(value)[:40]})")
    return kind(value)


def _positive(raw: dict, key: str, default=None) -> int:
    value = _number(raw, key, int, default)
    if value < 1:
        raise UnsupportedModelError(f"config.json: {key} must be a positive integer (got {value})")
    return value


def _llada(raw: dict) -> ModelConfig:
    d, heads = _positive(raw, "d_model"), _positive(raw, "n_heads")
    if raw.get("include_bias"):
        raise UnsupportedModelError("LLaDA checkpoints with include_bias=true are not supported")
    return ModelConfig(
        family="llada",
        d_model=d,
        n_layers=_positive(raw, "n_layers"),
        n_heads=heads,
        n_kv_heads=_positive(raw, "n_kv_heads") if raw.get("n_kv_heads") is not None else heads,
        head_dim=d // heads,
        mlp_hidden=_positive(raw, "mlp_hidden_size"),
        vocab_size=_positive(raw, "embedding_size") if raw.get("embedding_size") else _positive(raw, "vocab_size"),
        rope_theta=_number(raw, "rope_theta", float, 10000.0),
        norm_eps=_number(raw, "rms_norm_eps", float, 1e-5),
        max_seq_len=_positive(raw, "max_sequence_length", 4096),
        tie_embeddings=bool(raw.get("weight_tying", False)),
        qkv_bias=bool(raw.get("include_qkv_bias", False)),
        mask_id=_number(raw, "mask_token_id", int, 126336),
        eos_id=_number(raw, "eos_token_id", int, 126081),
        pad_id=raw.get("pad_token_id"),
    )


def _dream(raw: dict) -> ModelConfig:
    d, heads = _positive(raw, "hidden_size"), _positive(raw, "num_attention_heads")
    return ModelConfig(
        family="dream",
        d_model=d,
        n_layers=_positive(raw, "num_hidden_layers"),
        n_heads=heads,
        n_kv_heads=_positive(raw, "num_key_value_heads") if raw.get("num_key_value_heads") is not None else heads,
        head_dim=_positive(raw, "head_dim") if raw.get("head_dim") is not None else d // heads,
        mlp_hidden=_positive(raw, "intermediate_size"),
        vocab_size=_positive(raw, "vocab_size"),
        rope_theta=_number(raw, "rope_theta", float, 1e6),
        norm_eps=_number(raw, "rms_norm_eps", float, 1e-6),
        max_seq_len=_positive(raw, "max_position_embeddings", 2048),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=True,  # Qwen2 layout: q/k/v always carry a bias
        mask_id=_number(raw, "mask_token_id", int, 151666),
        eos_id=_number(raw, "eos_token_id", int, 151643),
        pad_id=raw.get("pad_token_id"),
    )


def detect_family(raw: dict) -> str:
    model_type = str(raw.get("model_type", "")).lower()
    archs = raw.get("architectures") or []
    archs = " ".join(map(str, archs) if isinstance(archs, list) else [str(archs)]).lower()
    if model_type == "llada" or "llada" in archs:
        return "llada"
    if model_type == "dream" or "dream" in archs:
        return "dream"
    name = model_type or archs or "unknown"
    raise UnsupportedModelError(f"unsupported model type {name!r}; supported: {SUPPORTED}")


POSITIVE = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_hidden", "vocab_size", "max_seq_len")


def check_geometry(cfg: ModelConfig) -> ModelConfig:
    """Refuse a config whose numbers cannot describe a model (a zero or negative size, heads that do not
    divide, a token id outside the vocabulary), so a broken checkpoint fails at load with its key named
    instead of crashing the first forward or being remembered as a usable model."""
    for name in POSITIVE:
        if getattr(cfg, name) < 1:
            raise UnsupportedModelError(f"config.json: {name} must be a positive integer (got {getattr(cfg, name)})")
    if cfg.n_heads % cfg.n_kv_heads:
        raise UnsupportedModelError(f"config.json: {cfg.n_heads} attention heads cannot share "
                                    f"{cfg.n_kv_heads} key/value heads (it must divide them)")
    if cfg.family == "llada" and cfg.d_model % cfg.n_heads:
        raise UnsupportedModelError(f"config.json: d_model {cfg.d_model} is not a multiple of n_heads {cfg.n_heads}")
    if cfg.head_dim % 2:
        raise UnsupportedModelError(f"config.json: the head size {cfg.head_dim} must be even (rotary embedding)")
    for name in ("rope_theta", "norm_eps"):
        value = getattr(cfg, name)
        if not math.isfinite(value) or value <= 0:
            raise UnsupportedModelError(f"config.json: {name} must be a positive number (got {value})")
    for name in ("mask_id", "eos_id"):
        if not 0 <= getattr(cfg, name) < cfg.vocab_size:
            raise UnsupportedModelError(f"config.json: {name} {getattr(cfg, name)} lies outside the vocabulary "
                                        f"of {cfg.vocab_size} tokens")
    return cfg


def config_from_dict(raw: dict) -> ModelConfig:
    if not isinstance(raw, dict):
        raise UnsupportedModelError(f"config.json must hold a JSON object, not a {type(raw).__name__}")
    family = detect_family(raw)
    try:
        cfg = _llada(raw) if family == "llada" else _dream(raw)
    except KeyError as missing:
        raise UnsupportedModelError(f"config.json of this {family} model lacks the key {missing}") from None
    if cfg.pad_id is not None and not isinstance(cfg.pad_id, int):  # the engine pads with EOS when it has none
        cfg = replace(cfg, pad_id=None)
    return check_geometry(cfg)


def load_config(folder: str | Path) -> ModelConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise UnsupportedModelError(f"{folder} has no config.json; supported: {SUPPORTED}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:  # JSONDecodeError and UnicodeDecodeError (a binary file) are ValueErrors
        raise UnsupportedModelError(f"{path} is not a readable JSON file ({type(err).__name__}: "
                                    f"{' '.join(str(err).split())[:120]})") from None
    try:
        return config_from_dict(raw)
    except UnsupportedModelError as err:
        raise UnsupportedModelError(str(err).replace("config.json", str(path), 1)) from None
