"""The LLaDA SFT objective over a flat dict of LLaDA-named parameters, run through the engine's forward.

Every answer position (EOS padding included, so the model learns where to stop) is masked with probability
t, one t per sequence; the loss is the cross-entropy on masked positions weighted by 1/t, divided by the
number of answer positions. The prompt is never masked.

The block view (a share of the rows, ``block_view_share``): the decoders fill the canvas one block at a
time, so every prediction they make sees a clean prefix, a partly masked current block and a fully masked
suffix. Under uniform masks that context is exponentially rare in the prefix length (a clean 60-token
prefix beside a masked suffix almost never occurs), so a small model never practises the case it is used
in. A block-view row keeps the answer before a random block boundary clean, masks the current block with
probability t (weighted 1/t, the same term as above restricted to the block), and masks everything after it
(the t = 1 term, weight 1). Both views are terms of the masked-diffusion bound on the same data.

``model_from_llada_state`` + ``forward_hidden`` are the inference code itself, so training and inference
cannot drift apart.
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


def loss_terms(params, model_cfg, mask_id: int, prompt, prompt_lens, answers, masked, t, weight=None):
    """Per-row (weighted loss, summed CE on masked, correct argmax on masked, masked count).

    ``weight`` [B, W]: the loss weight of each masked position (default 1/t of its row)."""
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
    weight = maskf / t[:, None] if weight is None else weight * maskf
    weighted = (ce * weight).sum(1) / width
    correct = ((logits.argmax(-1) == answers) & masked).sum(1)
    return weighted, (ce * maskf).sum(1).detach(), correct, masked.sum(1)


def draw_masks(answers, t, block_view_share: float = 0.0, block_length: int = 32):
    """(masked [B, W] bool, weight [B, W]): uniform masks, or for a ``block_view_share`` of the rows the
    block view (clean before a random block, masked with probability t inside it, masked after it)."""
    rows, width = answers.shape
    device = answers.device
    uniform = torch.rand(answers.shape, device=device) < t[:, None]
    weight = 1.0 / t[:, None].expand(rows, width)
    if block_view_share <= 0:
        return uniform, weight
    n_blocks = (width + block_length - 1) // block_length
    start = (torch.rand(rows, device=device) * n_blocks).floor().long().clamp_(max=n_blocks - 1) * block_length
    column = torch.arange(width, device=device)[None, :]
    in_block = (column >= start[:, None]) & (column < start[:, None] + block_length)
    after = column >= start[:, None] + block_length
    block_masked = (in_block & uniform) | after
    block_weight = torch.where(after, torch.ones_like(weight), weight)
    view = (torch.rand(rows, device=device) < block_view_share)[:, None]
    return torch.where(view, block_masked, uniform), torch.where(view, block_weight, weight)


def masked_diffusion_loss(params, model_cfg, mask_id: int, prompt, prompt_lens, answers, t,
                          block_view_share: float = 0.0, block_length: int = 32):
    """Training loss of one batch: draws the masks, returns (loss, CE sum, correct, masked count)."""
    masked, weight = draw_masks(answers, t, block_view_share, block_length)
    weighted, ce, correct, count = loss_terms(params, model_cfg, mask_id, prompt, prompt_lens, answers, masked, t,
                                              weight)
    return weighted.mean(), ce.sum(), correct.sum(), count.sum()


def stratified_t(batch: int, eps: float, device, generator=None) -> torch.Tensor:
    """Mask ratios in [eps, 1): one random shift of an even grid (each row still uniform, less variance)."""
    u = torch.rand((), generator=generator).to(device)
    grid = torch.arange(batch, device=device) / batch
    return eps + (1 - eps) * torch.remainder(u + grid, 1.0)
