"""What the page offers for the loaded model: the methods that can decode it and the starting knob values.

A block-diffusion model (config.block_size, LLaDA2) decodes only with the block methods, in its own block size;
every other model refuses those two. The engine's `validate` (given the model's config) is the judge: the page
offers exactly the methods it accepts, so it never leads a user to a refusal. The starting values of the knobs are the
checkpoint's (or its family's) published generation defaults (engine/families.py `defaults_for`).
"""
from __future__ import annotations

import html
from dataclasses import dataclass

from flash_dllm.app.presets import DEFAULT_PRESET, KNOB_RANGES, default_knobs, preset_values
from flash_dllm.engine import METHODS, GenerationSettings, SettingsError, validate
# The one name past the engine's public surface (tests/test_engine_facade.py flags it): the engine package must
# export defaults_for (engine/__init__.py _EXPORTS), then this line imports it from flash_dllm.engine.
from flash_dllm.engine import defaults_for

# The knobs a family's published defaults set (FamilyDefaults.settings_overrides), in the page's knob order.
FAMILY_KNOBS = ("gen_length", "block_length", "steps", "threshold", "temperature")
ENGINE_DEFAULT = GenerationSettings()
COMPARE_WITH = ("llada", "block-diffusion-verify")  # side by side's second method when the model can run it
# with no model loaded (and for an endpoint call naming no method before one is): the engine's defaults
DEFAULT_METHOD = ENGINE_DEFAULT.method
DEFAULT_METHOD_B = "llada" if "llada" in METHODS else DEFAULT_METHOD


@dataclass(frozen=True)
class ModelSettings:
    """The page's method choices and starting knob values for one loaded model."""

    model: str  # the name the model was loaded by (the key that tells a page its settings are stale)
    family: str
    methods: tuple[str, ...]  # the methods that can decode this model, in the registry's order
    method: str  # the method selected first
    method_b: str  # the side-by-side comparison's method
    knobs: dict  # FAMILY_KNOBS name -> starting value (steps 0: one token per step, as the slider says)
    block_size: int | None  # a block-diffusion model's block size: block length is fixed to it
    source: str  # where the starting values come from
    published: tuple[str, ...] = ()  # the FAMILY_KNOBS the published defaults set (the rest: the engine's)
    capped_at: int | None = None  # the model's context, when the published answer length was shortened to fit

    @property
    def preset(self) -> str | None:
        """The preset the page shows selected: the default one while the starting values agree with it, none when
        the published defaults differ (Dream's one-block answers, LLaDA2's threshold), so the radio never claims a
        preset the knobs do not hold."""
        balanced = preset_values(DEFAULT_PRESET, self.knobs["gen_length"])
        same = all(self.knobs[k] == balanced[k] for k in FAMILY_KNOBS if k in balanced)
        return DEFAULT_PRESET if same else None

    def note(self) -> str:
        """One line under the method: where the starting values come from, and why some methods are absent."""
        k = self.knobs
        length = f"answer {k['gen_length']} tokens" + (f" (half the model's context of {self.capped_at})"
                                                       if self.capped_at else "")
        block = f"blocks of {k['block_length']}" + (" (the model's block size, fixed)" if self.block_size else "")
        values = (f"{self.method}, {length}, {block}, temperature {k['temperature']:g}"
                  + (f", threshold {k['threshold']:g}" if "threshold" in self.published else ""))
        absent = [name for name in METHODS if name not in self.methods]
        if self.block_size:
            why = " A block-diffusion model (attention causal across blocks): only the block methods decode it."
        else:
            why = f" Not offered: {' and '.join(absent)}, which this model cannot decode." if absent else ""
        return (f"<div class='fd-note' id='model-defaults'>Starting values for this "
                f"{html.escape(self.family)}-family model: "
                f"{html.escape(values)}; from {html.escape(self.source)}.{html.escape(why)}</div>")


def methods_for(config) -> tuple[str, ...]:
    """The methods `validate` accepts for a model of this ModelConfig (a block model: in its own block size)."""
    block = config.block_size or ENGINE_DEFAULT.block_length
    out = []
    for name in METHODS:
        try:
            validate(GenerationSettings(method=name, gen_length=block, block_length=block), model_config=config)
        except SettingsError:
            continue
        out.append(name)
    return tuple(out)


