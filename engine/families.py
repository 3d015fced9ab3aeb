"""What each model family (and each known checkpoint) expects at generation time: the methods it supports,
its published generation defaults and the tokens that end an answer; and the catalogue of known repos.

Architecture lives in engine/config.py (parsed from config.json); this module is what config.json does not
say: the defaults the model's authors publish in their README / generate() call, and which of the engine's
decoding methods are valid for the family. The engine should read `defaults_for(config, name)` when a model
loads (to seed GenerationSettings through `settings_overrides`); which methods a model can decode is
settings.validate's to judge (settings.model_refusal: LLaDA2 is block-causal, only the block methods are exact).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from flash_dllm.engine.config import ModelConfig
from flash_dllm.engine.settings import BLOCK_METHODS, METHODS

ALL_METHODS = tuple(m for m in METHODS if m not in BLOCK_METHODS)  # what a bidirectional model can run
BLOCK_DIFFUSION = "block-diffusion"  # LLaDA2's block decoder (commits a block, caches it, moves on)


@dataclass(frozen=True)
class FamilyDefaults:
    """Published generation defaults of a family or checkpoint. ``block_length`` None: the authors decode
    the whole answer as one block (Dream's diffusion_generate); ``steps`` None: one token per step."""

    family: str
    methods: tuple[str, ...]  # decoding methods that are exact for this architecture
    gen_length: int
    block_length: int | None
    steps: int | None
    temperature: float
    threshold: float | None = None  # confidence threshold of the published parallel decoder, if it has one
    top_p: float | None = None
    algorithm: str = ""  # the published remasking / unmasking rule, in words
    end_tokens: tuple[str, ...] = ()  # token strings besides config.eos_id that end an answer
    source: str = ""  # where the numbers come from

    def settings_overrides(self) -> dict:
        """GenerationSettings fields these defaults set (the engine's own defaults fill the rest)."""
        block = self.block_length or self.gen_length
        out = {"gen_length": self.gen_length, "block_length": block, "temperature": self.temperature}
        if self.steps is not None:
            out["steps"] = self.steps
        if self.threshold is not None:
            out["threshold"] = self.threshold
        if self.methods and "flash-cache" not in self.methods:
            out["method"] = self.methods[0]
        return out


LING_END = ("<|role_end|>", "<|endoftext|>")  # the Ling tokenizer of LLaDA-MoE and LLaDA2

FAMILY_DEFAULTS: dict[str, FamilyDefaults] = {
    "llada": FamilyDefaults(
        "llada", ALL_METHODS, gen_length=128, block_length=32, steps=128, temperature=0.0,
        algorithm="low-confidence remasking, semi-autoregressive blocks, cfg 0", end_tokens=("<|eot_id|>",),
        source="GSAI-ML/LLaDA-8B-Instruct README / generate.py"),
    "dream": FamilyDefaults(
        "dream", ALL_METHODS, gen_length=512, block_length=None, steps=512, temperature=0.2, top_p=0.95,
        algorithm="entropy (diffusion_generate alg='entropy', alg_temp=0)",
        end_tokens=("<|im_end|>", "<|dlm_pad|>"), source="Dream-org/Dream-v0-Instruct-7B README"),
    "llada-moe": FamilyDefaults(
        "llada-moe", ALL_METHODS, gen_length=128, block_length=32, steps=128, temperature=0.0,
        algorithm="low-confidence remasking, semi-autoregressive blocks (LLaDA's generate)", end_tokens=LING_END,
        source="inclusionAI/LLaDA-MoE-7B-A1B-Instruct README"),
    "llada2": FamilyDefaults(
        "llada2", BLOCK_METHODS, gen_length=512, block_length=32, steps=None, temperature=0.0, threshold=0.95,
        algorithm="block diffusion: each 32-token block decoded with a 0.95 confidence threshold (at most 32 "
                  "steps), committed to the KV cache, then the next block; stops at EOS",
        end_tokens=LING_END, source="inclusionAI/LLaDA2.0-mini README (model.generate)"),
}


@dataclass(frozen=True)
class KnownModel:
    """A published checkpoint the app offers by name."""

    repo: str
    family: str
    geometry: str  # engine/geometry.py GEOMETRY key with its full-size shapes
    defaults: FamilyDefaults
    note: str = ""

    @property
    def n_params(self) -> int:
        from flash_dllm.engine.geometry import GEOMETRY

        return GEOMETRY[self.geometry].n_params

    @property
    def bf16_bytes(self) -> int:
        return 2 * self.n_params


def _known(repo: str, family: str, geometry: str, note: str = "", **changes) -> KnownModel:
    defaults = replace(FAMILY_DEFAULTS[family], **changes) if changes else FAMILY_DEFAULTS[family]
    return KnownModel(repo, family, geometry, defaults, note)


KNOWN_MODELS: dict[str, KnownModel] = {m.repo: m for m in (
    _known("GSAI-ML/LLaDA-8B-Instruct", "llada", "llada-8b"),
    _known("GSAI-ML/LLaDA-1.5", "llada", "llada-8b", "LLaDA-8B-Instruct after VRPO preference optimisation: "
           "the same architecture and tokenizer", source="GSAI-ML/LLaDA-1.5 README (LLaDA's generate)"),
    _known("Dream-org/Dream-v0-Instruct-7B", "dream", "dream-7b"),
    _known("Dream-org/Dream-Coder-v0-Instruct-7B", "dream", "dream-7b", "Dream's Qwen2 architecture, from "
           "Qwen2.5-Coder-7B", gen_length=768, steps=768, temperature=0.1,
           source="Dream-org/Dream-Coder-v0-Instruct-7B README"),
    _known("apple/DiffuCoder-7B-cpGRPO", "dream", "dream-7b", "Dream's Qwen2 architecture, coupled-GRPO tuned; "
           "answers end at <|dlm_pad|>", gen_length=256, steps=256, temperature=0.4,
           source="apple/ml-diffucoder README (Instruct usage)"),
    _known("inclusionAI/LLaDA-MoE-7B-A1B-Instruct", "llada-moe", "llada-moe"),
    _known("inclusionAI/LLaDA2.0-mini", "llada2", "llada2-mini", "16B parameters (1.4B active): about 32 GB "
           "at bf16, more than a 24 GB card holds"),
)}


def defaults_for(config: ModelConfig, name: str | None = None) -> FamilyDefaults:
    """The checkpoint's published defaults when ``name`` is a known repo of the same family, else the family's."""
    known = KNOWN_MODELS.get(str(name or "").strip())
    if known is not None and known.family == config.family:
        return known.defaults
    return FAMILY_DEFAULTS[config.family]
