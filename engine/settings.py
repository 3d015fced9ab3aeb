"""Generation settings, their validation, and the per-sequence result. One place defines what is legal."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from flash_dllm.engine.methods import block_causal_methods, default_end_rules, descriptions

METHODS = descriptions()  # name -> what it does (the registry, engine/methods.py, is the source)
BLOCK_METHODS = block_causal_methods()  # the methods of block-diffusion models (and only of those)
END_RULES = ("official", "stop")  # engine/sequence.py explains them
DREAM_ALGORITHMS = ("origin", "maskgit_plus", "topk_margin", "entropy")  # engine/dream_sampler.py
ACCEPTANCE_RULES = ("paper", "cumulative")
CACHE_MODES = ("dual", "prefix")
MIN_TEMPERATURE = 1e-3


class SettingsError(ValueError):
    """A setting out of range; the message names the setting and the legal range."""


@dataclass
class GenerationSettings:
    method: str = "flash-cache"
    gen_length: int = 128
    block_length: int = 32
    steps: int | None = None  # llada: total denoising steps (default gen_length: one token per step)
    threshold: float = 0.9  # fast-dllm / flash-cache commit rule
    temperature: float = 0.0
    cfg_scale: float = 0.0  # llada: classifier-free guidance
    seed: int | None = 0
    cache_mode: str = "dual"  # fast-dllm
    window: int = 16  # flash-cache: masked window
    lookahead: int = 48  # flash-cache: look-ahead masks recomputed but not committed
    track: int = 64  # flash-cache: tracked decoded tokens (-1 refreshes everything)
    gamma: float = 0.8  # flash-verify acceptance
    acceptance: str = "paper"
    max_candidates: int | None = None  # flash-verify: default window // 2
    use_chat_template: bool = True
    end_rule: str | None = None  # "official" | "stop"; None: the method's default (engine/methods.py)
    alg: str = "entropy"  # dream: which cells a step decodes (Dream's own demos and app use entropy)
    alg_temp: float = 0.0  # dream: > 0 draws the cells from softmax(confidence / alg_temp)
    top_p: float | None = None  # dream: nucleus filter before the softmax
    top_k: int | None = None  # dream: top-k filter before the softmax
    eps: float = 1e-3  # dream: the schedule's last time (timesteps = linspace(1, eps, steps + 1))

    def with_overrides(self, **changes) -> "GenerationSettings":
        known = {f.name for f in fields(self)}
        return replace(self, **{k: v for k, v in changes.items() if k in known and v is not None})

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def resolved_end_rule(self) -> str:
        return self.end_rule if self.end_rule is not None else default_end_rules().get(self.method, "stop")

    @property
    def n_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps is not None else self.gen_length

    @property
    def candidates_cap(self) -> int:
        return self.max_candidates if self.max_candidates is not None else max(1, self.window // 2)

    def seed_for(self, index: int) -> int:
        """Sampling seed of the index-th prompt of a call: consecutive seeds, so prompt 0 of a batch samples
        exactly what it samples alone, and equal prompts in one batch still sample differently."""
        return ((self.seed if self.seed is not None else 0) + index) & 0xFFFFFFFF


def block_length_for(max_tokens: int, preferred: int) -> int:
    """The block length used when the request names none: ``preferred`` when it divides ``max_tokens``, else the
    largest divisor of ``max_tokens`` below it, unless that is under a quarter of ``preferred`` (blocks that short
    decode nearly left to right), in which case the whole answer is one block."""
    if max_tokens % preferred == 0:
        return preferred
    divisor = max(d for d in range(1, min(preferred, max_tokens) + 1) if max_tokens % d == 0)
    return divisor if divisor * 4 >= preferred else max_tokens


def validate(settings: GenerationSettings, max_context: int | None = None, prompt_tokens: int | None = None,
             model_config=None) -> None:
    """Raise SettingsError with a one-line message for the first setting that is out of range (and, given the
    model's ModelConfig, for a method that cannot decode that model)."""
    s = settings
    if s.method not in METHODS:
        raise SettingsError(f"unknown method {s.method!r}; choose one of: {', '.join(METHODS)}")
    if model_config is not None:
        refusal = model_refusal(s.method in BLOCK_METHODS, s.block_length, model_config.block_size)
        if refusal is None and s.method in BLOCK_METHODS and model_config.shift_logits:
            refusal = f"method {s.method} needs a model that predicts each cell in place, not a shifted one (Dream)"
        if refusal:
            raise SettingsError(refusal)
    if s.method in BLOCK_METHODS and s.cfg_scale:
        raise SettingsError(f"method {s.method} has no classifier-free guidance: cfg scale must be 0")
    if s.gen_length < 1:
        raise SettingsError(f"gen length must be at least 1 (got {s.gen_length})")
    if s.block_length < 1:
        raise SettingsError(f"gen length {s.gen_length} must be a positive multiple of block length {s.block_length}")
    if s.gen_length % s.block_length:
        below = s.gen_length // s.block_length * s.block_length
        lengths = f"{below} or {below + s.block_length}" if below else f"{s.block_length}"
        raise SettingsError(f"gen length {s.gen_length} must be a positive multiple of block length {s.block_length}: "
                            f"use gen length {lengths}, or a block length that divides {s.gen_length}")
    if s.method == "dream":
        check_dream(s)
    else:
        check_no_dream_filters(s)
    if s.method != "dream" and s.steps is not None:
        if s.steps < s.n_blocks or s.steps > s.gen_length or s.steps % s.n_blocks:
            raise SettingsError(
                f"steps {s.steps} must be a multiple of the number of blocks ({s.n_blocks}) between {s.n_blocks} and {s.gen_length}"
            )
    for name in ("threshold", "temperature", "cfg_scale", "gamma"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SettingsError(f"{name.replace('_', ' ')} must be a finite number (got {value})")
    if not 0.0 < s.threshold <= 1.0:
        raise SettingsError(f"threshold must be in (0, 1] (got {s.threshold})")
    if s.temperature < 0 or 0 < s.temperature < MIN_TEMPERATURE:
        # logits / temperature overflows to inf below ~1e-37 (every token then ties); far earlier it is greedy
        raise SettingsError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE} (got {s.temperature})")
    if s.cfg_scale < 0:
        raise SettingsError(f"cfg scale must be >= 0 (got {s.cfg_scale})")
    if s.seed is not None and (isinstance(s.seed, bool) or not isinstance(s.seed, int) or not 0 <= s.seed < 2**64):
        raise SettingsError(f"seed must be an integer in [0, 2**64) (got {s.seed})")
    if s.cache_mode not in CACHE_MODES:
        raise SettingsError(f"cache mode must be one of {', '.join(CACHE_MODES)} (got {s.cache_mode!r})")
    if s.window < 1:
        raise SettingsError(f"window must be at least 1 (got {s.window})")
    if s.lookahead < 0:
        raise SettingsError(f"lookahead must be >= 0 (got {s.lookahead})")
    if s.track < -1:
        raise SettingsError(f"track must be -1 (refresh everything) or >= 0 (got {s.track})")
    if s.gamma <= 0:
        raise SettingsError(f"gamma must be > 0 (got {s.gamma}); above 1 accepts no draft")
    if s.acceptance not in ACCEPTANCE_RULES:
        raise SettingsError(f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)} (got {s.acceptance!r})")
    if s.end_rule is not None and s.end_rule not in END_RULES:
        raise SettingsError(f"end rule must be one of {', '.join(END_RULES)} (got {s.end_rule!r})")
    if s.method in BLOCK_METHODS and s.resolved_end_rule != "stop":
        raise SettingsError(f"end rule must be stop for {s.method} (a block-diffusion model's answer ends at its "
                            f"first end token, as LLaDA2's sampler ends it); got {s.end_rule!r}")
    if s.max_candidates is not None and s.max_candidates < 1:
        raise SettingsError(f"max candidates must be at least 1 (got {s.max_candidates})")
    if max_context is not None and prompt_tokens is not None:
        check_fits(s, max_context, prompt_tokens)


