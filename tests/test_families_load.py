"""The new families end to end: recognised from config.json, pulled through the (fake) Hub, decoded greedily
through the CLI; their published defaults, allowed methods, end tokens, memory fit and benchmark geometries."""
import json
from dataclasses import replace

import pytest
import torch

from flash_dllm.app.cli import main
from flash_dllm.app.models import known_models
from flash_dllm.engine.config import UnsupportedModelError, config_from_dict
from flash_dllm.engine.families import BLOCK_DIFFUSION, FAMILY_DEFAULTS, KNOWN_MODELS, defaults_for
from flash_dllm.engine.settings import GenerationSettings, SettingsError, validate
from flash_dllm.engine.geometry import GEOMETRY, random_model, weight_bytes
from flash_dllm.engine.hub import GIB, fit_check, known_model_fits, list_cached_models, pull
from flash_dllm.engine.model import forward_full
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from flash_dllm.engine.tokenizer import load_tokenizer
from flash_dllm.engine.weights import load_model


@pytest.fixture(scope="module")
def tiny_moe_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-models")
    return {"llada-moe": write_tiny_model(root / "llada-moe", TinySpec(family="llada-moe"), shards=2),
            "llada2": write_tiny_model(root / "llada2", TinySpec(family="llada2", n_kv_heads=2))}


def raw_config(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_llada_moe_is_told_from_dense_llada_by_its_architecture(tiny_moe_folders, tiny_llada):
    raw = raw_config(tiny_moe_folders["llada-moe"])
    assert raw["model_type"] == "llada"  # as published: only the architecture and expert keys say MoE
    assert config_from_dict(raw).family == "llada-moe"
    assert config_from_dict(raw_config(tiny_llada)).family == "llada"


@pytest.mark.parametrize("key, value, named", [("use_bias", True, "use_bias"),
                                               ("num_nextn_predict_layers", 1, "num_nextn_predict_layers"),
                                               ("score_function", "tanh", "'tanh'"), ("n_group", 3, "3 groups")])
def test_llada2_configs_the_engine_cannot_run_are_refused_naming_the_key(tiny_moe_folders, key, value, named):
    raw = {**raw_config(tiny_moe_folders["llada2"]), key: value}
    with pytest.raises(UnsupportedModelError, match=named):
        config_from_dict(raw)


def test_pulled_from_the_hub_and_listed(fake_hub, tiny_moe_folders):
    for family, folder in tiny_moe_folders.items():
        fake_hub.add_repo(f"tiny/{family}", folder)
        model = load_model(pull(f"tiny/{family}"))
        assert model.config.family == family
    listed = {m.name: m.family for m in list_cached_models()}
    assert listed["tiny/llada-moe"] == "llada-moe" and listed["tiny/llada2"] == "llada2"


@pytest.mark.parametrize("method", ["llada", "fast-dllm"])
def test_llada_moe_generates_greedily_through_the_cli(fake_hub, tiny_moe_folders, capsys, method):
    fake_hub.add_repo("tiny/llada-moe", tiny_moe_folders["llada-moe"])
    argv = ["generate", "--model", "tiny/llada-moe", "--prompt", "hi", "--method", method, "--gen-length", "16",
            "--block-length", "8", "--kernels", "torch", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert first["token_ids"] and first["token_ids"] == again["token_ids"]
    model = load_model(tiny_moe_folders["llada-moe"])
    assert all(0 <= t < model.config.vocab_size and t != model.config.mask_id for t in first["token_ids"])


def test_llada2_generates_through_the_cli_with_its_block_method_by_default(fake_hub, tiny_moe_folders, capsys):
    fake_hub.add_repo("tiny/llada2", tiny_moe_folders["llada2"])
    base = ["generate", "--model", "tiny/llada2", "--prompt", "hi", "--gen-length", "32", "--kernels", "torch", "--json"]
    assert main(base) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert chosen["method"] == "block-diffusion" and len(chosen["token_ids"]) > 0
    assert main(base + ["--method", "block-diffusion"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == chosen["token_ids"]
    assert main(base + ["--method", "flash-cache"]) != 0
    assert "block-diffusion" in capsys.readouterr().err


def test_llada2_allows_only_the_block_decoder(tiny_moe_folders):
    cfg = load_model(tiny_moe_folders["llada2"]).config
    for method in ("llada", "fast-dllm", "flash-cache", "flash-verify", "dream"):
        with pytest.raises(SettingsError, match=BLOCK_DIFFUSION):
            validate(GenerationSettings(method=method), model_config=cfg)
    validate(GenerationSettings(method=BLOCK_DIFFUSION), model_config=cfg)
    validate(GenerationSettings(method="flash-cache"), model_config=load_model(tiny_moe_folders["llada-moe"]).config)


def test_published_defaults_by_checkpoint_then_family(tiny_dream, tiny_moe_folders):
    dream = load_model(tiny_dream).config
    coder = defaults_for(dream, "apple/DiffuCoder-7B-cpGRPO")
    assert (coder.gen_length, coder.steps, coder.temperature, coder.top_p) == (256, 256, 0.4, 0.95)
    assert defaults_for(dream, "Dream-org/Dream-Coder-v0-Instruct-7B").gen_length == 768
    assert defaults_for(dream, "some/other-dream") == FAMILY_DEFAULTS["dream"]
    assert defaults_for(dream, "inclusionAI/LLaDA2.0-mini") == FAMILY_DEFAULTS["dream"]  # family mismatch
    llada2 = defaults_for(load_model(tiny_moe_folders["llada2"]).config)
    assert llada2.settings_overrides() == {"gen_length": 512, "block_length": 32, "temperature": 0.0,
                                           "threshold": 0.95, "method": BLOCK_DIFFUSION}  # 32 steps a block at most
    assert FAMILY_DEFAULTS["dream"].settings_overrides()["block_length"] == 512  # one block: the whole answer


def test_ling_chat_template_and_end_tokens(tiny_moe_folders):
    folder = tiny_moe_folders["llada2"]
    tokenizer = load_tokenizer(folder, load_model(folder).config)
    text = tokenizer.tokenizer.decode(tokenizer.encode("hi"))
    assert text == "<role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>"
    ends = {tokenizer.tokenizer.convert_ids_to_tokens(i) for i in tokenizer.end_ids}
    assert ends == {"<|role_end|>", "<|endoftext|>"}


def test_only_llada2_mini_does_not_fit_a_24_gib_card():
    fits = {fit.repo: fit for fit in known_model_fits(24.0)}
    assert set(fits) == set(KNOWN_MODELS) and len(KNOWN_MODELS) == 7
    assert [repo for repo, fit in fits.items() if not fit.fits] == ["inclusionAI/LLaDA2.0-mini"]
    assert 30 < fits["inclusionAI/LLaDA2.0-mini"].weight_bytes / GIB < 31  # 16.26B parameters at 2 bytes
    assert all(fit.fits for fit in known_model_fits(40.0))
    labels = {choice.value: choice.label for choice in known_models(24.0)}
    assert "does not fit" in labels["inclusionAI/LLaDA2.0-mini"] and "fits a 24" in labels["apple/DiffuCoder-7B-cpGRPO"]


def test_fit_check_says_there_is_no_quantised_mode():
    ok, message = fit_check(2**60, "cpu", "bf16")
    assert not ok and "no quantised" in message
    assert "quantised" not in fit_check(2**20, "cpu", "bf16")[1]


def test_published_parameter_counts():
    assert abs(GEOMETRY["llada2-mini"].n_params / 1e9 - 16.26) < 0.05
    assert abs(GEOMETRY["llada-moe"].n_params / 1e9 - 7.36) < 0.05


@pytest.mark.parametrize("geometry", ["llada-moe", "llada2-mini"])
def test_random_geometry_builds_every_tensor(geometry):
    """The benchmark geometries at toy width: random_model builds every tensor the forward reads, and
    weight_bytes counts the experts."""
    cfg = GEOMETRY[geometry]
    small_moe = replace(cfg.moe, n_experts=16, top_k=4, expert_hidden=8, shared_hidden=8 * bool(cfg.moe.shared_hidden),
                        n_group=min(cfg.moe.n_group, 8), topk_group=min(cfg.moe.topk_group, 4))
    small = replace(cfg, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2 if cfg.n_kv_heads < cfg.n_heads else 4,
                    head_dim=16, rotary_dim=8 if cfg.rotary_dim else None, mlp_hidden=32, vocab_size=300,
                    max_seq_len=128, mask_id=299, eos_id=298, moe=small_moe)
    model = random_model(small, "cpu", torch.float32)
    assert weight_bytes(model) == 4 * small.n_params
    logits = forward_full(model, torch.randint(0, 300, (1, 40)))
    assert torch.isfinite(logits).all()
