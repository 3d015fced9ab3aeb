"""The LLaDA SFT objective over a flat dict of LLaDA-named parameters, run through the engine's forward.

Every answer position (EOS padding included, so the model learns where to stop) is masked with probability
t, one t per sequence; the loss is the cross-entropy on masked positions weighted by 1/t, divided by the
number of answer positions. The prompt is never masked. ``model_from_llada_state`` + ``forward_hidden`` are
the inference code itself, so training and inference cannot drift apart.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from flash_dllm.engine.config import config_from_dict
from flash_dllm.engine.model import forward_hidden, lm_logits
from flash_dllm.engine.weights import expected_shapes, model_from_llada_state


def init_params(config: dict, seed: int, device) -> dict[str, torch.Tensor]:
    """N(0, 0.02) matrices, output projections scaled by 1/sqrt(2 layers), norms at one (fp32 masters)."""
    gen = torch.Generator().manual_seed(seed)
    scale = 0.02 / math.sqrt(2 * config["n_layers"])
    params = {}
    for name, shape in expected_shapes(config_from_dict(config)).items():
        if len(shape) == 1:
            value = torch.ones(shape)
        else:
            std = scale if name.endswith(("attn_out.weight", "ff_out.weight")) and ".blocks." in name else 0.02
            value = torch.randn(shape, generator=gen) * std
        params[name] = value.to(device).requires_grad_(True)
    return params


def loss_terms(params, model_cfg, mask_id: int, prompt, prompt_lens, answers, masked, t):
    """Per-row (weighted loss, summed CE on masked, correct argmax on masked, masked count)."""
    p_len, width = prompt.shape[1], answers.shape[1]
    noisy = torch.where(masked, torch.full_like(answers, mask_id), answers)
    ids = torch.cat([prompt, noisy], dim=1)
    columns = torch.arange(p_len + width, device=ids.device)
    key_mask = columns[None, :] >= (p_len - prompt_lens)[:, None]  # left padding is never attended
    model = model_from_llada_state(model_cfg, params)
    hidden = forward_hidden(model, ids, key_mask)[:, p_len:]  # logits only where the loss is
    logits = lm_logits(model, hidden).float()
    ce = F.cross_entropy(logits.transpose(1, 2), answers, reduction="none")  # [B, W]
    maskf = masked.float()
    weighted = (ce * maskf / t[:, None]).sum(1) / width
    correct = ((logits.argmax(-1) == answers) & masked).sum(1)
    return weighted, (ce * maskf).sum(1).detach(), correct, masked.sum(1)


def masked_diffusion_loss(params, model_cfg, mask_id: int, prompt, prompt_lens, answers, t):
    """Training loss of one batch: draws the masks, returns (loss, CE sum, correct, masked count)."""
    masked = torch.rand(answers.shape, device=answers.device) < t[:, None]
    weighted, ce, correct, count = loss_terms(params, model_cfg, mask_id, prompt, prompt_lens, answers, masked, t)
    return weighted.mean(), ce.sum(), correct.sum(), count.sum()


def stratified_t(batch: int, eps: float, device, generator=None) -> torch.Tensor:
    """Mask ratios in [eps, 1): one random shift of an even grid (each row still uniform, less variance)."""
    u = torch.rand((), generator=generator).to(device)
    grid = torch.arange(batch, device=device) / batch
    return eps + (1 - eps) * torch.remainder(u + grid, 1.0)