def model_refusal(block_method: bool, block_length: int | None, model_block: int | None) -> str | None:
    """Why a method cannot decode a model, or None. A block-diffusion model (config block_size: attention causal
    across blocks) decodes only with the block methods, in its own block size (its cache is exact only there);
    the other methods assume bidirectional attention, so a block method refuses a bidirectional model."""
    names = " or ".join(BLOCK_METHODS)
    if model_block and not block_method:
        return (f"this model is a block-diffusion model (attention causal across blocks of {model_block} "
                f"positions): decode it with {names}; the other methods need bidirectional attention")
    if block_method and not model_block:
        return (f"{names} decodes block-diffusion models only (attention causal across blocks, like LLaDA2); "
                f"this model attends bidirectionally: use {', '.join(m for m in METHODS if m not in BLOCK_METHODS)}")
    if block_method and block_length != model_block:
        return f"block length must be the model's block size {model_block} for {names} (got {block_length})"
    return None
def check_no_dream_filters(s: GenerationSettings) -> None:
    """Top-p and top-k filter Dream's sampler only: another method would ignore them, so they are refused there
    (a top-p of 1 filters nothing and passes)."""
    for name in ("top_p", "top_k"):
        value = getattr(s, name)
        if value is not None and not (name == "top_p" and value == 1):
            raise SettingsError(f"{name.replace('_', ' ')} filters method dream's sampling only; method {s.method} "
                                f"samples from the whole distribution at its temperature (got {value})")


