"""Model configuration: one dataclass for every family, read from a Hugging Face config.json.

Families: "llada" (LLaDA-8B, LLaDA-1.5), "dream" (Dream-7B, Dream-Coder, DiffuCoder: Qwen2 layout), "llada-moe"
(LLaDA-MoE-7B-A1B: OLMoE-style experts, QK-norm) and "llada2" (LLaDA2.x: Ling/BailingMoeV2 layout, block
diffusion, sigmoid group-limited router, shared expert, partial RoPE). Per-checkpoint generation defaults and
allowed methods live in engine/families.py.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

# Short enough for a one-line error (the known checkpoints are listed in engine/families.py KNOWN_MODELS)
SUPPORTED = ("LLaDA and LLaDA-1.5, Dream (also Dream-Coder, DiffuCoder), LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B) "
             "and LLaDA2 (inclusionAI/LLaDA2.0-mini)")


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
    score_function: str = "softmax"  # "softmax" over all experts (LLaDA-MoE) or per-expert "sigmoid" (LLaDA2)
    normalize_top_k: bool = False  # divide the K chosen scores by their sum
    routed_scaling: float = 1.0  # multiplies the routed weights after normalisation
    n_group: int = 1  # group-limited routing: experts in n_group groups, a group scored by its 2 best experts,
    topk_group: int = 1  # and only the topk_group best groups compete for the top_k (1/1: no limit)
    expert_bias: bool = False  # a per-expert bias added to the scores that choose experts (load balancing)
    bias_in_weights: bool = False  # LLaDA-MoE adds that bias to the weights too; LLaDA2 weighs by the raw scores
    dense_layers: tuple[int, ...] = ()  # layers with a dense SwiGLU of ModelConfig.mlp_hidden instead of experts

    def is_moe_layer(self, index: int) -> bool:
        return index not in self.dense_layers


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "llada", "dream", "llada-moe" or "llada2"
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
    qk_norm: bool = False  # RMSNorm over each head of q and k (weights [head_dim]) before RoPE
    rotary_dim: int | None = None  # partial RoPE: only the first rotary_dim dims of a head rotate; None: all

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def shift_logits(self) -> bool:
        """Dream keeps its autoregressive initialisation: the logits at position i-1 predict token i."""
        return self.family == "dream"

    @property
    def n_params(self) -> int:
        d, h = self.d_model, self.mlp_hidden
        qkv = d * (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        attention = qkv + self.n_heads * self.head_dim * d + 2 * d + (2 * self.head_dim if self.qk_norm else 0)
        total = 0
        for index in range(self.n_layers):
            if self.moe is None or not self.moe.is_moe_layer(index):
                total += attention + 3 * d * h
                continue
            m = self.moe
            experts = m.n_experts * 3 * d * m.expert_hidden + 3 * d * m.n_shared_experts * m.shared_hidden
            total += attention + experts + m.n_experts * d + (m.n_experts if m.expert_bias else 0)
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + total + d + head


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


def _rotary_dim(raw: dict, head_dim: int) -> int | None:
    """partial_rotary_factor as a count of rotated dims; absent, null or the config class's -1: all of them."""
    factor = raw.get("partial_rotary_factor")
    if factor is None or factor == -1 or factor == 1:
        return None
    factor = _number(raw, "partial_rotary_factor", float)
    if not 0 < factor <= 1:
        raise UnsupportedModelError(f"config.json: partial_rotary_factor must lie in (0, 1] (got {factor})")
    return int(head_dim * factor)


def _refuse(raw: dict, key: str, why: str) -> None:
    if raw.get(key):
        raise UnsupportedModelError(f"config.json: {key}={json.dumps(raw[key])} is not supported ({why})")


