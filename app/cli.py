"""`flash-dllm-chat`: the chat UI (no subcommand) and the `generate`, `pull`, `models`, `train-tiny` commands.

Heavy imports (torch, gradio) happen inside the command that needs them, so `generate` never loads gradio and
`--help` stays quick. A user's mistake (bad setting, missing model, offline, out of memory) ends with one
`error: ...` line on stderr and exit code 2; a traceback means a bug.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SUBCOMMANDS = ("generate", "pull", "models", "train-tiny")
EXIT_USAGE = 2


class CliError(Exception):
    """A mistake in the command line or its inputs, reported as one line."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # argparse would print the whole usage block first; one line is easier to read and to test
        self.exit(EXIT_USAGE, f"error: {message} (see {self.prog} --help)\n")


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    from flash_dllm.engine.settings import ACCEPTANCE_RULES, CACHE_MODES, METHODS, GenerationSettings

    d = GenerationSettings()
    p.add_argument("--model", help="Hugging Face repo id (org/name) or model folder; default: the last model used, "
                                   "else the bundled model")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="the user message")
    source.add_argument("--batch-file", type=Path, help="a file with one prompt per line, decoded as one batch")
    p.add_argument("prompt_text", nargs="?", metavar="PROMPT", help="the user message (same as --prompt)")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--method", choices=list(METHODS), help=f"decoding method (default {d.method})")
    p.add_argument("--gen-length", type=int, help=f"answer length in tokens (default {d.gen_length})")
    p.add_argument("--block-length", type=int, help=f"semi-autoregressive block length (default {d.block_length})")
    p.add_argument("--steps", type=int, help="llada: total denoising steps (default: the answer length)")
    p.add_argument("--threshold", type=float, help=f"confidence to commit a token, in (0, 1] (default {d.threshold})")
    p.add_argument("--temperature", type=float, help=f"sampling temperature; 0 is greedy (default {d.temperature})")
    p.add_argument("--cfg-scale", type=float, help=f"llada: classifier-free guidance scale (default {d.cfg_scale})")
    p.add_argument("--seed", type=int, help=f"seed for sampling (default {d.seed})")
    p.add_argument("--window", type=int, help=f"flash-cache: masked window (default {d.window})")
    p.add_argument("--lookahead", type=int, help=f"flash-cache: look-ahead masks (default {d.lookahead})")
    p.add_argument("--track", type=int,
                   help=f"flash-cache: tracked tokens; -1 refreshes everything (default {d.track})")
    p.add_argument("--gamma", type=float, help=f"flash-verify: acceptance threshold (default {d.gamma})")
    p.add_argument("--acceptance", choices=list(ACCEPTANCE_RULES), help=f"flash-verify rule (default {d.acceptance})")
    p.add_argument("--cache-mode", choices=list(CACHE_MODES), help=f"fast-dllm: KV cache mode (default {d.cache_mode})")
    p.add_argument("--device", default="auto", help="cuda, cuda:N, cpu or auto (default auto)")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp16", "fp32"], default="auto",
                   help="weights dtype (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--kernels", choices=["triton", "torch"], help="kernel path (default: triton on GPU, torch on CPU)")
    p.add_argument("--no-chat-template", action="store_true", help="feed the raw prompt (base models)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def build_parser() -> Parser:
    parser = Parser(prog="flash-dllm-chat",
                    description="Local chat with diffusion LLMs (LLaDA, Dream). "
                                "Without a command it starts the chat UI.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_generate_arguments(commands.add_parser("generate", help="answer a prompt (or a batch) in the terminal"))
    pull = commands.add_parser("pull", help="download a model into the Hugging Face cache")
    pull.add_argument("repo", help="Hugging Face repo id, e.g. GSAI-ML/LLaDA-8B-Instruct")
    models = commands.add_parser("models", help="list downloaded and bundled models")
    models.add_argument("--json", action="store_true", help="print JSON")
    commands.add_parser("train-tiny", help="train the bundled tiny model (arguments go to the trainer; see its --help)",
                        add_help=False)
    return parser


# ---- generate ------------------------------------------------------------------------------------------------
def read_prompts(args) -> list[str]:
    if args.batch_file is not None:
        try:
            lines = args.batch_file.read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise CliError(f"cannot read --batch-file {args.batch_file}: {err.strerror or err}") from None
        prompts = [line for line in lines if line.strip()]
        if not prompts:
            raise CliError(f"--batch-file {args.batch_file} holds no prompt (one prompt per line)")
        return prompts
    text = args.prompt_text
    if text is not None and (args.prompt is not None or args.batch_file is not None):
        raise CliError("give the prompt once: as PROMPT, --prompt TEXT or --batch-file FILE")
    if text is not None:
        args.prompt = text
    if args.prompt is None:
        raise CliError("give --prompt TEXT or --batch-file FILE")
    if not args.prompt.strip():
        raise CliError("the prompt is empty")
    return [args.prompt]


def settings_from(args):
    from flash_dllm.engine.settings import GenerationSettings

    return GenerationSettings().with_overrides(
        method=args.method, gen_length=args.gen_length, block_length=args.block_length, steps=args.steps,
        threshold=args.threshold, temperature=args.temperature, cfg_scale=args.cfg_scale, seed=args.seed,
        window=args.window, lookahead=args.lookahead, track=args.track, gamma=args.gamma,
        acceptance=args.acceptance, cache_mode=args.cache_mode, use_chat_template=not args.no_chat_template,
    )


def default_model() -> str:
    from flash_dllm.engine.hub import bundled_model_path
    from flash_dllm.engine.paths import last_model

    bundled = bundled_model_path()
    model = last_model() or (str(bundled) if bundled else None)
    if model is None:
        raise CliError("no model given and none bundled: pass --model ORG/NAME or a model folder")
    return model


def model_reference(model: str) -> str:
    """What to remember as the last model: a folder as an absolute path (so it works from any directory)."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


def stats_line(tokens: int, forwards: int, elapsed: float, method: str, kernels: str) -> str:
    per_forward = tokens / forwards if forwards else 0.0
    rate = tokens / elapsed if elapsed > 0 else 0.0
    return (f"[{tokens} tokens | {forwards} forward passes | {per_forward:.2f} tokens/forward | "
            f"{rate:.1f} tok/s | {elapsed:.2f} s | {method} | {kernels} kernels]")


def batch_summary(results, model: str) -> dict:
    tokens = sum(len(r.token_ids) for r in results)
    forwards = sum(r.forward_passes for r in results)
    elapsed = max(r.elapsed_s for r in results)  # one batch: every sequence shares the wall clock
    return {
        "model": model, "method": results[0].method, "kernels": results[0].kernels, "prompts": len(results),
        "tokens": tokens, "forward_passes": forwards, "elapsed_s": elapsed,
        "tokens_per_s": round(tokens / elapsed, 3) if elapsed > 0 else 0.0,
        "tokens_per_forward": round(tokens / forwards, 3) if forwards else 0.0,
        "results": [r.to_dict() for r in results],
    }


def run_generate(args) -> int:
    from flash_dllm.engine.engine import Engine, pick_device, pick_dtype
    from flash_dllm.engine.paths import remember_model
    from flash_dllm.engine.settings import validate
    from flash_dllm.kernels import resolve_backend

    prompts = read_prompts(args)
    settings = settings_from(args)
    validate(settings)  # before loading anything: a bad setting should not cost a download
    device = pick_device(args.device)
    pick_dtype(None if args.dtype == "auto" else args.dtype, device)
    resolve_backend(args.kernels, device)
    model = model_reference(args.model or default_model())
    engine = Engine.load(model, device=args.device, dtype=None if args.dtype == "auto" else args.dtype,
                         kernels=args.kernels)
    try:
        remember_model(model)
    except OSError:
        pass  # a read-only config folder must not cost the answer
    conversations = [
        [{"role": "system", "content": args.system}, {"role": "user", "content": p}] if args.system else p
        for p in prompts
    ]
    results = engine.generate(conversations, settings)
    if args.json:
        doc = results[0].to_dict() if args.batch_file is None else batch_summary(results, model)
        print(json.dumps(doc, ensure_ascii=False))
        return 0
    for index, result in enumerate(results):
        if len(results) > 1:
            print(f"### {index + 1}: {prompts[index]}")
        print(result.text)
        print(stats_line(len(result.token_ids), result.forward_passes, result.elapsed_s, result.method, result.kernels))
    if len(results) > 1:
        summary = batch_summary(results, model)
        print("batch " + stats_line(summary["tokens"], summary["forward_passes"], summary["elapsed_s"],
                                    summary["method"], summary["kernels"]))
    return 0


# ---- pull / models -------------------------------------------------------------------------------------------
def run_pull(args) -> int:
    from flash_dllm.engine.hub import list_cached_models, pull

    started = time.perf_counter()
    folder = pull(args.repo)  # tqdm bar on the terminal
    match = next((m for m in list_cached_models() if m.path == folder), None)
    detail = f" ({match.family}, {match.size_bytes / 1e9:.2f} GB)" if match else ""
    print(f"{args.repo}{detail} -> {folder}  [{time.perf_counter() - started:.1f} s]")
    return 0


def run_models(args) -> int:
    from flash_dllm.engine.hub import HubEnv, list_cached_models

    models = list_cached_models()
    if args.json:
        print(json.dumps([{"name": m.name, "family": m.family, "size_bytes": m.size_bytes, "path": str(m.path)}
                          for m in models]))
        return 0
    if not models:
        print(f"no models in {HubEnv.current().cache_dir}; download one with: "
              "flash-dllm-chat pull GSAI-ML/LLaDA-8B-Instruct")
        return 0
    width = max(len(m.name) for m in models)
    print(f"{'NAME':<{width}}  FAMILY  {'SIZE':>9}  PATH")
    for m in models:
        print(f"{m.name:<{width}}  {m.family:<6}  {m.size_bytes / 1e9:>6.2f} GB  {m.path}")
    return 0


# ---- entry point ---------------------------------------------------------------------------------------------
def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean 'change the input', not 'bug': settings, prompts, models, memory."""
    from flash_dllm.engine.engine import EngineError
    from flash_dllm.engine.hub import HubError

    return (CliError, ValueError, HubError, EngineError, OSError, MemoryError)


def is_out_of_memory(err: BaseException) -> bool:
    from flash_dllm.engine.engine import is_out_of_memory as engine_says_oom  # loading can fail before the engine runs

    return engine_says_oom(err)


def dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "train-tiny":  # every argument belongs to the trainer, including --help
        from flash_dllm.engine.training.train import main as train_main

        return int(train_main(argv[1:]) or 0)
    parser = build_parser()
    launch = None
    if not argv or argv[0] not in SUBCOMMANDS:  # the UI: its flags live on the top-level parser
        from flash_dllm.app import launch

        launch.add_launch_arguments(parser)
    args = parser.parse_args(argv)
    if args.command == "generate":
        return run_generate(args)
    if args.command == "pull":
        return run_pull(args)
    if args.command == "models":
        return run_models(args)
    return int(launch.run(args) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return dispatch(argv)
    except KeyboardInterrupt:
        print("error: interrupted (a download resumes where it stopped when run again)", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - sorted below: user mistakes get one line, bugs a traceback
        if isinstance(err, user_errors()) or (isinstance(err, RuntimeError) and is_out_of_memory(err)):
            message = " ".join(str(err).split()) or type(err).__name__
            print(f"error: {message}", file=sys.stderr)
            return EXIT_USAGE
        raise


if __name__ == "__main__":
    sys.exit(main())
