"""Dream's published sampler (`diffusion_generate` in Dream's generation_utils.py) as the method `dream`.

No blocks: every masked cell of the answer competes at every step, and every position is recomputed (Dream's
code has no cache). Step i of `steps` (t = timesteps[i], s = timesteps[i + 1], timesteps = linspace(1, eps,
steps + 1) in fp32):
  * origin        each masked cell is decoded with probability 1 - s / t (all of them at the last step), with
                  the token sampled (or, greedy, the most probable); the order is random by design.
  * maskgit_plus  confidence = probability of the chosen token;
    topk_margin   confidence = top-1 minus top-2 probability;
    entropy       confidence = sum p log(p + 1e-10) (the negative entropy);
                  commit the int(n_masked * (1 - s / t)) most confident cells (all of them at the last step);
                  with alg_temp > 0 the cells are drawn without replacement from softmax(confidence / alg_temp)
                  instead (here by the Gumbel top-k trick: the same distribution).
Probabilities come from the logits divided by the temperature (when > 0) and filtered by top-p / top-k, in the
logits' own dtype, as Dream's code computes them; confidences are ranked in that dtype too (ties to the
earlier cell, as torch.topk on CUDA). A chosen cell whose token is [MASK] stays masked (as in Dream's code).
Random draws (the token at temperature > 0, origin's per-cell decision, alg_temp's order) use the keyed
noise of engine/sampling.py, so a sequence samples the same alone or in a batch; the distributions are
Dream's, the draws are not torch's.

The device method and the host reference share `dream_predict` (how logits become tokens and confidences,
as `predict` is shared by the other methods) and differ in how they select: tensors for all slots here,
plain lists in DreamSchedule.
"""
from __future__ import annotations

import torch

from flash_dllm.engine.device_canvas import DeviceCanvas
from flash_dllm.engine.device_plan import DeviceMethod, first_cells, top_k_select
from flash_dllm.engine.packing import QueryPlan
from flash_dllm.engine.sampling import Predictions, noise_keys, uniform_noise
from flash_dllm.engine.sequence import SequenceState

ALGORITHMS = ("origin", "maskgit_plus", "topk_margin", "entropy")
ORIGIN_PASS, ORDER_PASS = 2, 3  # noise pass ids (engine/sampling.py uses 0 and 1 for tokens)


def transfer_ratios(steps: int, eps: float) -> list[float]:
    """Per step, the fp32 value of 1 - s / t that Dream's code multiplies the mask count by (1.0 at the last
    step). Computed on the CPU once, so every device uses the same numbers."""
    timesteps = torch.linspace(1, eps, steps + 1, dtype=torch.float32)
    ratios = (1 - timesteps[1:] / timesteps[:-1]).tolist()
    return ratios[:-1] + [1.0]


