"""The decoding methods, in one registry that everything reads (settings validation, --help, the engine, the
benchmark, the evaluator).

A method is put together from three parts, each with its own documented call order:
  * a commit rule (engine/strategies.py on the host, `select` in engine/device_plan.py on the device);
  * a refresh policy: which positions a step recomputes (engine/refresh.py; `plan` on the device);
  * optionally a verifier: Flash-Verify's draft-and-verify pass after the commit (engine/verify.py,
    engine/device_verify.py), which the loop calls when the method has one.
`build_device` gives the production decoder's method (tensor operations, CUDA-graph friendly) and
`build_reference` the host reference it is tested against.

Which methods decode which family: bidirectional models (LLaDA-8B, LLaDA-1.5, Dream) take llada, fast-dllm,
flash-cache and flash-verify (Flash-Cache's selective refresh exists because bidirectional K/V go stale);
block-diffusion models (LLaDA2: ModelConfig.block_size, attention causal across blocks) take only the
`block_causal` methods, whose committed blocks are cached exactly and never refreshed. settings.model_refusal
words the refusal of every other pairing.

`end_rule` is the method's default end rule
(engine/sequence.py explains both): the published samplers' own for the methods that reproduce published code
token for token, the early stop for Flash-dLLM's methods (whose published code stops at the end token too).
Importing this module imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Method:
    name: str
    description: str
    build_device: Callable  # (settings, canvas, shift) -> device_plan.DeviceMethod
    build_reference: Callable  # (settings, shift) -> (strategies.Strategy, refresh.RefreshPolicy)
    verify: bool = False  # Flash-Verify's pass follows each step's commit
    # Decodes block-diffusion models (ModelConfig.block_size: attention causal across blocks), and only those.
    block_causal: bool = False
    # Its own host reference decoder (model, ops, settings, states, emit, piece, cancel), instead of the shared
    # one (engine/host_reference.py) built from build_reference's strategy and refresh policy.
    host_reference: Callable | None = None
    end_rule: str = "stop"  # default of GenerationSettings.end_rule: "official" | "stop"
    # Reads out every answer cell each step: a session's canvas must be no wider than its answer length.
    whole_answer_readout: bool = False


def _bound(method, s, canvas):
    method.bind(canvas, s.resolved_end_rule == "official")
    return method


def _llada_device(s, canvas, shift):
    from flash_dllm.engine.device_plan import LladaTopK

    method = LladaTopK(canvas, s.block_length, s.total_steps // s.n_blocks, s.cfg_scale, shift, s.gen_length)
    return _bound(method, s, canvas)


def _llada_reference(s, shift):
    from flash_dllm.engine.refresh import Everything
    from flash_dllm.engine.strategies import LowConfidenceTopK

    return LowConfidenceTopK(s.block_length, s.total_steps // s.n_blocks), Everything()


def _fast_dllm_device(s, canvas, shift):
    from flash_dllm.engine.device_plan import FastDllm

    return _bound(FastDllm(canvas, s.block_length, s.cache_mode, shift), s, canvas)


def _fast_dllm_reference(s, shift):
    from flash_dllm.engine.refresh import FastDllmPolicy
    from flash_dllm.engine.strategies import BlockThreshold

    strategy = BlockThreshold(s.block_length, s.threshold)
    return strategy, FastDllmPolicy(strategy, s.cache_mode, shift)


def _flash_cache_device(s, canvas, shift):
    from flash_dllm.engine.device_plan import FlashCache

    return _bound(FlashCache(canvas, s.window, s.lookahead, s.track, shift), s, canvas)


def _flash_cache_reference(s, shift):
    from flash_dllm.engine.refresh import FlashCachePolicy
    from flash_dllm.engine.strategies import WindowThreshold

    return WindowThreshold(s.window, s.threshold), FlashCachePolicy(s.lookahead, s.track, shift)


def _block_device(s, canvas, shift):
    from flash_dllm.engine.block_diffusion import BlockDiffusion

    return _bound(BlockDiffusion(canvas, s.block_length, s.total_steps // s.n_blocks, shift), s, canvas)


def _block_reference(model, ops, s, states, emit, piece, cancel):
    from flash_dllm.engine.block_diffusion_reference import run_block_reference

    return run_block_reference(model, s, states, emit, piece, cancel)


def _no_strategy(s, shift):
    raise TypeError("block-diffusion's host reference is its own decoder (Method.host_reference)")
def _dream_device(s, canvas, shift):
    from flash_dllm.engine.dream_sampler import DreamDevice

    return _bound(DreamDevice(canvas, s, shift), s, canvas)


def _dream_reference(s, shift):
    from flash_dllm.engine.dream_sampler import DreamSchedule
    from flash_dllm.engine.refresh import Everything

    return DreamSchedule(s), Everything()


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("llada", "LLaDA reference: full forward every step, semi-autoregressive blocks, top-k low-confidence "
                    "remasking", _llada_device, _llada_reference, end_rule="official"),
    Method("fast-dllm", "Fast-dLLM: block KV cache (dual or prefix) with confidence-threshold parallel decoding",
           _fast_dllm_device, _fast_dllm_reference, end_rule="official"),
    Method("flash-cache", "Flash-Cache: sliding masked window, look-ahead masks and attention-tracked tokens; the "
                          "rest from cache", _flash_cache_device, _flash_cache_reference),
    Method("flash-verify", "Flash-Cache + Flash-Verify: the model drafts low-confidence tokens and verifies them "
                           "itself", _flash_cache_device, _flash_cache_reference, verify=True),
    Method("block-diffusion", "Block diffusion (LLaDA2 and other block-causal models only): committed blocks cached "
                              "once, the current block denoised by threshold", _block_device, _no_strategy,
           block_causal=True, host_reference=_block_reference),
    Method("block-diffusion-verify", "Block diffusion + Flash-Verify inside the block (block-causal models only)",
           _block_device, _no_strategy, verify=True, block_causal=True, host_reference=_block_reference),
    Method("dream", "Dream's diffusion_generate: full forward every step, no blocks, `steps` steps on an eps "
                    "schedule, cells chosen by --alg (origin, maskgit_plus, topk_margin, entropy)",
           _dream_device, _dream_reference, end_rule="official", whole_answer_readout=True),
)}


def block_causal_methods() -> tuple[str, ...]:
    return tuple(name for name, method in METHODS.items() if method.block_causal)


def descriptions() -> dict[str, str]:
    return {name: method.description for name, method in METHODS.items()}


def default_end_rules() -> dict[str, str]:
    return {name: method.end_rule for name, method in METHODS.items()}
