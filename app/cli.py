"""`flash-dllm-chat`: the chat UI (no subcommand) and the `generate`, `serve`, `pull`, `models`, `train-tiny`,
`bench` commands.

Heavy imports (torch, gradio) happen inside the command that needs them, so `generate` never loads gradio and
`--help` stays quick. A user's mistake (bad setting, missing model, offline, out of memory) ends with one
`error: ...` line on stderr and exit code 2; a traceback means a bug.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SUBCOMMANDS = ("generate", "serve", "pull", "models", "train-tiny", "bench")
EXIT_USAGE = 2
NO_GRAPHS_HELP = "run each decode step eagerly instead of replaying it as a CUDA graph"


# The flag behind each engine setting, by the name an engine error message starts with ("gen length must be",
# "unknown dtype", "kernel backend 'triton' needs"): engine messages name settings, the CLI adds its flag.
SETTING_FLAGS = {"kernel backend": "--kernels", **{flag[2:].replace("-", " "): flag for flag in (
    "--method", "--gen-length", "--block-length", "--steps", "--threshold", "--temperature", "--cfg-scale", "--seed",
    "--window", "--lookahead", "--track", "--gamma", "--acceptance", "--cache-mode", "--device", "--dtype",
    "--end-rule", "--alg", "--alg-temp", "--top-p", "--top-k")}}


class CliError(Exception):
    """A mistake in the command line or its inputs, reported as one line."""


def with_flag(message: str) -> str:
    """An engine setting error as argparse words its own: ``argument --gen-length: gen length must be ...``."""
    setting = message.removeprefix("unknown ")
    for name in sorted(SETTING_FLAGS, key=len, reverse=True):
        if setting.startswith(name + " "):
            return f"argument {SETTING_FLAGS[name]}: {message}"
    return message


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # argparse would print the whole usage block first; one line is easier to read and to test
        self.exit(EXIT_USAGE, f"error: {message} (see {self.prog} --help)\n")


MODEL_HELP = "model folder or Hugging Face repo id (default: the last one used, else the bundled model)"


LOAD_DEFAULTS = {"model": None, "device": None, "dtype": None, "kernels": None, "no_graphs": False}


def add_load_arguments(p, subcommand: bool = False) -> None:
    """--model, --device, --dtype, --kernels and --no-graphs: how a command loads its model (generate, the app and
    serve take the same five). A parser or an argument group. A subcommand's copies have no defaults of their
    own, so that `flash-dllm-chat --model M generate` keeps the M given before the command (argparse would
    otherwise overwrite it with the subcommand's default); `load_defaults` fills what neither gave."""
    def default(name: str):
        return argparse.SUPPRESS if subcommand else LOAD_DEFAULTS[name]

    p.add_argument("--model", default=default("model"), help=MODEL_HELP)
    p.add_argument("--device", default=default("device"),
                   help="cuda, cuda:N, cpu or auto (default: cuda when available)")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp16", "fp32"], default=default("dtype"),
                   help="weights dtype (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--kernels", choices=["auto", "triton", "torch"], default=default("kernels"),
                   help="kernel backend (default: triton on GPU, torch on CPU)")
    p.add_argument("--no-graphs", action="store_true", default=default("no_graphs"), help=NO_GRAPHS_HELP)


def load_defaults(args) -> None:
    for name, value in LOAD_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, value)


