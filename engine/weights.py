"""Load a Hugging Face model folder by tensor name from safetensors (never pickle, never remote code)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import torch

from flash_dllm.engine.config import ModelConfig, load_config
from flash_dllm.engine.model import DiffusionLM, LayerWeights, rope_tables
from flash_dllm.engine.moe_model import MoEWeights


class WeightsError(ValueError):
    """Missing, truncated or mismatched weight files."""


def llada_names(cfg: ModelConfig) -> dict:
    """Tensor names of LLaDA's checkpoint layout (GSAI-ML/LLaDA-8B-Instruct)."""
    block = "model.transformer.blocks.{i}."
    return {
        "embed": "model.transformer.wte.weight",
        "final_norm": "model.transformer.ln_f.weight",
        "lm_head": None if cfg.tie_embeddings else "model.transformer.ff_out.weight",
        "attn_norm": block + "attn_norm.weight",
        "q": block + "q_proj.weight",
        "k": block + "k_proj.weight",
        "v": block + "v_proj.weight",
        "q_bias": block + "q_proj.bias",
        "k_bias": block + "k_proj.bias",
        "v_bias": block + "v_proj.bias",
        "o": block + "attn_out.weight",
        "ffn_norm": block + "ff_norm.weight",
        "gate": block + "ff_proj.weight",
        "up": block + "up_proj.weight",
        "down": block + "ff_out.weight",
    }


def dream_names(cfg: ModelConfig) -> dict:
    """Tensor names of Dream's Qwen2 layout (Dream-org/Dream-v0-Instruct-7B)."""
    block = "model.layers.{i}."
    return {
        "embed": "model.embed_tokens.weight",
        "final_norm": "model.norm.weight",
        "lm_head": None if cfg.tie_embeddings else "lm_head.weight",
        "attn_norm": block + "input_layernorm.weight",
        "q": block + "self_attn.q_proj.weight",
        "k": block + "self_attn.k_proj.weight",
        "v": block + "self_attn.v_proj.weight",
        "q_bias": block + "self_attn.q_proj.bias",
        "k_bias": block + "self_attn.k_proj.bias",
        "v_bias": block + "self_attn.v_proj.bias",
        "o": block + "self_attn.o_proj.weight",
        "ffn_norm": block + "post_attention_layernorm.weight",
        "gate": block + "mlp.gate_proj.weight",
        "up": block + "mlp.up_proj.weight",
        "down": block + "mlp.down_proj.weight",
    }


def llada_moe_names(cfg: ModelConfig) -> dict:
    """Tensor names of LLaDA-MoE's layout (inclusionAI/LLaDA-MoE-7B-A1B-Instruct: OLMoE-like)."""
    block = "model.layers.{i}."
    names = dream_names(cfg)  # the same Llama-style names for embedding, norms, projections and a dense MLP
    for key in ("q_bias", "k_bias", "v_bias"):
        names[key] = None
    names.update({
        "q_norm": block + "self_attn.q_norm.weight", "k_norm": block + "self_attn.k_norm.weight",
        "router": block + "mlp.gate.weight", "expert_bias": block + "mlp.expert_bias",
        "expert": block + "mlp.experts.{e}.{proj}.weight",
        "shared": block + "shared_expert.{proj}.weight",  # on the decoder layer, beside mlp
    })
    return names


def llada2_names(cfg: ModelConfig) -> dict:
    """Tensor names of LLaDA2's layout (inclusionAI/LLaDA2.0-mini: Ling 2.0 / BailingMoeV2)."""
    block = "model.layers.{i}."
    return {
        "embed": "model.word_embeddings.weight",
        "final_norm": "model.norm.weight",
        "lm_head": None if cfg.tie_embeddings else "lm_head.weight",
        "attn_norm": block + "input_layernorm.weight",
        "qkv": block + "attention.query_key_value.weight",  # q heads, then k heads, then v heads
        "qkv_bias": block + "attention.query_key_value.bias",
        "q_norm": block + "attention.query_layernorm.weight",
        "k_norm": block + "attention.key_layernorm.weight",
        "o": block + "attention.dense.weight",
        "ffn_norm": block + "post_attention_layernorm.weight",
        "gate": block + "mlp.gate_proj.weight",
        "up": block + "mlp.up_proj.weight",
        "down": block + "mlp.down_proj.weight",
        "router": block + "mlp.gate.weight",
        "expert_bias": block + "mlp.gate.expert_bias",
        "expert": block + "mlp.experts.{e}.{proj}.weight",
        "shared": block + "mlp.shared_experts.{proj}.weight",
    }


