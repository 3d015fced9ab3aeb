"""Our methods against the authors' samplers, token for token, on tiny random-weight models (fp32, CPU, greedy).

The authors' files are not part of this repository; fetch them into a folder and pass it (benchmarks/README.md,
"Published samplers", gives the commits):
    DIR/llada_generate.py                   ML-GSAI/LLaDA generate.py
    DIR/fastdllm_generate.py                NVlabs/Fast-dLLM llada/generate.py
    DIR/fastdllm_dream_generation_utils.py  NVlabs/Fast-dLLM dream/model/generation_utils.py (Dream's
                                            diffusion_generate; its origin/maskgit_plus/topk_margin/entropy
                                            branches are Dream's own)
Their model calls are served by the tiny model below (Fast-dLLM's prefix and dual caches included); each case
runs with no end bias and with the end tokens' head rows raised so answers end early. Run from the repo root:
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/compare_official_samplers.py DIR [--stable-topk]
--stable-topk makes the authors' torch.topk take the lowest indices among ties, as torch.topk does on CUDA
(on the CPU its choice among equal values is unspecified).
"""
import argparse
import contextlib
import io
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from flash_dllm.engine import sampling
from flash_dllm.engine.engine import Engine
from flash_dllm.engine.host_reference import run_reference
from flash_dllm.engine.model import forward_hidden, lm_logits, mlp, rms_norm
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from flash_dllm.kernels.rope_cache_write import rope_rotate_half