def _llada_moe(raw: dict) -> ModelConfig:
    """inclusionAI/LLaDA-MoE-7B-A1B: OLMoE-style softmax router without renormalisation, per-head QK-norm."""
    d, heads = _positive(raw, "hidden_size"), _positive(raw, "num_attention_heads")
    n_layers = _positive(raw, "num_hidden_layers")
    _refuse(raw, "attention_bias", "the published checkpoints have none")
    _refuse(raw, "clip_qkv", "the published checkpoints do not clip")
    freq = raw.get("moe_layer_freq") or [1] * n_layers
    if not isinstance(freq, list) or len(freq) != n_layers:
        raise UnsupportedModelError("config.json: moe_layer_freq must list one 0/1 per layer")
    shared = raw.get("shared_expert_intermediate_size")
    shared = shared if isinstance(shared, int) and shared > 0 else 0
    dense = tuple(i for i, flag in enumerate(freq) if not flag)
    moe = MoEConfig(
        n_experts=_positive(raw, "num_experts"), top_k=_positive(raw, "num_experts_per_tok"),
        expert_hidden=_positive(raw, "expert_intermediate_size"), n_shared_experts=1 if shared else 0,
        shared_hidden=shared, score_function=str(raw.get("moe_router_score_function") or "softmax").lower(),
        normalize_top_k=False,  # the published router never renormalises, whatever norm_topk_prob says
        routed_scaling=1.0, expert_bias=bool(raw.get("moe_router_enable_expert_bias")), bias_in_weights=True,
        dense_layers=dense)
    head_dim = d // heads
    return ModelConfig(
        family="llada-moe", d_model=d, n_layers=n_layers, n_heads=heads,
        n_kv_heads=_positive(raw, "num_key_value_heads") if raw.get("num_key_value_heads") is not None else heads,
        head_dim=head_dim,
        mlp_hidden=_positive(raw, "dense_intermediate_size") if dense else moe.expert_hidden,  # unused then
        vocab_size=_positive(raw, "vocab_size"), rope_theta=_number(raw, "rope_theta", float, 50000.0),
        norm_eps=_number(raw, "rms_norm_eps", float, 1e-5), max_seq_len=_positive(raw, "max_position_embeddings", 8192),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)), qkv_bias=False,
        mask_id=_number(raw, "mask_token_id", int, 156895), eos_id=_number(raw, "eos_token_id", int, 156892),
        pad_id=raw.get("pad_token_id"), moe=moe, qk_norm=bool(raw.get("qk_layernorm")),
        rotary_dim=_rotary_dim(raw, head_dim))


def _llada2(raw: dict) -> ModelConfig:
    """inclusionAI/LLaDA2.x (Ling 2.0 / BailingMoeV2 layout): fused QKV, per-head QK-norm, partial RoPE, sigmoid
    router with expert bias and group-limited top-k, one shared expert, the first layers dense; block diffusion
    with blocks of 32 (the block is the trained one, not a config.json key)."""
    d, heads = _positive(raw, "hidden_size"), _positive(raw, "num_attention_heads")
    n_layers = _positive(raw, "num_hidden_layers")
    _refuse(raw, "use_bias", "the attention output projection of the published checkpoints has no bias")
    _refuse(raw, "norm_head", "the published checkpoints do not normalise the head")
    _refuse(raw, "num_nextn_predict_layers", "multi-token-prediction layers are not implemented")
    _refuse(raw, "use_linear_attention", "linear-attention layers are not implemented")
    _refuse(raw, "use_sliding_window", "the published checkpoints attend to the whole context")
    head_dim = _positive(raw, "head_dim") if raw.get("head_dim") is not None else d // heads
    expert_hidden = _positive(raw, "moe_intermediate_size")
    score = str(raw.get("score_function") or "sigmoid").lower()
    moe = MoEConfig(
        n_experts=_positive(raw, "num_experts"), top_k=_positive(raw, "num_experts_per_tok"),
        expert_hidden=expert_hidden, n_shared_experts=_number(raw, "num_shared_experts", int, 0),
        shared_hidden=expert_hidden, score_function=score,
        normalize_top_k=bool(raw.get("norm_topk_prob", True)),
        routed_scaling=_number(raw, "routed_scaling_factor", float, 1.0),
        n_group=_positive(raw, "n_group", 1), topk_group=_positive(raw, "topk_group", 1),
        expert_bias=True,  # the gate always holds an expert_bias buffer (zeros when untrained)
        dense_layers=tuple(range(min(n_layers, _number(raw, "first_k_dense_replace", int, 0)))))
    return ModelConfig(
        family="llada2", d_model=d, n_layers=n_layers, n_heads=heads,
        n_kv_heads=_positive(raw, "num_key_value_heads") if raw.get("num_key_value_heads") else heads,
        head_dim=head_dim, mlp_hidden=_positive(raw, "intermediate_size"), vocab_size=_positive(raw, "vocab_size"),
        rope_theta=_number(raw, "rope_theta", float, 600000.0), norm_eps=_number(raw, "rms_norm_eps", float, 1e-6),
        max_seq_len=_positive(raw, "max_position_embeddings", 32768),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)), qkv_bias=bool(raw.get("use_qkv_bias", False)),
        mask_id=_number(raw, "mask_token_id", int, 156895), eos_id=_number(raw, "eos_token_id", int, 156892),
        pad_id=raw.get("pad_token_id"), block_size=32, moe=moe, qk_norm=bool(raw.get("use_qk_norm", True)),
        rotary_dim=_rotary_dim(raw, head_dim))