def transfer_count(masked: int, ratio: float) -> int:
    """int(n * ratio) in fp32, as Dream's code computes it (its n is a float32 tensor)."""
    return int((torch.tensor(float(masked), dtype=torch.float32) * torch.tensor(ratio, dtype=torch.float32)).item())


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most probable tokens whose probabilities reach top_p (always the first)."""
    ordered, order = torch.sort(logits, descending=True)
    beyond = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1) > top_p
    beyond = torch.cat([torch.zeros_like(beyond[..., :1]), beyond[..., :-1]], dim=-1)
    drop = torch.zeros_like(beyond).scatter(-1, order, beyond)
    return logits.masked_fill(drop, torch.finfo(logits.dtype).min)


def filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def dream_predict(logits: torch.Tensor, alg: str, temperature: torch.Tensor | None, keys: torch.Tensor | None,
                  top_p: float | None, top_k: int | None) -> Predictions:
    """logits [M, V] (the model's dtype) -> tokens and Dream's confidence of `alg` (float64 holding values of
    the logits' dtype). temperature: [M] float64 or None (greedy)."""
    scaled = logits
    if temperature is not None:
        hot = temperature > 0
        divisor = torch.where(hot, temperature, 1.0).to(torch.float32)[:, None]
        scaled = torch.where(hot[:, None], (logits.float() / divisor).to(logits.dtype), logits)
    if top_p is not None and top_p < 1:
        scaled = filter_top_p(scaled, top_p)
    if top_k is not None:
        scaled = filter_top_k(scaled, top_k)
    probs = torch.softmax(scaled, dim=-1)
    confidence, tokens = probs.max(dim=-1)
    if temperature is not None:
        gumbel = -torch.log(-torch.log(uniform_noise(keys, logits.shape[-1])))
        sampled = torch.argmax(torch.log(probs.double()) + gumbel, dim=-1)
        tokens = torch.where(temperature > 0, sampled, tokens)
        confidence = probs.gather(-1, tokens[:, None])[:, 0]
    if alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        confidence = top2[:, 0] - top2[:, 1]
    elif alg == "entropy":
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return Predictions(tokens=tokens, confidences=confidence.double())


def origin_uniforms(seed: torch.Tensor, step: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
    """[S, R] fp32 uniforms of origin's per-cell decision (Dream: torch.rand, compared in fp32)."""
    keys = noise_keys(seed[:, None], step[:, None], ORIGIN_PASS, cells.clamp(min=0)).reshape(-1)
    return uniform_noise(keys, 1).view(cells.shape).float()


def order_keys(confidences: torch.Tensor, seed: torch.Tensor, step: torch.Tensor, cells: torch.Tensor,
               alg_temp: float) -> torch.Tensor:
    """Gumbel top-k keys: the top q of confidence / alg_temp + Gumbel are a draw of q cells without
    replacement from softmax(confidence / alg_temp), the distribution of Dream's torch.multinomial."""
    keys = noise_keys(seed[:, None], step[:, None], ORDER_PASS, cells.clamp(min=0)).reshape(-1)
    gumbel = -torch.log(-torch.log(uniform_noise(keys, 1).view(cells.shape)))
    return confidences / alg_temp + gumbel


class DreamSettings:
    """The parts of GenerationSettings Dream's sampler reads."""

    def __init__(self, s):
        self.alg, self.alg_temp, self.top_p, self.top_k = s.alg, s.alg_temp, s.top_p, s.top_k
        self.steps = s.steps if s.steps is not None else s.gen_length
        self.ratios = transfer_ratios(self.steps, s.eps)


class DreamDevice(DeviceMethod):
    """Dream's sampler for all slots at once: a full forward each step, every masked cell a candidate."""

    def __init__(self, canvas: DeviceCanvas, settings, shift: bool):
        self.dream = DreamSettings(settings)
        self.shift = shift
        self.steady_rows = canvas.slot_len
        self.readout = canvas.width
        self.step_limit = self.dream.steps
        self.ratios = torch.tensor(self.dream.ratios, dtype=torch.float32, device=canvas.tokens.device)

    def plan(self, canvas: DeviceCanvas) -> QueryPlan:
        position = canvas.positions
        in_query = (position < canvas.total_len()[:, None]) & canvas.active[:, None]
        return QueryPlan(in_query=in_query, cells=first_cells(canvas.masked(), self.readout))

    def predict(self, logits, temperature, keys, cells=None) -> Predictions:
        d = self.dream
        return dream_predict(logits, d.alg, temperature, keys, d.top_p, d.top_k)

    def select(self, canvas: DeviceCanvas, plan: QueryPlan, preds: Predictions) -> torch.Tensor:
        cells = plan.cells
        valid = cells >= 0
        step = canvas.steps.clamp(max=self.step_limit - 1)
        ratio = self.ratios[step]
        last = step == self.step_limit - 1
        if self.dream.alg == "origin":
            decide = origin_uniforms(canvas.seed, canvas.steps, cells) < ratio[:, None]
            return valid & (decide | last[:, None])
        n = valid.sum(1)
        quota = torch.where(last, n, (n.float() * ratio).long())
        conf = preds.confidences.view(cells.shape)
        if self.dream.alg_temp:
            conf = order_keys(conf, canvas.seed, canvas.steps, cells, self.dream.alg_temp)
        return top_k_select(cells, conf, quota)


class DreamSchedule:
    """The host reference of the same rule (engine/strategies.py's Strategy protocol), on plain lists."""

    guards_progress = False  # a fixed number of steps: no step can repeat forever

    def __init__(self, settings):
        self.dream = DreamSettings(settings)
        self.seed_for = settings.seed_for

    def candidates(self, state: SequenceState) -> list[int]:
        return state.masked_cells()

    def select(self, state, cells, tokens, confidences) -> list[int]:
        if not cells:
            return []
        d = self.dream
        step = min(state.steps, d.steps - 1)
        last = step == d.steps - 1
        seed = torch.tensor([self.seed_for(state.index) & 0xFFFFFFFF])
        row = torch.tensor([cells])
        if d.alg == "origin":
            uniforms = origin_uniforms(seed, torch.tensor([state.steps]), row)[0].tolist()
            ratio = torch.tensor(d.ratios[step], dtype=torch.float32).item()
            return [i for i, u in enumerate(uniforms) if last or u < ratio]
        quota = len(cells) if last else transfer_count(len(cells), d.ratios[step])
        ranked = list(confidences)
        if d.alg_temp:
            ranked = order_keys(torch.tensor([confidences], dtype=torch.float64), seed, torch.tensor([state.steps]),
                                row, d.alg_temp)[0].tolist()
        order = sorted(range(len(cells)), key=lambda i: (-ranked[i], i))
        return sorted(order[:quota])

    def end_step(self, state: SequenceState) -> None:
        pass