def cached_forward(model, ids, qpos, cache=None):
    """Logits of positions qpos (list) of ids [B, L]; keys = cache (per layer full-length k/v) with qpos fresh."""
    cfg = model.config
    B, L = ids.shape
    hq, hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    pos = torch.tensor(qpos)
    n = len(qpos)
    cos, sin = model.rope_cos[pos], model.rope_sin[pos]
    h = F.embedding(ids[:, pos], model.embed)
    new_cache = []
    for i, layer in enumerate(model.layers):
        x = rms_norm(h, layer.attn_norm, cfg.norm_eps)
        q, k, v = F.linear(x, layer.w_qkv, layer.b_qkv).split([hq * dh, hkv * dh, hkv * dh], dim=-1)
        q = rope_rotate_half(q.reshape(-1, hq, dh), cos.repeat(B, 1), sin.repeat(B, 1)).to(x.dtype)
        k = rope_rotate_half(k.reshape(-1, hkv, dh), cos.repeat(B, 1), sin.repeat(B, 1)).to(x.dtype)
        q = q.view(B, n, hq, dh).transpose(1, 2)
        k = k.view(B, n, hkv, dh).transpose(1, 2)
        v = v.reshape(B, n, hkv, dh).transpose(1, 2)
        if cache is None:
            K = torch.zeros(B, hkv, L, dh); V = torch.zeros(B, hkv, L, dh)
        else:
            K, V = cache[i][0].clone(), cache[i][1].clone()
            if K.shape[2] < L:
                K = torch.cat([K, torch.zeros(B, hkv, L - K.shape[2], dh)], 2)
                V = torch.cat([V, torch.zeros(B, hkv, L - V.shape[2], dh)], 2)
        K[:, :, pos] = k
        V[:, :, pos] = v
        new_cache.append((K, V))
        Kr, Vr = K, V
        if hkv != hq:
            Kr = K.repeat_interleave(hq // hkv, dim=1); Vr = V.repeat_interleave(hq // hkv, dim=1)
        attn = F.scaled_dot_product_attention(q, Kr, Vr)
        h = h + F.linear(attn.transpose(1, 2).reshape(B, n, hq * dh), layer.w_o)
        h = h + mlp(rms_norm(h, layer.ffn_norm, cfg.norm_eps), layer)
    return lm_logits(model, rms_norm(h, model.final_norm, cfg.norm_eps)), new_cache


class LladaLike:
    """model(x).logits for LLaDA's generate.py; Fast-dLLM's use_cache / past_key_values / replace_position."""
    def __init__(self, model):
        self.model = model
        self.device = torch.device("cpu")
        self.full = 0

    def __call__(self, x, attention_mask=None, past_key_values=None, use_cache=False, replace_position=None):
        if past_key_values is None:
            self.full += 1
            logits = lm_logits(self.model, forward_hidden(self.model, x))
            cache = cached_forward(self.model, x, list(range(x.shape[1])))[1] if use_cache else None
            return SimpleNamespace(logits=logits, past_key_values=cache)
        if replace_position is not None:  # dual cache: x is the block; the cache is full length
            L = past_key_values[0][0].shape[2]
            qpos = torch.nonzero(replace_position[0]).flatten().tolist()
            full = torch.zeros(x.shape[0], L, dtype=torch.long)
            full[:, qpos] = x
            logits, _ = cached_forward(self.model, full, qpos, past_key_values)
            return SimpleNamespace(logits=logits, past_key_values=past_key_values)
        start = past_key_values[0][0].shape[2]  # prefix cache: x is everything from the block on
        L = start + x.shape[1]
        full = torch.zeros(x.shape[0], L, dtype=torch.long)
        full[:, start:] = x
        logits, _ = cached_forward(self.model, full, list(range(start, L)), past_key_values)
        return SimpleNamespace(logits=logits, past_key_values=past_key_values)


class DreamLike:
    """self(x, attention_mask, tok_idx).logits for Dream's _sample: the unshifted logits (Dream shifts them)."""
    def __init__(self, model):
        self.model = model
        self.device = torch.device("cpu")

    def __call__(self, x, attention_mask=None, tok_idx=None):
        return SimpleNamespace(logits=lm_logits(self.model, forward_hidden(self.model, x)))


def load(name: str, path: Path):
    """Import an author's file; Fast-dLLM's imports its modeling code, which the harness replaces."""
    source = path.read_text().replace("from model.modeling_llada import LLaDAModelLM", "")
    module = types.ModuleType(name)
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module

PROMPTS = ["What is 12*7?", "hello there, how are you today?", "x", "Count: one two three four five six"]


def engine_for(family, bias, mask_bias=0.0):
    """A tiny model; bias raises the end tokens' head rows (answers end early), mask_bias the [MASK] row (cells
    predict [MASK])."""
    folder = write_tiny_model(Path(tempfile.mkdtemp()) / family, TinySpec(family=family, n_kv_heads=2 if family == "dream" else 4))
    eng = Engine.load(str(folder), device="cpu")
    m = eng.model
    ids = torch.tensor([eng.tokenizer.encode(PROMPTS[0]) + [m.config.mask_id] * 32])
    with torch.no_grad():
        d = forward_hidden(m, ids)[0, -32:].mean(0)
    head = m.lm_head.clone()
    for end in eng.tokenizer.end_ids:
        head[end] += bias * d / d.norm()
    head[m.config.mask_id] += mask_bias * d / d.norm()
    m.lm_head = head
    return eng


def ours(eng, prompt, s):
    """(answer ids, full canvas) of our method: the device decoder's answer and the host reference's canvas."""
    r = eng.generate([prompt], s)[0]
    states = eng.new_states([prompt], s)
    run_reference(eng.model, eng.ops, s, states)
    mask = eng.model.config.mask_id
    canvas = [mask if t < 0 else t for t in states[0].answer]
    assert r.token_ids == states[0].answer_ids(), "device != host reference"
    return r.token_ids, canvas


def answer_of(eng, cells):
    """The official output's answer: up to the first end token, [MASK] cells dropped (decode skips them)."""
    mask, ends = eng.model.config.mask_id, eng.tokenizer.end_ids
    out = []
    for t in cells:
        if t in ends:
            break
        if t != mask:
            out.append(t)
    return out


rows = []


def record(case, eng, s, official_cells, prompt):
    ans, canvas = ours(eng, prompt, s)
    off = answer_of(eng, official_cells)
    ended = any(t in eng.tokenizer.end_ids for t in official_cells)
    early = ended and len(off) < s.gen_length - 1
    rows.append((case, s.resolved_end_rule, len(off), early, ans == off, canvas == official_cells))


def llada_cases(eng, tag, fast=True):
    mask = eng.model.config.mask_id
    for prompt in PROMPTS:
        ids = torch.tensor([eng.tokenizer.encode(prompt)])
        P = ids.shape[1]
        for gen, block, steps, cfg in [(32, 8, 32, 0.0), (32, 8, 16, 0.0), (32, 32, 32, 0.0), (32, 8, 16, 1.0)]:
            out = llada_gen.generate(LladaLike(eng.model), ids, torch.ones_like(ids), steps=steps, gen_length=gen, block_length=block,
                                     cfg_scale=cfg, mask_id=mask)[0, P:].tolist()
            s = GenerationSettings(method="llada", gen_length=gen, block_length=block, steps=steps, cfg_scale=cfg)
            record(f"{tag} llada gen{gen} block{block} steps{steps} cfg{cfg} vs generate.py", eng, s, out, prompt)
            if (block, steps, cfg) == (8, 32, 0.0):  # the same case under our early stop (not the published rule)
                record(f"{tag} llada gen{gen} block{block} steps{steps} --end-rule stop vs generate.py", eng,
                       s.with_overrides(end_rule="stop"), out, prompt)
        for mode, fn in [("dual", fast_gen.generate_with_dual_cache), ("prefix", fast_gen.generate_with_prefix_cache)][: 2 * fast]:
            for thr in (0.9, 0.5):
                out, _ = fn(LladaLike(eng.model), ids, steps=32, gen_length=32, block_length=8, mask_id=mask, threshold=thr)
                s = GenerationSettings(method="fast-dllm", gen_length=32, block_length=8, cache_mode=mode, threshold=thr)
                record(f"{tag} fast-dllm {mode} thr{thr} vs generate_with_{mode}_cache", eng, s, out[0, P:].tolist(), prompt)
                if thr == 0.9:
                    record(f"{tag} fast-dllm {mode} thr{thr} --end-rule stop vs generate_with_{mode}_cache", eng,
                           s.with_overrides(end_rule="stop"), out[0, P:].tolist(), prompt)


def dream_cases(eng, tag):
    cfg = eng.model.config
    for prompt in PROMPTS:
        ids = torch.tensor([eng.tokenizer.encode(prompt)])
        P = ids.shape[1]
        for alg, steps, top_p in [("maskgit_plus", 32, None), ("topk_margin", 32, None), ("entropy", 32, None),
                                  ("entropy", 16, None), ("maskgit_plus", 12, 0.9), ("origin", 16, None)]:
            gc = dream_gen.DreamGenerationConfig(max_length=P + 32, mask_token_id=cfg.mask_id, steps=steps, eps=1e-3,
                                                 alg=alg, alg_temp=None, temperature=0.0, top_p=top_p, top_k=None)
            s = GenerationSettings(method="dream", gen_length=32, block_length=32, steps=steps, alg=alg, top_p=top_p, seed=3)
            real_rand = torch.rand
            if alg == "origin":  # our keyed uniforms in place of torch.rand (Dream draws one per masked cell)
                step = {"i": 0}
                def keyed(*shape, device=None):
                    x = fake.x_now
                    cells = torch.nonzero(x[0, P:] == cfg.mask_id).flatten()
                    u = sampling.uniform_noise(sampling.noise_keys(torch.tensor([s.seed_for(0)]), torch.tensor([step["i"]]), 2, cells), 1)[:, 0].float()
                    step["i"] += 1
                    return u
                torch.rand = keyed
            fake = types.SimpleNamespace()
            class Model(dream_gen.DreamGenerationMixin):
                device = torch.device("cpu")
                def __call__(self, x, attention_mask=None, tok_idx=None):
                    fake.x_now = x.clone()
                    return DreamLike(eng.model)(x, attention_mask, tok_idx)
            try:
                out = Model()._sample(ids, None, gc, lambda i, x, l: x, lambda i, x, l: l, threshold=None)
            finally:
                torch.rand = real_rand
            out = out.tolist()[0][P:] if not hasattr(out, "sequences") else out.sequences[0, P:].tolist()
            record(f"{tag} dream alg={alg} steps={steps} top_p={top_p} vs diffusion_generate", eng, s, out, prompt)




def stable_topk(x, k, *args, **kwargs):
    order = torch.sort(-x.double(), dim=-1, stable=True).indices[..., :k]
    return x.gather(-1, order), order


class TorchWithStableTopk(types.ModuleType):
    """torch, but topk takes the lowest indices among equal values (as on CUDA)."""

    topk = staticmethod(stable_topk)

    def __getattr__(self, name):
        return getattr(torch, name)


def main() -> None:
    global llada_gen, fast_gen, dream_gen
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("official", type=Path, help="folder with the authors' files")
    parser.add_argument("--stable-topk", action="store_true", help="the authors' torch.topk breaks ties as on CUDA")
    args = parser.parse_args()
    llada_gen = load("llada_gen", args.official / "llada_generate.py")
    fast_gen = load("fast_gen", args.official / "fastdllm_generate.py")
    dream_gen = load("dream_gen", args.official / "fastdllm_dream_generation_utils.py")
    if args.stable_topk:  # only the authors' modules see it
        for module in (llada_gen, fast_gen, dream_gen):
            module.torch = TorchWithStableTopk("torch")
    with contextlib.redirect_stdout(io.StringIO()):  # Dream's code prints its steps and time
        for bias in (0.0, 2.0, 3.0):
            llada_cases(engine_for("llada", bias), f"bias{bias}")
            dream_cases(engine_for("dream", bias), f"bias{bias}")
        # cells that predict [MASK]; not Fast-dLLM: its code can repeat a step forever there
        llada_cases(engine_for("llada", 0.0, mask_bias=2.5), "mask-bias", fast=False)
        dream_cases(engine_for("dream", 0.0, mask_bias=2.5), "mask-bias")
    summary = {}
    for case, rule, n, early, same_answer, same_canvas in rows:
        key = case.split(" ", 1)[1] if not case.startswith("mask-bias") else case
        a = summary.setdefault(key, [0, 0, 0, 0])
        a[0] += 1
        a[1] += early
        a[2] += same_answer
        a[3] += same_canvas
    print(f"| {'case':70s} | runs | ended early | same answer | same canvas |")
    print("| --- | --- | --- | --- | --- |")
    for key, (n, early, sa, sc) in summary.items():
        print(f"| {key:70s} | {n} | {early} | {sa} | {sc} |")


if __name__ == "__main__":
    main()
