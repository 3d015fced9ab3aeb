"""Presets and the raw knobs behind them: the one place that turns UI values into GenerationSettings.

"balanced" is the engine's defaults. "fast" commits more per step (lower confidence threshold, wider window,
smaller refresh budget, half the LLaDA steps); "quality" commits less per step and refreshes more.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from flash_dllm.engine import GenerationSettings, SettingsError, validate

_DEFAULTS = GenerationSettings()

# Knob names in UI order; each is a GenerationSettings field (steps / max_candidates: 0 means automatic).
KNOBS = ("gen_length", "block_length", "steps", "threshold", "gamma", "temperature", "window", "lookahead",
         "track", "max_candidates", "seed")

PRESETS: dict[str, dict] = {
    "fast": dict(block_length=32, threshold=0.7, window=32, lookahead=32, track=32, gamma=0.6, steps_fraction=0.5),
    "balanced": dict(block_length=_DEFAULTS.block_length, threshold=_DEFAULTS.threshold, window=_DEFAULTS.window,
                     lookahead=_DEFAULTS.lookahead, track=_DEFAULTS.track, gamma=_DEFAULTS.gamma, steps_fraction=1.0),
    "quality": dict(block_length=32, threshold=0.95, window=8, lookahead=64, track=128, gamma=0.9, steps_fraction=1.0),
}
DEFAULT_PRESET = "balanced"


@dataclass(frozen=True)
class Knob:
    """Range and step of a knob's UI control (the engine's validate() stays the judge of legality)."""

    minimum: float
    maximum: float
    step: float
    info: str


KNOB_RANGES = {
    "gen_length": Knob(8, 1024, 8, "answer length in tokens (the canvas size); a multiple of the block length"),
    "block_length": Knob(4, 1024, 4, "semi-autoregressive block (llada, fast-dllm); one block: the answer length"),
    "steps": Knob(0, 1024, 1, "llada denoising steps; 0 = one token per step"),
    "threshold": Knob(0.05, 1.0, 0.01, "commit cells whose confidence is at least this"),
    "gamma": Knob(0.05, 1.5, 0.01, "γ: Flash-Verify acceptance (higher accepts fewer drafts)"),
    "temperature": Knob(0.0, 2.0, 0.05, "0 = greedy"),
    "window": Knob(1, 256, 1, "flash-cache: masked cells decoded together"),
    "lookahead": Knob(0, 512, 1, "flash-cache: masked cells after the window that are recomputed"),
    "track": Knob(-1, 1024, 1, "flash-cache: decoded tokens refreshed per step (-1 = all)"),
    "max_candidates": Knob(0, 128, 1, "flash-verify: drafts per step; 0 = window / 2"),
    "seed": Knob(0, 2**31 - 1, 1, "sampling seed (temperature > 0)"),
}


def preset_values(name: str, gen_length: int | None = None) -> dict:
    """Knob values of a preset (only the knobs a preset sets; answer length stays the user's)."""
    if name not in PRESETS:
        raise SettingsError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    preset = dict(PRESETS[name])
    fraction = preset.pop("steps_fraction")
    steps = 0
    if fraction < 1.0 and gen_length:
        blocks = max(1, int(gen_length) // preset["block_length"])
        steps = max(blocks, int(gen_length * fraction) // blocks * blocks)
    preset["steps"] = steps
    return preset


def matching_preset(gen_length, values: dict, skip: tuple = ()) -> str | None:
    """The preset whose knob values ``values`` holds (the knobs in ``skip`` not compared), else None: a knob set
    by hand leaves no preset marked that no longer describes the knobs."""
    def same(a, b) -> bool:
        try:
            return abs(float(a) - float(b)) < 1e-9
        except (TypeError, ValueError):
            return False

    for name in PRESETS:
        expected = preset_values(name, gen_length)
        if all(same(values.get(knob), value) for knob, value in expected.items() if knob not in skip):
            return name
    return None


def default_knobs() -> dict:
    values = {name: getattr(_DEFAULTS, name) for name in KNOBS}
    values.update(preset_values(DEFAULT_PRESET, _DEFAULTS.gen_length))
    values["max_candidates"] = 0
    values["seed"] = _DEFAULTS.seed or 0
    return values


def _float(name: str, value) -> float:
    """A knob's value as a finite float; a SettingsError that names the knob otherwise (an API client can send
    text, a list or NaN where the page's slider sends a number)."""
    label = name.replace("_", " ")
    if value is None or value == "":
        raise SettingsError(f"{label} is empty")
    if isinstance(value, bool):
        raise SettingsError(f"{label} must be a number (got {value})")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{label} must be a number (got {str(value)[:40]!r})") from None
    if not math.isfinite(number):
        raise SettingsError(f"{label} must be a finite number (got {value})")
    return number


def _int(name: str, value) -> int:
    number = _float(name, value)
    if number != int(number):
        raise SettingsError(f"{name.replace('_', ' ')} must be a whole number (got {value})")
    return int(number)


def build_settings(method: str, **knobs) -> GenerationSettings:
    """UI values -> validated GenerationSettings; raises SettingsError with a one-line message."""
    values = {}
    for name in ("gen_length", "block_length", "window", "lookahead", "track"):
        if knobs.get(name) is not None:
            values[name] = _int(name, knobs[name])
    for name in ("threshold", "gamma", "temperature"):
        if knobs.get(name) is not None:
            values[name] = _float(name, knobs[name])
    if knobs.get("steps") is not None:
        steps = _int("steps", knobs["steps"])
        values["steps"] = steps if steps > 0 else None
    if knobs.get("max_candidates") is not None:
        cands = _int("max_candidates", knobs["max_candidates"])
        values["max_candidates"] = cands if cands > 0 else None
    if knobs.get("seed") not in (None, ""):
        values["seed"] = _int("seed", knobs["seed"])
    if method is not None and not isinstance(method, str):
        raise SettingsError(f"method must be a method's name (got {str(method)[:40]!r})")
    settings = GenerationSettings(method=method or _DEFAULTS.method)
    settings = GenerationSettings(**{**settings.to_dict(), **values})
    validate(settings)
    return settings
