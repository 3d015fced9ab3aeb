"""engine.hub against the fake Hub: pull, resume, offline, refusals, cache listing, memory fit."""
import json
from pathlib import Path

import pytest
import torch

from flash_dllm.app.cli import main
from flash_dllm.engine import hub
from flash_dllm.engine.config import SUPPORTED
from flash_dllm.engine.hub import HubError, fit_check, list_cached_models, pull, remote_weight_bytes, resolve_model

DECOYS = {"pytorch_model.bin": b"pickle" * 100, "training_args.bin": b"x" * 10, "optimizer.pt": b"y" * 10,
          "README.md": b"# tiny\n"}
MODEL_FILES = {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
               "model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
SHARD = "model-00001-of-00002.safetensors"


def weight_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def one_line(message: str) -> bool:
    return "\n" not in message.strip() and len(message) < 400


def test_pull_fetches_only_model_files_into_the_hf_cache(fake_hub, tiny_llada, tmp_path):
    fake_hub.add_repo("tiny/llada", tiny_llada, extra=DECOYS)
    seen = []
    folder = pull("tiny/llada", progress=lambda done, total: seen.append((done, total)))
    cache = tmp_path / "hf-home" / "hub" / "models--tiny--llada" / "snapshots"
    assert folder.parent == cache and folder.name == fake_hub.commit("tiny/llada")
    assert {p.name for p in folder.iterdir()} == MODEL_FILES
    for name in MODEL_FILES:
        assert (folder / name).read_bytes() == (tiny_llada / name).read_bytes()
    fetched = {r.path.rsplit("/", 1)[-1] for r in fake_hub.requests if "/resolve/" in r.path}
    assert not fetched & set(DECOYS), "a pickle or other unneeded file was requested"
    total = weight_bytes(tiny_llada)
    assert seen[-1] == (total, total) and all(b[0] >= a[0] for a, b in zip(seen, seen[1:]))
    assert remote_weight_bytes("tiny/llada") == total
    assert not list((folder.parent.parent / "blobs").glob("*.incomplete"))
    fake_hub.requests.clear()
    assert pull("tiny/llada") == folder  # already there at the Hub's commit: one look-up, nothing fetched
    asked = [r.path for r in fake_hub.requests if r.path != "/api/agent-harnesses"]
    assert asked == ["/api/models/tiny/llada/revision/main"]


def test_hf_hub_cache_is_honoured(fake_hub, tiny_dream, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    fake_hub.add_repo("tiny/dream", tiny_dream)
    assert pull("tiny/dream").is_relative_to(tmp_path / "elsewhere" / "models--tiny--dream")


def test_dropped_connection_resumes_within_the_same_pull(fake_hub, tiny_llada):
    fake_hub.add_repo("tiny/llada", tiny_llada)
    fake_hub.interrupt(SHARD, after_bytes=50_000)
    folder = pull("tiny/llada")
    assert [r.range for r in fake_hub.gets(SHARD)] == [None, "bytes=50000-"]
    assert (folder / SHARD).read_bytes() == (tiny_llada / SHARD).read_bytes()


def test_interrupted_pull_resumes_on_the_next_run(fake_hub, tiny_llada):
    fake_hub.add_repo("tiny/llada", tiny_llada)
    fake_hub.interrupt(SHARD, after_bytes=50_000, then_fail=True)  # the connection drops and stays down
    with pytest.raises(HubError) as failure:
        pull("tiny/llada")
    assert one_line(str(failure.value)) and "again to resume" in str(failure.value)
    partial = list(hub.HubEnv.current().storage("tiny/llada").glob("blobs/*.incomplete"))
    assert [p.stat().st_size for p in partial] == [50_000]
    fake_hub.heal()
    fake_hub.requests.clear()
    folder = pull("tiny/llada")
    assert [r.range for r in fake_hub.gets(SHARD)] == ["bytes=50000-"]
    assert (folder / SHARD).read_bytes() == (tiny_llada / SHARD).read_bytes()
    assert not partial[0].exists()


def test_cached_model_works_offline_and_without_network(fake_hub, tiny_llada, monkeypatch):
    fake_hub.add_repo("tiny/llada", tiny_llada)
    folder = pull("tiny/llada")
    fake_hub.stop()
    assert resolve_model("tiny/llada") == folder  # Hub unreachable: the cache answers
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("tiny/llada") == folder
    assert remote_weight_bytes("tiny/llada") == weight_bytes(tiny_llada)


def test_generate_from_the_hub_then_offline(fake_hub, tiny_llada, monkeypatch, capsys):
    fake_hub.add_repo("tiny/llada", tiny_llada)
    argv = ["generate", "--model", "tiny/llada", "--prompt", "hi", "--method", "llada",
            "--gen-length", "8", "--block-length", "8", "--json"]
    assert main(argv) == 0
    online = json.loads(capsys.readouterr().out)
    fake_hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(argv) == 0
    offline = json.loads(capsys.readouterr().out)
    assert online["model"] == offline["model"] == "tiny/llada"
    assert online["token_ids"] == offline["token_ids"]


def test_offline_without_cache_is_one_clear_line(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError) as failure:
        resolve_model("tiny/absent")
    assert one_line(str(failure.value)) and "offline" in str(failure.value) and "tiny/absent" in str(failure.value)
    assert fake_hub.requests == []


def test_unreachable_hub_without_cache(fake_hub):
    fake_hub.stop()
    with pytest.raises(HubError) as failure:
        pull("tiny/absent")
    assert one_line(str(failure.value)) and "cannot reach" in str(failure.value)


def test_unsupported_repo_is_refused_before_any_weight_moves(fake_hub):
    bert = {"config.json": json.dumps({"model_type": "bert", "architectures": ["BertModel"]}).encode(),
            "model.safetensors": b"\0" * 200_000}
    fake_hub.add_repo("org/bert", extra=bert)
    with pytest.raises(HubError) as failure:
        pull("org/bert")
    assert one_line(str(failure.value)) and "'bert'" in str(failure.value) and SUPPORTED in str(failure.value)
    assert fake_hub.gets(".safetensors") == []
    assert "org/bert" not in [m.name for m in list_cached_models()]


def test_repo_with_only_pickle_weights_is_refused(fake_hub, tiny_llada):
    fake_hub.add_repo("org/pickles", extra={"config.json": (tiny_llada / "config.json").read_bytes(),
                                            "pytorch_model.bin": b"pickle" * 1000})
    with pytest.raises(HubError, match="safetensors"):
        pull("org/pickles")
    assert fake_hub.gets(".bin") == []


def test_unknown_repo(fake_hub):
    with pytest.raises(HubError, match="no such model"):
        pull("org/nothing-here")


def test_list_cached_models(fake_hub, tiny_llada, tiny_dream):
    fake_hub.add_repo("tiny/llada", tiny_llada)
    fake_hub.add_repo("tiny/dream", tiny_dream)
    pull("tiny/llada")
    pull("tiny/dream")
    listed = {m.name: m for m in list_cached_models()}
    assert listed["tiny/llada"].family == "llada" and listed["tiny/dream"].family == "dream"
    assert listed["tiny/llada"].size_bytes == weight_bytes(tiny_llada)
    assert (listed["tiny/dream"].path / "config.json").is_file()
    bundled = hub.bundled_model_path()
    if bundled is not None:
        assert listed[bundled.name].path == bundled


def test_resolve_model_local_inputs(tiny_llada, tmp_path):
    assert resolve_model(str(tiny_llada)) == tiny_llada.resolve()
    with pytest.raises(HubError, match="not a Hugging Face repo id"):
        resolve_model(str(tmp_path / "no" / "such" / "folder"))
    with pytest.raises(HubError, match="is a file"):
        resolve_model(str(tiny_llada / "config.json"))
    with pytest.raises(HubError, match="no model given"):
        resolve_model("  ")
    bundled = hub.bundled_model_path()
    if bundled is not None:  # what a user types for the small model: "bundled" or its folder's name
        assert resolve_model("bundled") == bundled and resolve_model(bundled.name) == bundled
        with pytest.raises(HubError, match=f"or a bundled model \\(bundled, {bundled.name}"):
            resolve_model("tiny-chatt")


def test_fit_check_on_cpu():
    ok, message = fit_check(10 * 2**20, "cpu")
    assert ok and "GiB" in message
    ok, message = fit_check(2**60, "cpu")
    assert not ok and "does not fit" in message and "RAM" in message


def test_fit_check_counts_the_cpu_upcast_to_fp32():
    import psutil

    half = int((psutil.virtual_memory().available - 2**30) / 1.2 * 0.75)  # fits as bf16, not as fp32
    ok, message = fit_check(half, "cpu")
    assert not ok and "as fp32" in message
    assert fit_check(half, "cpu", "bf16")[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_fit_check_without_gpu():
    ok, message = fit_check(2**30, "cuda")
    assert not ok and "no CUDA GPU" in message