NAMES = {"llada": llada_names, "dream": dream_names, "llada-moe": llada_moe_names, "llada2": llada2_names}


def tensor_names(cfg: ModelConfig) -> dict:
    return NAMES[cfg.family](cfg)


def _ffn_shapes(cfg: ModelConfig, names: dict, i: int) -> dict[str, tuple[int, ...]]:
    """The feed-forward tensors of layer i: a dense SwiGLU, or router + experts (+ shared expert)."""
    d = cfg.d_model
    if cfg.moe is None or not cfg.moe.is_moe_layer(i):
        f = cfg.mlp_hidden
        return {names[key].format(i=i): shape for key, shape in
                (("gate", (f, d)), ("up", (f, d)), ("down", (d, f)))}
    moe = cfg.moe
    shapes = {names["router"].format(i=i): (moe.n_experts, d)}
    if moe.expert_bias:
        shapes[names["expert_bias"].format(i=i)] = (moe.n_experts,)
    for e in range(moe.n_experts):
        shapes.update(_swiglu_shapes(names["expert"], i, moe.expert_hidden, d, e))
    if moe.n_shared_experts:
        shapes.update(_swiglu_shapes(names["shared"], i, moe.n_shared_experts * moe.shared_hidden, d))
    return shapes


def _swiglu_shapes(pattern: str, i: int, f: int, d: int, e: int | None = None) -> dict[str, tuple[int, ...]]:
    return {pattern.format(i=i, e=e, proj=proj): shape for proj, shape in
            (("gate_proj", (f, d)), ("up_proj", (f, d)), ("down_proj", (d, f)))}


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs with its shape, so a wrong checkpoint fails before any math runs."""
    names, d = tensor_names(cfg), cfg.d_model
    q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {names["embed"]: (cfg.vocab_size, d), names["final_norm"]: (d,)}
    if names["lm_head"]:
        shapes[names["lm_head"]] = (cfg.vocab_size, d)
    for i in range(cfg.n_layers):
        # Keep this order: engine/tiny.py draws its random weights in it, so the tiny models stay the same
        per = {"attn_norm": (d,)}
        if "qkv" in names:
            per["qkv"] = (q_out + 2 * kv_out, d)
        else:
            per.update({"q": (q_out, d), "k": (kv_out, d), "v": (kv_out, d)})
        per.update({"o": (d, q_out), "ffn_norm": (d,)})
        for key, shape in per.items():
            shapes[names[key].format(i=i)] = shape
        shapes.update(_ffn_shapes(cfg, names, i))
        extra = {}
        if cfg.qkv_bias:
            extra.update({"qkv_bias": (q_out + 2 * kv_out,)} if "qkv" in names else
                         {"q_bias": (q_out,), "k_bias": (kv_out,), "v_bias": (kv_out,)})
        if cfg.qk_norm:
            extra.update({"q_norm": (cfg.head_dim,), "k_norm": (cfg.head_dim,)})
        for key, shape in extra.items():
            shapes[names[key].format(i=i)] = shape
    return shapes


def model_from_state(
    cfg: ModelConfig,
    state: Mapping[str, torch.Tensor],
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> DiffusionLM:
    """Build the model from a name -> tensor mapping. Differentiable when the tensors require grad.
    Routed experts are stacked per layer into [E, 2F, D] (gate rows then up rows) and [E, D, F]."""
    names = tensor_names(cfg)

    def load(name: str, keep_dtype: torch.dtype | None = None) -> torch.Tensor:
        tensor = state[name]
        return tensor.to(device=device or tensor.device, dtype=keep_dtype or dtype or tensor.dtype)

    def get(key: str, i: int | None = None) -> torch.Tensor:
        return load(names[key].format(i=i) if i is not None else names[key])

    def swiglu(pattern: str, i: int, e: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        part = {proj: load(pattern.format(i=i, e=e, proj=proj)) for proj in ("gate_proj", "up_proj", "down_proj")}
        return torch.cat([part["gate_proj"], part["up_proj"]]), part["down_proj"]

    layers = []
    for i in range(cfg.n_layers):
        if "qkv" in names:
            w_qkv, bias = get("qkv", i), get("qkv_bias", i) if cfg.qkv_bias else None
        else:
            w_qkv = torch.cat([get("q", i), get("k", i), get("v", i)])
            bias = torch.cat([get("q_bias", i), get("k_bias", i), get("v_bias", i)]) if cfg.qkv_bias else None
        moe, w_gate_up, w_down = None, None, None
        if cfg.moe is not None and cfg.moe.is_moe_layer(i):
            experts = [swiglu(names["expert"], i, e) for e in range(cfg.moe.n_experts)]
            moe = MoEWeights(router=get("router", i),
                             expert_bias=load(names["expert_bias"].format(i=i), torch.float32)
                             if cfg.moe.expert_bias else None,
                             w_gate_up=torch.stack([gate_up for gate_up, _ in experts]),
                             w_down=torch.stack([down for _, down in experts]))
            del experts
            if cfg.moe.n_shared_experts:
                w_gate_up, w_down = swiglu(names["shared"], i)
        else:
            w_gate_up, w_down = torch.cat([get("gate", i), get("up", i)]), get("down", i)
        layers.append(
            LayerWeights(
                attn_norm=get("attn_norm", i), w_qkv=w_qkv, b_qkv=bias, w_o=get("o", i),
                ffn_norm=get("ffn_norm", i), w_gate_up=w_gate_up, w_down=w_down,
                q_norm=get("q_norm", i) if cfg.qk_norm else None, k_norm=get("k_norm", i) if cfg.qk_norm else None,
                moe=moe,
            )
        )
    embed = get("embed")
    cos, sin = rope_tables(cfg.rope_dim, cfg.rope_theta, cfg.max_seq_len, embed.device)
    return DiffusionLM(
        config=cfg,
        embed=embed,
        layers=layers,
        final_norm=get("final_norm"),
        lm_head=embed if cfg.tie_embeddings else get("lm_head"),
        rope_cos=cos,
        rope_sin=sin,
    )


def model_from_llada_state(cfg: ModelConfig, state, device=None, dtype=None) -> DiffusionLM:
    if cfg.family != "llada":
        raise WeightsError(f"expected a LLaDA config, got {cfg.family}")
    return model_from_state(cfg, state, device, dtype)


def safetensor_files(folder: Path) -> list[Path]:
    """The shards named by model.safetensors.index.json, or every *.safetensors file in the folder."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            names = {str(name) for name in weight_map.values()}
        except (ValueError, OSError, AttributeError) as err:  # not JSON, not UTF-8, or not {"weight_map": {...}}
            raise WeightsError(f"{index} is not a readable safetensors index ({type(err).__name__}: "
                               f"{' '.join(str(err).split())[:120]})") from None
        if any(Path(name).is_absolute() or ".." in Path(name).parts for name in names):
            raise WeightsError(f"{index} names a shard outside the model folder")
        files = sorted(folder / name for name in names)
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise WeightsError(f"missing safetensors shard(s) in {folder}: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        hint = " (only pickle files found; flash-dllm-chat loads safetensors only)" if pickles else ""
        raise WeightsError(f"no *.safetensors weights in {folder}{hint}")
    return files


def read_state(folder: Path, wanted: dict[str, tuple[int, ...]], device: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    for path in safetensor_files(folder):
        try:
            with safe_open(str(path), framework="pt", device=device) as handle:
                for name in handle.keys():
                    if name in wanted:
                        state[name] = handle.get_tensor(name)
        except Exception as err:  # safetensors raises its own error type for truncated/corrupt headers
            raise WeightsError(f"cannot read {path.name}: truncated or corrupt safetensors ({err})") from None
    missing = [name for name in wanted if name not in state]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise WeightsError(f"weights in {folder} lack {', '.join(missing[:3])}{more}")
    for name, shape in wanted.items():
        if tuple(state[name].shape) != shape:
            raise WeightsError(f"{name} has shape {tuple(state[name].shape)}, config.json implies {shape}")
    return state


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPU (what the checkpoints ship in), fp32 on CPU (bf16 matmuls are slow and inexact there)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> DiffusionLM:
    folder = Path(folder)
    cfg = load_config(folder)
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    state = read_state(folder, expected_shapes(cfg), "cpu" if device.type == "cpu" else str(device))
    with torch.no_grad():
        model = model_from_state(cfg, state, device, dtype)
    del state
    return model