def check_dream(s: GenerationSettings) -> None:
    """Dream's sampler has no blocks: any number of steps from 1 to the answer length."""
    if s.steps is not None and not 1 <= s.steps <= s.gen_length:
        raise SettingsError(f"steps {s.steps} must be between 1 and the gen length {s.gen_length}")
    if s.alg not in DREAM_ALGORITHMS:
        raise SettingsError(f"alg must be one of {', '.join(DREAM_ALGORITHMS)} (got {s.alg!r})")
    for name in ("alg_temp", "eps"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise SettingsError(f"{name.replace('_', ' ')} must be a finite number >= 0 (got {value})")
    if not 0 < s.eps < 1:
        raise SettingsError(f"eps must be in (0, 1) (got {s.eps})")
    if s.top_p is not None and (isinstance(s.top_p, bool) or not isinstance(s.top_p, (int, float))
                                or not 0 < s.top_p <= 1):
        raise SettingsError(f"top p must be in (0, 1] (got {s.top_p})")
    if s.top_k is not None and (isinstance(s.top_k, bool) or not isinstance(s.top_k, int) or s.top_k < 1):
        raise SettingsError(f"top k must be an integer >= 1 (got {s.top_k})")


def check_fits(settings: GenerationSettings, max_context: int, prompt_tokens: int) -> None:
    """Raise SettingsError when the prompt plus the answer exceed the model's context."""
    if prompt_tokens + settings.gen_length > max_context:
        raise SettingsError(
            f"prompt ({prompt_tokens} tokens) plus answer ({settings.gen_length}) exceeds the model's context of "
            f"{max_context} tokens"
        )


@dataclass
class GenerationResult:
    """One sequence's answer and the numbers behind it (JSON fields of `generate --json`)."""

    text: str
    token_ids: list[int]
    forward_passes: int
    steps: int
    elapsed_s: float
    tokens_per_s: float
    method: str
    model: str
    finish_reason: str = "eos"
    verify_passes: int = 0
    draft_passes: int = 0
    accepted_drafts: int = 0
    rejected_drafts: int = 0
    tokens_per_forward: float = 0.0
    kernels: str = "torch"
    prompt_tokens: int = 0
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)
