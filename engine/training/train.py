"""Train the bundled tiny LLaDA-architecture masked diffusion model (``python -m flash_dllm.engine.training.train``).

Objective (LLaDA SFT): the prompt is never masked; every answer position (EOS padding included, so the model
learns where to stop) is masked with probability t ~ U(eps, 1), one t per sequence; the loss is the
cross-entropy on masked positions weighted by 1/t and divided by the number of answer positions.

The forward pass is the engine's own (``model_from_llada_state`` + ``forward_hidden``) over a flat dict of
LLaDA-named parameters, so training and inference share one transformer and saving is ``save_file``.
On the GPU: bf16 autocast, torch.compile, fused AdamW. The learning rate follows a cosine over wall-clock
time, so a run of any length ends annealed; checkpoints make it resumable across device calls.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from flash_dllm.engine.config import config_from_dict

from . import artifacts, bpe, data
from .objective import init_params, masked_diffusion_loss, stratified_t
from .pool import PoolStream, WindowPolicy
from .run_config import PRESETS, TrainConfig, lr_at, make_tokenizer, parse_args, pick_device, progress_bar
from .validation import Batcher, ValidationSet

__all__ = ["PRESETS", "TrainConfig", "Trainer", "main", "parse_args"]


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.ckpt_dir = Path(cfg.ckpt_dir or self.out.parent / f"{self.out.name}-ckpt")
        torch.manual_seed(cfg.seed)
        self.process_start = time.time()
        started = time.time()
        self.tokenizer = make_tokenizer(cfg, self.ckpt_dir)
        ids = bpe.special_ids(self.tokenizer)
        self.config = artifacts.llada_config(cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.mlp_hidden,
                                             self.tokenizer.get_vocab_size(), ids)
        self.model_cfg = config_from_dict(self.config)
        self.mask_id, self.eos_id = ids[bpe.MASK], ids[bpe.EOS]
        print(f"tokenizer: {self.tokenizer.get_vocab_size()} tokens ({time.time() - started:.1f} s)", flush=True)
        # the pool's workers are forked here, before anything touches CUDA
        self.started = time.time()
        workers = cfg.workers or max(1, len(os.sched_getaffinity(0)) - 2)
        policy = WindowPolicy(cfg.p_long, cfg.p_any, cfg.long_window, tuple(int(w) for w in cfg.windows.split(",")))
        mix = data.parse_mix(cfg.families)  # the spec may carry weights: "word:0.5,multi:0.3"
        families = tuple(mix)
        self.stream = PoolStream(self.tokenizer, cfg.pool, cfg.seed, workers, mix, policy)
        self.device = pick_device(cfg.device)
        self.batcher = Batcher(cfg.tokens_per_step, self.device, cfg.seed, self.eos_id)
        self.val = ValidationSet(self.tokenizer, families, cfg.val_per_family, policy, self.device)
        self.params = init_params(self.config, cfg.seed, self.device)
        if cfg.init_from:
            self._load_weights(Path(cfg.init_from))
        self.n_params = sum(p.numel() for p in self.params.values())
        decay = [p for p in self.params.values() if p.dim() >= 2]
        no_decay = [p for p in self.params.values() if p.dim() < 2]
        fused = self.device.type == "cuda"
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                      {"params": no_decay, "weight_decay": 0.0}],
                                     lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
        self.step, self.elapsed, self.tokens, self.useful_tokens = 0, 0.0, 0, 0
        self.pool_reported = False
        self.log = {"title": f"tiny LLaDA MDM, {self.n_params / 1e6:.1f}M params", "config": asdict(cfg),
                    "n_params": self.n_params, "train": [], "val": []}
        previous = Path(cfg.init_from) / "training_log.json" if cfg.init_from else None
        if previous is not None and previous.is_file():  # a warm start keeps the history of its weights
            self.log["previous"] = json.loads(previous.read_text())
        self.eager_loss = self._bind(masked_diffusion_loss)
        self.loss_fn = self.eager_loss
        self.compile_seconds = 0.0
        self.compile_mode = ""
        self.compile_modes = ["dynamic", "static"] if cfg.compile and (self.device.type == "cuda" or cfg.compile_cpu) else []
        self._compile_next()
        if cfg.resume:
            self._resume()

    def _compile_next(self):
        """Switch to the next compiled form of the loss (dynamic shapes, then one graph per shape), or eager."""
        self.loss_fn = self.eager_loss
        if not self.compile_modes:
            return
        mode = self.compile_modes.pop(0)
        self.compile_mode = mode
        if mode == "static":
            # one graph per (batch, prompt bucket, window): ~20 s of compile each, 2.5x eager speed after
            torch._dynamo.config.cache_size_limit = 256
            torch._dynamo.config.accumulated_cache_size_limit = 1024
            self.loss_fn = torch.compile(self.eager_loss, dynamic=False)
            return
        # Dynamic shapes: one graph serves every (batch, prompt bucket, window) instead of ~50 recompiles.
        # No duck sizing: otherwise a first batch whose prompt bucket equals its window gives both one
        # symbol, and the first batch where they differ recompiles.
        import torch._inductor.config as inductor_config
        import torch.fx.experimental._config as fx_config

        fx_config.use_duck_shape = False
        # Inductor's memory-coalescing tiling analysis asserts on symbolic sizes (torch 2.11 on the H200:
        # "InductorError: AssertionError" in tiling_utils.get_pw_red_splits); its own config note says it
        # does not apply to dynamic shapes anyway
        inductor_config.triton.coalesce_tiling_analysis = False
        compiled = torch.compile(self.eager_loss)

        def loss_fn(params, prompt, prompt_lens, answers, t):
            # only the batch, prompt and window sizes vary; the weights keep static shapes (dynamic=True
            # would make d_model a symbol too, with slower kernels and more guards)
            for tensor, dims in ((prompt, (0, 1)), (answers, (0, 1)), (prompt_lens, (0,)), (t, (0,))):
                for dim in dims:
                    torch._dynamo.maybe_mark_dynamic(tensor, dim)
            return compiled(params, prompt, prompt_lens, answers, t)
        self.loss_fn = loss_fn

    def _bind(self, fn):
        model_cfg, mask_id = self.model_cfg, self.mask_id
        share, length = self.cfg.block_view_share, self.cfg.block_view_length

        def loss(params, prompt, prompt_lens, answers, t):
            return fn(params, model_cfg, mask_id, prompt, prompt_lens, answers, t, share, length)
        return loss

    @property
    def compiled(self) -> bool:
        return self.loss_fn is not self.eager_loss

    def _load_weights(self, folder: Path):
        from flash_dllm.engine.weights import read_state

        state = read_state(folder, {n: tuple(p.shape) for n, p in self.params.items()}, "cpu")
        with torch.no_grad():
            for name, value in state.items():
                self.params[name].copy_(value.float().to(self.device))
        print(f"initialised from {folder}", flush=True)

    # ----------------------------------------------------------------- checkpoints
    def _resume(self):
        state = artifacts.load_checkpoint(self.ckpt_dir / "last.pt")
        if state is None:
            print("resume: no checkpoint yet, starting fresh", flush=True)
            return
        with torch.no_grad():
            for name, value in state["params"].items():
                self.params[name].copy_(value.to(self.device))
        self.opt.load_state_dict(state["opt"])
        self.step, self.elapsed, self.tokens = state["step"], state["elapsed"], state["tokens"]
        self.useful_tokens, self.log = state["useful_tokens"], state["log"]
        self.batcher.reseed(self.cfg.seed + self.step)
        print(f"resumed at step {self.step}, {self.elapsed:.0f} s, {self.tokens / 1e6:.0f}M tokens", flush=True)

    def save_checkpoint(self):
        payload = {"params": {k: v.detach().cpu() for k, v in self.params.items()}, "opt": self.opt.state_dict(),
                   "step": self.step, "elapsed": self.elapsed, "tokens": self.tokens,
                   "useful_tokens": self.useful_tokens, "log": self.log}
        artifacts.save_checkpoint(self.ckpt_dir / "last.pt", payload)

    # ----------------------------------------------------------------- loop
    def _forward_backward(self, prompt, prompt_lens, answers, t):
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.use_bf16):
            out = self.loss_fn(self.params, prompt, prompt_lens, answers, t)
        out[0].backward()
        return out

    def _one_step(self, batch, time_frac):
        cfg = self.cfg
        for group in self.opt.param_groups:
            group["lr"] = lr_at(cfg, self.step, time_frac)
        prompt, prompt_lens, answers = batch
        t = stratified_t(len(answers), cfg.eps, self.device)
        try:
            out = self._forward_backward(prompt, prompt_lens, answers, t)
        except Exception as err:  # a compiler failure (forward or backward) must not cost the run
            if not self.compiled:
                raise
            print(f"torch.compile failed ({type(err).__name__}: {str(err)[-300:]}); continuing eager", flush=True)
            self.compile_modes = []
            self._compile_next()
            out = self._forward_backward(prompt, prompt_lens, answers, t)
        grad_norm = torch.nn.utils.clip_grad_norm_(list(self.params.values()), cfg.clip)
        self.opt.step()
        return torch.stack([out[0].detach(), out[1], out[2].float(), out[3].float(), grad_norm.float()])

    def warm_up(self):
        """Compile forward and backward on synthetic batches while the pool's workers are still idle."""
        if not self.compiled:
            return
        started = time.time()
        vocab = self.tokenizer.get_vocab_size()
        tokens = self.cfg.tokens_per_step
        # typical batches (Inductor guards on sizes, e.g. rows * positions > 4096), all sizes distinct
        for batch, p_len, width in ((min(tokens // 112, 3001), 48, 64), (min(tokens // 208, 2999), 80, 128)):
            gen = torch.Generator().manual_seed(batch)
            prompt = torch.randint(6, vocab, (batch, p_len), generator=gen).to(self.device)
            answers = torch.randint(6, vocab, (batch, width), generator=gen).to(self.device)
            lens = torch.randint(p_len // 2, p_len + 1, (batch,), generator=gen).to(self.device)
            t = stratified_t(batch, self.cfg.eps, self.device)
            for _attempt in range(3):
                try:
                    self._forward_backward(prompt, lens, answers, t)
                    break
                except Exception as err:
                    failed = self.compile_mode
                    self._compile_next()
                    print(f"torch.compile ({failed} shapes) failed in warm-up ({type(err).__name__}: "
                          f"{str(err)[-300:]}); now {self.compile_mode if self.compiled else 'eager'}", flush=True)
                    if not self.compiled:
                        break
        self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.compile_seconds = time.time() - started
        state = f"ok, {self.compile_mode} shapes" if self.compiled else "fell back to eager"
        print(f"compiled in {self.compile_seconds:.1f} s ({state})", flush=True)

    @property
    def use_bf16(self) -> bool:
        if self.device.type == "cuda":
            return self.cfg.bf16
        return self.cfg.bf16_cpu

    def feed(self, block: bool = False):
        for part in self.stream.ready(block):
            self.batcher.add(part)
        if self.stream.done and not self.pool_reported:
            self.pool_reported = True
            print(f"pool complete: {self.batcher.n_examples} examples in {len(self.batcher.useful)} buckets, "
                  f"{100 * self.batcher.padding_share():.0f} % padding, {time.time() - self.started:.0f} s after start",
                  flush=True)

    def progress_fraction(self, budget: float) -> float:
        """How far through the run we are: by training time, or by the wall limit if that is nearer."""
        frac = self.elapsed / budget
        if self.cfg.wall_limit > 0:
            wall_budget = self.cfg.wall_limit - self.cfg.reserve - self.train_start_wall
            frac = max(frac, (time.time() - self.process_start - self.train_start_wall) / max(wall_budget, 1.0))
        return frac

    def train(self):
        cfg = self.cfg
        self.warm_up()
        self.stream.start()
        self.feed(block=True)
        print(f"first shard ready: {self.batcher.n_examples} examples ({time.time() - self.started:.1f} s)", flush=True)
        self.train_start_wall = time.time() - self.process_start
        budget = cfg.minutes * 60
        progress = progress_bar(budget, self.elapsed)
        acc = None
        window_tokens, window_start = 0, time.time()
        next_val = self.elapsed if not self.log["val"] else self.elapsed + cfg.val_every
        next_ckpt = self.elapsed + cfg.ckpt_every
        last = time.time()
        while self.progress_fraction(budget) < 1.0 and (cfg.max_steps <= 0 or self.step < cfg.max_steps):
            if self.elapsed >= next_val or self.elapsed >= next_ckpt:  # pauses: not training time
                if self.elapsed >= next_val:
                    self.validate()
                    next_val = self.elapsed + cfg.val_every
                if self.elapsed >= next_ckpt:
                    self.save_checkpoint()
                    next_ckpt = self.elapsed + cfg.ckpt_every
                window_start += time.time() - last
                last = time.time()
            if self.step % 20 == 0 and not self.stream.done:
                self.feed()
            batch, n_tokens, n_useful = self.batcher.next()
            stats = self._one_step(batch, self.progress_fraction(budget))
            acc = stats if acc is None else acc + stats
            self.step += 1
            self.tokens += n_tokens
            self.useful_tokens += n_useful
            window_tokens += n_tokens
            log_now = self.step % cfg.log_every == 0 or self.step == 1
            if log_now:
                acc = acc.cpu()  # the only device->host sync in the loop, so the clock below is honest here
            now = time.time()
            self.elapsed += now - last
            progress.update(now - last)
            last = now
            if log_now:
                n = cfg.log_every if self.step > 1 else 1
                row = {"step": self.step, "time": round(self.elapsed, 2), "tokens": self.tokens,
                       "loss": float(acc[0]) / n, "ce": float(acc[1] / max(acc[3], 1)),
                       "masked_acc": float(acc[2] / max(acc[3], 1)), "grad_norm": float(acc[4]) / n,
                       "lr": self.opt.param_groups[0]["lr"],
                       "tokens_per_s": window_tokens / max(now - window_start, 1e-9)}
                self.log["train"].append(row)
                progress.set_postfix(loss=f"{row['loss']:.4f}", tok_s=per_second(row["tokens_per_s"]), refresh=False)
                acc, window_tokens, window_start = None, 0, now
        progress.close()
        self.stream.close()
        self.validate()
        self.save_checkpoint()

    def validate(self):
        losses, accs = self.val.evaluate(self.params, self.model_cfg, self.mask_id, self.use_bf16)
        row = {"step": self.step, "time": round(self.elapsed, 2), "tokens": self.tokens, "loss": losses, "acc": accs}
        self.log["val"].append(row)
        text = " ".join(f"{f}={losses[f]:.4f}/{accs[f]:.3f}" for f in losses)
        print(f"[val step {self.step} {self.elapsed:.0f}s] loss/masked-acc {text}", flush=True)

    def save(self) -> Path:
        artifacts.save_model_folder(self.out, self.params, self.config, self.tokenizer)
        summary = {"n_params": self.n_params, "steps": self.step, "train_seconds": self.elapsed,
                   "compiled": self.compile_mode if self.compiled else False, "compile_seconds": round(self.compile_seconds, 1),
                   "tokens": self.tokens, "useful_tokens": self.useful_tokens,
                   "tokens_per_s": self.tokens / max(self.elapsed, 1e-9),
                   "useful_tokens_per_s": self.useful_tokens / max(self.elapsed, 1e-9),
                   "final_train": self.log["train"][-1] if self.log["train"] else None,
                   "final_val": self.log["val"][-1] if self.log["val"] else None}
        if "previous" in self.log:
            summary["tokens_including_warm_start"] = self.tokens + artifacts.total_tokens(self.log["previous"])
        self.log["summary"] = summary
        (self.out.parent / f"{self.out.name}-training-log.json").write_text(json.dumps(self.log, indent=1))
        (self.out / "training_log.json").write_text(json.dumps(self.log))  # provenance travels with the weights
        artifacts.plot_curve(self.log, self.out.parent / f"{self.out.name}-loss.png")
        print("summary: " + json.dumps(summary), flush=True)
        return self.out


def per_second(rate: float) -> str:
    """Positions per second for the progress bar: millions on a GPU, thousands on a CPU (1.9k, not 0.00M)."""
    return f"{rate / 1e6:.2f}M" if rate >= 1e5 else f"{rate / 1e3:.1f}k"


def main(argv=None) -> int:
    cfg = parse_args(argv)
    trainer = Trainer(cfg)
    print(f"model: {trainer.n_params / 1e6:.2f}M params on {trainer.device}, "
          f"{'bf16 ' if trainer.use_bf16 else ''}"
          f"{'compiled' if trainer.compiled else 'eager'}", flush=True)
    trainer.train()
    folder = trainer.save()
    if cfg.probe_per_family:
        from .evaluate import quick_probe

        try:  # the model is saved already; a decoder failure must not turn the run into an error
            quick_probe(folder, cfg.probe_per_family, trainer.device, cfg.probe_gen_length,
                        out=folder.parent / f"{folder.name}-probe.json")
        except Exception as err:
            print(f"probe failed: {type(err).__name__}: {err}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
