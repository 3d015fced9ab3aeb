"""What a training run writes: the LLaDA-format model folder, resumable checkpoints, the loss-curve plot.

The model folder is exactly what ``flash_dllm.engine.weights.load_model`` and ``Engine.load`` read:
config.json with LLaDA's keys, LLaDA tensor names in safetensors (one file, or shards under
``max_shard_bytes`` plus model.safetensors.index.json, because a device call returns files of at most 16 MiB),
and the tokenizer files with the chat template.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

MAX_SHARD_BYTES = 15_000_000  # under both 16 MB and 16 MiB


def llada_config(d_model: int, n_layers: int, n_heads: int, mlp_hidden: int, vocab_size: int,
                 ids: dict[str, int], max_sequence_length: int = 1024, rope_theta: float = 10000.0) -> dict:
    """config.json of a LLaDA-architecture model (the keys GSAI-ML/LLaDA-8B-Instruct uses)."""
    return {
        "model_type": "llada", "architectures": ["LLaDAModelLM"],
        "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_heads,
        "mlp_hidden_size": mlp_hidden, "vocab_size": vocab_size,
        "embedding_size": -(-vocab_size // 64) * 64,  # padded like LLaDA's 126464-row embedding
        "rope_theta": rope_theta, "rms_norm_eps": 1e-5, "max_sequence_length": max_sequence_length,
        "weight_tying": True, "include_bias": False, "include_qkv_bias": False,
        "activation_type": "silu", "block_type": "llama",
        "mask_token_id": ids["<|mdm_mask|>"], "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"], "bos_token_id": ids["<|startoftext|>"],
        "eot_token_id": ids["<|eot_id|>"], "torch_dtype": "bfloat16",
    }


def _natural_order(names):
    """wte, blocks in numeric order, ln_f: shards then hold whole layers in order."""
    def key(name: str):
        parts = name.split(".")
        block = int(parts[3]) if len(parts) > 3 and parts[2] == "blocks" else (-1 if "wte" in name else 10**9)
        return block, name
    return sorted(names, key=key)


def save_weights(folder: Path, state: dict[str, torch.Tensor], dtype=torch.bfloat16,
                 max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Write model.safetensors, or model-0000i-of-0000n.safetensors + index when over ``max_shard_bytes``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for old in list(folder.glob("model*.safetensors")) + list(folder.glob("model.safetensors.index.json")):
        old.unlink()
    tensors = {name: state[name].detach().to("cpu", dtype).contiguous() for name in _natural_order(state)}
    shards, current, size = [], {}, 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], str(folder / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    files, weight_map = [], {}
    for index, shard in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
        files.append(file)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2))
    return files


def save_model_folder(folder: str | Path, state: dict[str, torch.Tensor], config: dict, tokenizer,
                      dtype=torch.bfloat16, max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    """config.json + weights + tokenizer files: a folder that ``generate --model FOLDER`` loads."""
    from .bpe import save_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(config, torch_dtype=str(dtype).replace("torch.", ""))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_weights(folder, state, dtype, max_shard_bytes)
    save_tokenizer(tokenizer, folder)
    return folder


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Atomic write (temp file + rename) so a run killed mid-save keeps its previous checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict | None:
    path = Path(path)
    return torch.load(path, map_location="cpu", weights_only=False) if path.is_file() else None


def total_tokens(log: dict | None) -> int:
    """Training tokens of a run and of every run it was warm-started from."""
    if not log:
        return 0
    return log.get("summary", {}).get("tokens", 0) + total_tokens(log.get("previous"))


def _with_history(log: dict, key: str) -> list[dict]:
    """Rows of a warm-started run after those of the run(s) it started from, tokens counted on."""
    previous = log.get("previous")
    if not previous:
        return log.get(key, [])
    earlier = _with_history(previous, key)
    offset = total_tokens(previous)
    return earlier + [dict(row, tokens=row["tokens"] + offset) for row in log.get(key, [])]


def plot_curve(log: dict, path: str | Path) -> bool:
    """Training loss and per-family validation loss against tokens seen. False when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    train, val = _with_history(log, "train"), _with_history(log, "val")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        tokens = [row["tokens"] / 1e6 for row in train]
        axes[0].plot(tokens, [row["loss"] for row in train], label="1/t-weighted loss")
        axes[0].plot(tokens, [row["ce"] for row in train], label="CE per masked token")
    axes[0].set(xlabel="training tokens (M)", ylabel="nats", yscale="log", title="training")
    axes[0].legend()
    for family in (val[-1]["loss"] if val else {}):
        rows = [row for row in val if family in row["loss"]]
        axes[1].plot([row["tokens"] / 1e6 for row in rows], [row["loss"][family] for row in rows], label=family)
    axes[1].set(xlabel="training tokens (M)", ylabel="1/t-weighted loss", yscale="log",
                title="validation (held-out items)")
    if val:
        axes[1].legend()
    fig.suptitle(log.get("title", "tiny LLaDA-architecture MDM"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