def settings_for(config, name: str | None) -> ModelSettings:
    """The page's settings for a model of ``config`` loaded as ``name`` (a known repo gets its own defaults)."""
    defaults = defaults_for(config, name)
    published = defaults.settings_overrides()
    methods = methods_for(config)
    method = published.get("method", ENGINE_DEFAULT.method)
    if method not in methods:  # a family list that names a method the engine refuses: the first that works
        method = methods[0]
    others = [m for m in methods if m != method]
    method_b = next((m for m in COMPARE_WITH if m in others), others[0] if others else method)
    start = default_knobs()
    knobs = {name_: start[name_] for name_ in FAMILY_KNOBS}
    knobs.update({k: v for k, v in published.items() if k in FAMILY_KNOBS})
    if config.block_size:
        knobs["block_length"] = config.block_size
    steps = published.get("steps")
    knobs["steps"] = 0 if steps is None or steps == knobs["gen_length"] else steps  # 0: one token per step
    capped = cap_answer(knobs, config.max_seq_len, config.block_size)
    return ModelSettings(str(name or ""), config.family, methods, method, method_b, knobs, config.block_size,
                         defaults.source or f"the {config.family} family's defaults",
                         tuple(k for k in FAMILY_KNOBS if k in published), capped)


def cap_answer(knobs: dict, max_context: int | None, block_size: int | None) -> int | None:
    """Shorten a published answer length that would leave less than half the model's context for the prompt
    (small test models; the published checkpoints have room) to whole blocks of that half. Returns the context
    when it did, else None."""
    room = (max_context or 0) // 2
    if not room or knobs["gen_length"] <= room:
        return None
    one_block = knobs["block_length"] == knobs["gen_length"]  # Dream decodes the whole answer as one block
    block = block_size or (room if one_block else knobs["block_length"])
    knobs["gen_length"] = max(block, room // block * block)
    if one_block and not block_size:
        knobs["block_length"] = knobs["gen_length"]
    knobs["steps"] = 0
    return max_context


def knob_update(name: str, value, block_size: int | None) -> dict:
    """The slider update for one family knob: block length locked to a block model's block size, answer length
    stepping in whole blocks for such a model."""
    spec = KNOB_RANGES[name]
    if name == "block_length":
        if block_size:
            return dict(value=value, interactive=False, info=f"fixed: the model's block size ({block_size})")
        return dict(value=value, interactive=True, info=spec.info)
    if name == "gen_length":
        step = block_size or spec.step
        return dict(value=value, minimum=block_size or spec.minimum, step=step)
    return dict(value=value)


# ---------------------------------------------------------------------------- the page
# Components `follow_model` updates, in order (app/ui.py wires them; "knob:NAME" is the raw knob NAME's slider).
FOLLOW_OUTPUTS = ("settings_for", "method", "method_info", "method_b", *(f"knob:{k}" for k in FAMILY_KNOBS),
                  "model_defaults", "preset")


def page_settings(engine) -> ModelSettings | None:
    """The settings for the loaded engine (None when no model is loaded)."""
    return settings_for(engine.model.config, engine.name) if engine is not None else None


def follow_model(ctx, shown_for):
    """The method controls, family knobs and defaults line for the loaded model, when this page still shows
    another model's (``shown_for``: the model its settings follow); every output skipped otherwise, so a
    page's own edits stay until the model changes (a load, a download, or a switch from another page)."""
    import gradio as gr

    engine = ctx.host.engine
    settings = page_settings(engine)
    if settings is None or settings.model == shown_for:
        return tuple(gr.skip() for _ in FOLLOW_OUTPUTS)
    knobs = [gr.update(**knob_update(k, settings.knobs[k], settings.block_size)) for k in FAMILY_KNOBS]
    return (settings.model, gr.update(choices=list(settings.methods), value=settings.method),
            METHODS[settings.method], gr.update(choices=list(settings.methods), value=settings.method_b),
            *knobs, settings.note(), gr.update(value=settings.preset))


def fixed_block_length(engine) -> int | None:
    """The block length a block-diffusion engine decodes in (presets leave it alone), else None."""
    return engine.model.config.block_size if engine is not None else None
