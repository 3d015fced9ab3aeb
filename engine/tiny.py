"""Tiny random-weight model repos in each family's exact Hugging Face format (tests, fake hub, benchmarks).

The config keys, tensor names and special tokens are the real ones; only the sizes are small. The tokenizer
is byte-level BPE without merges (every byte is a token), so any text encodes and decodes losslessly.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from flash_dllm.engine.config import config_from_dict
from flash_dllm.engine.weights import expected_shapes

LLADA_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|mdm_mask|>"]
DREAM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
LING_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|mask|>", "<role>", "</role>", "<|role_end|>"]  # LLaDA-MoE, LLaDA2

LLADA_TEMPLATE = (
    "{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + (message['content'] | trim) + '<|eot_id|>' }}"
    "{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
)
DREAM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The Ling chat format of LLaDA-MoE / LLaDA2: <role>HUMAN</role>text<|role_end|>...<role>ASSISTANT</role>
LING_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<role>' + {'system': 'SYSTEM', 'user': 'HUMAN', 'assistant': 'ASSISTANT'}[message['role']] + '</role>' "
    "+ message['content'] + '<|role_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    family: str = "llada"
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 4  # Dream tiny uses 2 (GQA)
    mlp_hidden: int = 128
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    seed: int = 0
    logit_scale: float = 4.0  # sharper random logits: greedy argmax is then far from ties


def save_byte_tokenizer(folder: Path, family: str) -> dict[str, int]:
    """Write tokenizer.json + tokenizer_config.json with the family's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = {"llada": LLADA_SPECIALS, "dream": DREAM_SPECIALS}.get(family, LING_SPECIALS)
    backend.add_special_tokens(specials)
    if family == "llada":
        kwargs = dict(bos_token="<|startoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                      mask_token="<|mdm_mask|>", chat_template=LLADA_TEMPLATE)
    elif family in ("llada-moe", "llada2"):
        kwargs = dict(bos_token="<|startoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                      mask_token="<|mask|>", chat_template=LING_TEMPLATE)
    else:
        kwargs = dict(eos_token="<|endoftext|>", pad_token="<|endoftext|>", mask_token="<|mask|>",
                      chat_template=DREAM_TEMPLATE)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
    tokenizer.save_pretrained(str(folder))
    return {tok: backend.token_to_id(tok) for tok in specials}


def tiny_moe_config_dict(spec: TinySpec, vocab: int, ids: dict[str, int]) -> dict:
    """LLaDA-MoE / LLaDA2 config.json with their published keys (small sizes). mask_token_id / eos_token_id are
    written out because the published defaults (156895 / 156892) lie outside a tiny vocabulary."""
    common = {
        "hidden_size": spec.d_model, "num_hidden_layers": spec.n_layers, "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_kv_heads, "vocab_size": vocab, "rope_theta": spec.rope_theta,
        "max_position_embeddings": spec.max_seq_len, "tie_word_embeddings": False, "hidden_act": "silu",
        "num_experts": 8, "num_experts_per_tok": 2, "mask_token_id": ids["<|mask|>"],
        "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
    }
    if spec.family == "llada-moe":  # model_type "llada" as published: the architecture names the MoE
        return {**common, "model_type": "llada", "architectures": ["LLaDAMoEModelLM"], "rms_norm_eps": 1e-5,
                "expert_intermediate_size": 32, "dense_intermediate_size": spec.mlp_hidden,
                "shared_expert_intermediate_size": None, "moe_layer_freq": [1] * spec.n_layers,
                "qk_layernorm": True, "norm_topk_prob": False, "moe_router_enable_expert_bias": False,
                "moe_router_score_function": "softmax", "partial_rotary_factor": 1.0, "attention_bias": False,
                "clip_qkv": None, "router_aux_loss_coef": 0.01}
    return {**common, "model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"], "rms_norm_eps": 1e-6,
            "head_dim": spec.d_model // spec.n_heads, "intermediate_size": spec.mlp_hidden,
            "moe_intermediate_size": 32, "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4,
            "topk_group": 2, "routed_scaling_factor": 2.5, "score_function": "sigmoid", "norm_topk_prob": True,
            "moe_router_enable_expert_bias": True, "partial_rotary_factor": 0.5, "use_qk_norm": True,
            "use_qkv_bias": False, "use_bias": False, "norm_head": False, "router_dtype": "fp32"}


def tiny_config_dict(spec: TinySpec, vocab: int, ids: dict[str, int]) -> dict:
    if spec.family in ("llada-moe", "llada2"):
        return tiny_moe_config_dict(spec, vocab, ids)
    if spec.family == "llada":
        return {
            "model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": spec.d_model,
            "n_layers": spec.n_layers, "n_heads": spec.n_heads, "n_kv_heads": spec.n_heads,
            "mlp_hidden_size": spec.mlp_hidden, "vocab_size": vocab, "embedding_size": vocab,
            "rope_theta": spec.rope_theta, "rms_norm_eps": 1e-5, "max_sequence_length": spec.max_seq_len,
            "weight_tying": False, "include_bias": False, "include_qkv_bias": False,
            "activation_type": "silu", "block_type": "llama", "mask_token_id": ids["<|mdm_mask|>"],
            "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
        }
    return {
        "model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": spec.d_model,
        "num_hidden_layers": spec.n_layers, "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_kv_heads, "intermediate_size": spec.mlp_hidden, "vocab_size": vocab,
        "rope_theta": spec.rope_theta, "rms_norm_eps": 1e-6, "max_position_embeddings": spec.max_seq_len,
        "tie_word_embeddings": False, "hidden_act": "silu", "mask_token_id": ids["<|mask|>"],
        "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
    }


def random_state(config_dict: dict, spec: TinySpec) -> dict[str, torch.Tensor]:
    """Random weights with the real names; embeddings and head scaled so logits are well separated."""
    cfg = config_from_dict(config_dict)
    gen = torch.Generator().manual_seed(spec.seed)
    state = {}
    for name, shape in expected_shapes(cfg).items():
        if len(shape) == 1:
            value = 1.0 + 0.1 * torch.randn(shape, generator=gen) if name.endswith("norm.weight") or "layernorm" in name or name.endswith("ln_f.weight") or name.endswith("model.norm.weight") else 0.1 * torch.randn(shape, generator=gen)
        else:
            std = spec.logit_scale / shape[1] ** 0.5 if ("ff_out.weight" in name and "blocks" not in name) or name == "lm_head.weight" else shape[1] ** -0.5
            value = std * torch.randn(shape, generator=gen)
            if "wte" in name or "embed_tokens" in name or "word_embeddings" in name:
                value = torch.randn(shape, generator=gen)
        state[name] = value.contiguous()
    return state


def write_tiny_model(folder: str | Path, spec: TinySpec = TinySpec(), shards: int = 1) -> Path:
    """Write config.json, safetensors (optionally sharded with an index) and tokenizer files."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = save_byte_tokenizer(folder, spec.family)
    vocab = (max(ids.values()) + 1 + 63) // 64 * 64  # embeddings padded like the real checkpoints
    config = tiny_config_dict(spec, vocab, ids)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    state = random_state(config, spec)
    names = sorted(state)
    if shards <= 1:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    weight_map = {}
    for index in range(shards):
        part = names[index::shards]
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        save_file({name: state[name] for name in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in part})
    index_doc = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2))
    return folder
