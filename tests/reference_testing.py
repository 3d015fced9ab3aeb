"""Helpers of the independent float64 references of the model forwards (written from the published
architectures, not from engine code)."""
from __future__ import annotations

import json

import torch
from safetensors.torch import load_file


def read_checkpoint(folder):
    """config.json and every tensor of a model folder, in float64."""
    raw = json.loads((folder / "config.json").read_text())
    state = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update({k: v.double() for k, v in load_file(str(path)).items()})
    return raw, state


def rms(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight
