"""In one process: the decode step with the gate/up and LM-head weights stored [N, K] (what cuBLAS sees as TN,
today's layout) against the same tensors stored [K, N] and viewed as [N, K] (cuBLAS sees NN; F.linear is
unchanged). LLaDA-8B geometry, random weights, batch 1, alternating rounds; each round drops the decode session
(its captured graph points at the old weights) and measures like `bench decode` (bench_worker.measure).
Also: the largest logit difference of one cached step between the layouts (another cuBLAS kernel sums in
another order, so bits may differ)."""
import statistics
import sys
from types import SimpleNamespace

import torch

from flash_dllm.engine.bench_worker import copy_bandwidth_gbs, measure
from flash_dllm.engine.geometry import random_engine


def set_layout(engine, nn: bool) -> None:
    model = engine.model
    engine.release_decode_memory()
    engine._decode = None
    for layer in model.layers:
        w = layer.w_gate_up
        layer.w_gate_up = w.t().contiguous().t() if nn else w.contiguous()
    model.lm_head = model.lm_head.t().contiguous().t() if nn else model.lm_head.contiguous()
    torch.cuda.empty_cache()
    assert model.layers[0].w_gate_up.is_contiguous() != nn


def logits_probe(engine, x):
    with torch.no_grad():
        return torch.nn.functional.linear(x, engine.model.lm_head).float(), \
            torch.nn.functional.linear(x, engine.model.layers[0].w_gate_up).float()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    engine = random_engine("llada-8b", "cuda")
    print(torch.cuda.get_device_name(0), torch.__version__, f"copy {copy_bandwidth_gbs(torch.device('cuda')):.0f} GB/s",
          flush=True)
    args = SimpleNamespace(gen_length=512, prompt_length=800, iterations=400)
    x = torch.randn(128, 4096, device="cuda", dtype=torch.bfloat16)
    ref = logits_probe(engine, x)
    results = {False: {"flash-cache": [], "flash-verify": []}, True: {"flash-cache": [], "flash-verify": []}}
    with torch.no_grad():
        for r in range(rounds):
            for nn in (False, True) if r % 2 == 0 else (True, False):
                set_layout(engine, nn)
                if nn and r == 0:
                    now = logits_probe(engine, x)
                    print("max |diff| lm_head", (now[0] - ref[0]).abs().max().item(), "gate_up",
                          (now[1] - ref[1]).abs().max().item(), flush=True)
                for method in ("flash-cache", "flash-verify"):
                    row = measure(engine, method, 1, args)
                    results[nn][method].append(row["iter_ms_median"])
                    print(f"round {r} {'NN' if nn else 'TN'} {method}: {row['iter_ms_median']:.3f} ms "
                          f"({row['iterations']} iterations)", flush=True)
    for method in ("flash-cache", "flash-verify"):
        tn, nn = results[False][method], results[True][method]
        print(f"{method}: TN median {statistics.median(tn):.3f} (min {min(tn):.3f} max {max(tn):.3f}) | "
              f"NN median {statistics.median(nn):.3f} (min {min(nn):.3f} max {max(nn):.3f}) | "
              f"NN/TN {statistics.median(nn) / statistics.median(tn):.4f}", flush=True)


if __name__ == "__main__":
    main()