def misplaced_app_flags(argv: list[str], command: str) -> list[str]:
    """The chat app's own flags given before a subcommand (`--port 9000 serve`): argparse takes them for the
    app and the command would silently run without them."""
    if command not in argv:
        return []
    load_flags = {"--" + name.replace("_", "-") for name in LOAD_DEFAULTS}
    return [arg.split("=")[0] for arg in argv[: argv.index(command)]
            if arg.startswith("--") and arg.split("=")[0] not in load_flags]


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    from flash_dllm.engine import ACCEPTANCE_RULES, CACHE_MODES, METHODS, GenerationSettings

    d = GenerationSettings()
    add_load_arguments(p, subcommand=True)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="the user message")
    source.add_argument("--batch-file", type=Path, help="a file with one prompt per line, decoded as one batch")
    p.add_argument("prompt_text", nargs="?", metavar="PROMPT", help="the user message (same as --prompt)")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--method", choices=list(METHODS), help=f"decoding method (default {d.method}; block-diffusion for a block-diffusion model such as LLaDA2)")
    p.add_argument("--gen-length", type=int, help=f"answer length in tokens (default {d.gen_length})")
    p.add_argument("--block-length", type=int,
                   help=f"semi-autoregressive block length (default {d.block_length}, or a divisor of --gen-length "
                        f"when {d.block_length} does not divide it; a block-diffusion model: its own block size)")
    p.add_argument("--steps", type=int, help="llada, dream: total denoising steps (default: the answer length)")
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
    p.add_argument("--end-rule", choices=["official", "stop"],
                   help="official: cells after the end token are decoded on, as the published samplers do; stop: "
                        "they become padding (default: official for llada, fast-dllm and dream, else stop)")
    p.add_argument("--alg", choices=["origin", "maskgit_plus", "topk_margin", "entropy"],
                   help=f"dream: which cells a step decodes (default {d.alg})")
    p.add_argument("--alg-temp", type=float, help=f"dream: randomness of the cell order (default {d.alg_temp})")
    p.add_argument("--top-p", type=float, help="dream: nucleus filter (default none)")
    p.add_argument("--top-k", type=int, help="dream: top-k filter (default none)")
    p.add_argument("--no-chat-template", action="store_true", help="feed the raw prompt (base models)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def build_parser() -> Parser:
    parser = Parser(prog="flash-dllm-chat",
                    description="Local chat with diffusion LLMs (LLaDA, Dream). "
                                "Without a command it starts the chat UI.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_generate_arguments(commands.add_parser("generate", help="answer a prompt (or a batch) in the terminal"))
    from flash_dllm.app.serve import add_serve_arguments

    add_serve_arguments(commands.add_parser("serve", help="serve the OpenAI-compatible API only (no page), for "
                                                          "scripts: /v1/chat/completions, /v1/completions, "
                                                          "/v1/models"))
    pull = commands.add_parser("pull", help="download a model into the Hugging Face cache")
    pull.add_argument("repo", help="Hugging Face repo id, e.g. GSAI-ML/LLaDA-8B-Instruct")
    models = commands.add_parser("models", help="list downloaded and bundled models")
    models.add_argument("--json", action="store_true", help="print JSON")
    commands.add_parser("train-tiny", help="train the bundled tiny model (arguments go to the trainer; see its --help)",
                        add_help=False)
    commands.add_parser("bench", help="benchmark the decode step (bench decode) or the kernels (bench kernels); "
                                      "see bench --help", add_help=False)
    return parser


# ---- generate ------------------------------------------------------------------------------------------------
def checked_text(text: str, where: str) -> str:
    """``text`` if it can reach the tokenizer: bytes that are not UTF-8 arrive from the terminal as lone
    surrogates (Python's surrogateescape), which no tokenizer and no JSON file can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise CliError(f"{where} is not valid UTF-8 text (byte {err.start + 1} of it cannot be decoded)") from None
    return text


def read_prompts(args) -> list[str]:
    if args.batch_file is not None:
        if args.prompt_text is not None:  # two sources: which one was meant is a guess, so ask
            raise CliError("give either PROMPT or --batch-file FILE, not both")
        try:
            lines = args.batch_file.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as err:
            raise CliError(f"--batch-file {args.batch_file} is not UTF-8 text (byte {err.start + 1} cannot be "
                           "decoded)") from None
        except OSError as err:
            raise CliError(f"cannot read --batch-file {args.batch_file}: {err.strerror or err}") from None
        prompts = [line for line in lines if line.strip()]
        if not prompts:
            raise CliError(f"--batch-file {args.batch_file} holds no prompt (one prompt per line)")
        return prompts
    if args.prompt_text is not None and args.prompt is not None:
        raise CliError("give the prompt once: as PROMPT, --prompt TEXT or --batch-file FILE")
    prompt = args.prompt if args.prompt is not None else args.prompt_text
    if prompt is None:
        raise CliError("give --prompt TEXT or --batch-file FILE")
    if not prompt.strip():
        raise CliError("the prompt is empty")
    return [checked_text(prompt, "the prompt")]


def settings_from(args):
    """The settings the flags give. Without --block-length a --gen-length that the default block length does not
    divide gets a block length that does (`block_length_for`, as the OpenAI API chooses one), so `--gen-length
    100` alone works; an explicit --block-length is kept as given, and validate judges it."""
    from flash_dllm.engine import GenerationSettings, block_length_for

    block_length = args.block_length
    if block_length is None and args.gen_length is not None and args.gen_length >= 1:
        block_length = block_length_for(args.gen_length, GenerationSettings().block_length)
    return GenerationSettings().with_overrides(
        method=args.method, gen_length=args.gen_length, block_length=block_length, steps=args.steps,
        threshold=args.threshold, temperature=args.temperature, cfg_scale=args.cfg_scale, seed=args.seed,
        window=args.window, lookahead=args.lookahead, track=args.track, gamma=args.gamma,
        acceptance=args.acceptance, cache_mode=args.cache_mode, use_chat_template=not args.no_chat_template,
        end_rule=args.end_rule, alg=args.alg, alg_temp=args.alg_temp, top_p=args.top_p, top_k=args.top_k,
    )


@dataclass
class ModelChoice:
    """The model `generate` runs and where its name came from (said in any error about it)."""

    name: str
    origin: str  # "--model", "the last model used (from SETTINGS)", "the bundled model"


def default_model(requested: str | None) -> ModelChoice:
    """``--model``; else the remembered last model while it is still on disk (a folder, or a repo in the
    cache); else the bundled model, with a note on stderr when a remembered model is gone."""
    from flash_dllm.app.paths import last_model, settings_path
    from flash_dllm.engine import hub

    if requested:
        return ModelChoice(requested, "--model")
    last = last_model()
    if last and model_on_disk(last):
        return ModelChoice(last, f"the last model used, remembered in {settings_path(create=False)}")
    bundled = hub.bundled_model_path()
    if last:
        print(f"note: the last model used ({last}, remembered in {settings_path(create=False)}) is no longer "
              "on disk; " + ("using the bundled model" if bundled else "pass --model"), file=sys.stderr)
    if bundled is None:
        raise CliError("no model given and none bundled: pass --model ORG/NAME or a model folder")
    return ModelChoice(str(bundled), "the bundled model")


def model_on_disk(name: str) -> bool:
    """A model folder that exists, a bundled model's name, or a repo id with a complete copy in the cache."""
    from flash_dllm.engine import hub

    if Path(name).expanduser().is_dir() or hub.is_bundled_name(name):
        return True
    return any(name in (m.name, str(m.path)) for m in hub.list_cached_models())


def model_reference(model: str) -> str:
    """What to remember as the last model: a folder as an absolute path (so it works from any directory)."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


@dataclass
class BatchSummary:
    """A batch file's totals (the JSON of `generate --batch-file --json`); one wall clock for all prompts."""

    model: str
    method: str
    kernels: str
    prompts: int
    tokens: int
    forward_passes: int
    elapsed_s: float
    tokens_per_s: float
    tokens_per_forward: float
    results: list[dict]

    def to_dict(self) -> dict:
        return asdict(self)


def batch_summary(results, model: str) -> BatchSummary:
    from flash_dllm.engine import tokens_per_forward, tokens_per_second

    tokens = sum(len(r.token_ids) for r in results)
    forwards = sum(r.forward_passes for r in results)
    elapsed = max(r.elapsed_s for r in results)  # one batch: every sequence shares the wall clock
    return BatchSummary(model=model, method=results[0].method, kernels=results[0].kernels, prompts=len(results),
                        tokens=tokens, forward_passes=forwards, elapsed_s=elapsed,
                        tokens_per_s=round(tokens_per_second(tokens, elapsed), 3),
                        tokens_per_forward=round(tokens_per_forward(tokens, forwards), 3),
                        results=[r.to_dict() for r in results])


def stats_line(tokens: int, run) -> str:
    """One line of numbers for a GenerationResult or a BatchSummary (both carry the rates)."""
    return (f"[{tokens} tokens | {run.forward_passes} forward passes | {run.tokens_per_forward:.2f} tokens/forward | "
            f"{run.tokens_per_s:.1f} tok/s | {run.elapsed_s:.2f} s | {run.method} | {run.kernels} kernels]")


def run_generate(args) -> int:
    from flash_dllm.app.paths import remember_model
    from flash_dllm.engine import Engine, SettingsError, validate

    prompts = read_prompts(args)
    settings = settings_from(args)
    validate(settings)  # before loading anything: a bad setting should not cost a download
    if args.system is not None:
        checked_text(args.system, "--system")
    choice = default_model(args.model)
    model = model_reference(choice.name)
    # device, dtype and kernel backend are the engine's to decide and check (before any download)
    try:
        engine = Engine.load(model, device=args.device, dtype=args.dtype, kernels=args.kernels,
                             graphs=not args.no_graphs)
    except user_errors() as err:
        if choice.origin == "--model" or isinstance(err, SettingsError):
            raise
        raise CliError(f"cannot load {model} ({choice.origin}; pass --model to choose another): "
                       f"{error_line(err)}") from None
    try:
        remember_model(model)
    except OSError:
        pass  # a read-only config folder must not cost the answer
    conversations = [
        [{"role": "system", "content": args.system}, {"role": "user", "content": p}] if args.system else p
        for p in prompts
    ]
    if args.method is None:  # the model's own default (a block-diffusion model decodes only with its block method)
        settings = settings.with_overrides(method=engine.default_method)
    model_block = engine.model.config.block_size
    if args.block_length is None and model_block:
        # a block-diffusion model decodes in its own block size only, not in one chosen to divide --gen-length
        # (the engine's validate then names a --gen-length that is no multiple of it)
        settings = settings.with_overrides(block_length=model_block)
    results = engine.generate(conversations, settings)
    if args.json:
        doc = results[0].to_dict() if args.batch_file is None else batch_summary(results, model).to_dict()
        print(json.dumps(doc, ensure_ascii=False))
        return 0
    for index, result in enumerate(results):
        if len(results) > 1:
            print(f"### {index + 1}: {prompts[index]}")
        print(result.text)
        print(stats_line(len(result.token_ids), result))
    if len(results) > 1:
        summary = batch_summary(results, model)
        print("batch " + stats_line(summary.tokens, summary))
    return 0


# ---- pull / models -------------------------------------------------------------------------------------------
def run_pull(args) -> int:
    from flash_dllm.engine import hub

    started = time.perf_counter()
    if sys.stderr.isatty():  # like the download bar: a sign of life for a person, nothing in a pipe
        print(f"Asking {hub.HubEnv.current().endpoint} for {args.repo}…", file=sys.stderr, flush=True)
    folder = hub.pull(args.repo)  # tqdm bar on the terminal
    match = next((m for m in hub.list_cached_models() if m.path == folder), None)
    detail = f" ({match.family}, {match.size_bytes / 1e9:.2f} GB)" if match else ""
    print(f"{args.repo}{detail} -> {folder}  [{time.perf_counter() - started:.1f} s]")
    return 0


def run_models(args) -> int:
    from flash_dllm.engine import hub

    models = hub.list_cached_models()
    if args.json:
        print(json.dumps([{"name": m.name, "family": m.family, "size_bytes": m.size_bytes, "path": str(m.path)}
                          for m in models]))
        return 0
    if not models:
        print(f"no models in {hub.HubEnv.current().cache_dir}; download one with: "
              "flash-dllm-chat pull GSAI-ML/LLaDA-8B-Instruct")
        return 0
    width = max(len(m.name) for m in models)
    print(f"{'NAME':<{width}}  FAMILY  {'SIZE':>9}  PATH")
    for m in models:
        print(f"{m.name:<{width}}  {m.family:<6}  {m.size_bytes / 1e9:>6.2f} GB  {m.path}")
    return 0


# ---- entry point ---------------------------------------------------------------------------------------------
def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean 'change the input', not 'bug': settings, prompts, models, memory (the engine
    reports running out of memory as EngineError, while loading and while decoding)."""
    from flash_dllm.engine import EngineError, hub

    return (CliError, ValueError, hub.HubError, EngineError, OSError, MemoryError)


def error_line(err: BaseException) -> str:
    """A user error as one line, naming the command-line flag behind a bad engine setting."""
    from flash_dllm.engine import SettingsError

    message = " ".join(str(err).split()) or type(err).__name__
    return with_flag(message) if isinstance(err, SettingsError) else message


def dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "train-tiny":  # every argument belongs to the trainer, including --help
        from flash_dllm.engine.training.train import main as train_main

        return int(train_main(argv[1:]) or 0)
    if argv and argv[0] == "bench":  # its own parser: `bench decode ...`, `bench kernels ...`
        from flash_dllm.engine import bench

        return int(bench.main(argv[1:]) or 0)
    parser = build_parser()
    launch = None
    if not argv or argv[0] not in SUBCOMMANDS:  # the UI: its flags live on the top-level parser
        from flash_dllm.app import launch

        launch.add_launch_arguments(parser)
    args = parser.parse_args(argv)
    load_defaults(args)
    misplaced = misplaced_app_flags(argv, args.command) if args.command else []
    if misplaced:
        raise CliError(f"{', '.join(misplaced)} before `{args.command}` is read as a flag of the chat app, not of "
                       f"`{args.command}`; put the command's options after it (see flash-dllm-chat {args.command} "
                       "--help)")
    if args.command == "generate":
        return run_generate(args)
    if args.command == "serve":
        from flash_dllm.app import serve

        return serve.run(args)
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
        if isinstance(err, user_errors()):
            print(f"error: {error_line(err)}", file=sys.stderr)
            return EXIT_USAGE
        raise


if __name__ == "__main__":
    sys.exit(main())
