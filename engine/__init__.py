"""The engine's public surface: everything the app, the benchmarks and other callers should need.

    from flash_dllm.engine import Engine, GenerationSettings, StepEvent

    engine = Engine.load("GSAI-ML/LLaDA-8B-Instruct")           # or a model folder
    results = engine.generate(["Hello"], GenerationSettings(), on_event=print, cancel=threading.Event())

The names resolve on first use (PEP 562), so `import flash_dllm.engine` imports neither torch nor
transformers and the command line's --help stays quick. Modules not named here are internal.
"""
from __future__ import annotations

import importlib

# public name -> the module that defines it
_EXPORTS = {
    # the facade
    "Engine": "flash_dllm.engine.engine",
    "EngineError": "flash_dllm.engine.engine",
    "pick_device": "flash_dllm.engine.engine",
    "keep_last_exchanges": "flash_dllm.engine.engine",
    "defaults_for": "flash_dllm.engine.families",
    # settings, results and the errors a caller can fix
    "GenerationSettings": "flash_dllm.engine.settings",
    "GenerationResult": "flash_dllm.engine.settings",
    "SettingsError": "flash_dllm.engine.settings",
    "validate": "flash_dllm.engine.settings",
    "block_length_for": "flash_dllm.engine.settings",
    "ACCEPTANCE_RULES": "flash_dllm.engine.settings",
    "CACHE_MODES": "flash_dllm.engine.settings",
    "PromptError": "flash_dllm.engine.tokenizer",
    "UnsupportedModelError": "flash_dllm.engine.config",
    # events, in the order a run sends them, and the canvas cell states
    "CanvasStart": "flash_dllm.engine.events",
    "StepEvent": "flash_dllm.engine.events",
    "SequenceDone": "flash_dllm.engine.events",
    "Finished": "flash_dllm.engine.events",
    "Failed": "flash_dllm.engine.events",
    "MASKED": "flash_dllm.engine.events",
    "COMMITTED": "flash_dllm.engine.events",
    "PADDING": "flash_dllm.engine.events",
    # a request in flight (Engine.submit)
    "Request": "flash_dllm.engine.requests",
    "RequestInfo": "flash_dllm.engine.requests",
    # the numbers of a run
    "tokens_per_second": "flash_dllm.engine.metrics",
    "tokens_per_forward": "flash_dllm.engine.metrics",
    "mean_step_ms": "flash_dllm.engine.metrics",
    "RunStats": "flash_dllm.engine.metrics",
    "MemoryTracker": "flash_dllm.engine.metrics",
    "MemorySnapshot": "flash_dllm.engine.metrics",
    "memory_snapshot": "flash_dllm.engine.metrics",
}
_MODULES = {
    "hub": "flash_dllm.engine.hub",  # models: the HF cache, downloads, the bundled models, memory fit
    "bench": "flash_dllm.engine.bench",  # `flash-dllm-chat bench`: decode and kernel benchmarks
}

__all__ = [*_EXPORTS, "METHODS", *_MODULES]


def _method_descriptions() -> dict[str, str]:
    """Decoding method name -> one-line description, in the order the UI lists them."""
    from flash_dllm.engine.settings import METHODS as registry

    return {name: getattr(method, "description", method) for name, method in registry.items()}


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name == "METHODS":
        value = _method_descriptions()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # resolved once; later lookups do not reach __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