PARSERS = {"llada": _llada, "dream": _dream, "llada-moe": _llada_moe, "llada2": _llada2}


def detect_family(raw: dict) -> str:
    """The family from model_type / architectures. The published LLaDA-MoE config says model_type "llada"
    (only its architecture, LLaDAMoEModelLM, and its expert keys tell it from dense LLaDA), so the MoE
    families are checked first."""
    model_type = str(raw.get("model_type", "")).lower()
    archs = raw.get("architectures") or []
    archs = " ".join(map(str, archs) if isinstance(archs, list) else [str(archs)]).lower()
    if model_type in ("llada2_moe", "llada2") or "llada2" in archs:
        return "llada2"
    if model_type == "lladamoe" or "lladamoe" in archs or (model_type == "llada" and "num_experts" in raw):
        return "llada-moe"
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
    if cfg.rope_dim % 2 or cfg.rope_dim > cfg.head_dim:
        raise UnsupportedModelError(f"config.json: {cfg.rope_dim} rotary dims must be even and at most the head "
                                    f"size {cfg.head_dim}")
    if cfg.moe is not None:
        check_moe(cfg.moe)
    for name in ("mask_id", "eos_id"):
        if not 0 <= getattr(cfg, name) < cfg.vocab_size:
            raise UnsupportedModelError(f"config.json: {name} {getattr(cfg, name)} lies outside the vocabulary "
                                        f"of {cfg.vocab_size} tokens")
    return cfg


def check_moe(moe: MoEConfig) -> None:
    if moe.score_function not in ("softmax", "sigmoid"):
        raise UnsupportedModelError(f"config.json: router score function {moe.score_function!r} is not supported "
                                    "(softmax or sigmoid)")
    if not 1 <= moe.top_k <= moe.n_experts:
        raise UnsupportedModelError(f"config.json: {moe.top_k} experts per token out of {moe.n_experts}")
    if moe.n_group > 1:
        per_group = moe.n_experts // moe.n_group
        if moe.n_experts % moe.n_group or per_group < 2 or not 1 <= moe.topk_group <= moe.n_group \
                or moe.topk_group * per_group < moe.top_k:
            raise UnsupportedModelError(f"config.json: {moe.n_experts} experts cannot be routed in {moe.n_group} "
                                        f"groups keeping {moe.topk_group} for a top-{moe.top_k}")
    if moe.n_shared_experts < 0:
        raise UnsupportedModelError("config.json: num_shared_experts must be >= 0")


def config_from_dict(raw: dict) -> ModelConfig:
    if not isinstance(raw, dict):
        raise UnsupportedModelError(f"config.json must hold a JSON object, not a {type(raw).__name__}")
    family = detect_family(raw)
    try:
        cfg = PARSERS[family](raw)
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
