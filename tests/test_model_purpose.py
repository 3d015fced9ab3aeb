"""The page says what the bundled model is for (issue #22, item 4): one line beside it, in the model list and
the banner, and none beside any other model."""
from __future__ import annotations

from types import SimpleNamespace

from flash_dllm.app import handlers
from flash_dllm.app.models import ModelHost, model_purpose
from flash_dllm.engine import hub

LINE = "a 19M-parameter demo model: small arithmetic, lists, short word problems"


def _bundled() -> str:
    folder = hub.bundled_model_path()
    assert folder is not None and folder.name == "tiny-chat", "the bundled tiny-chat model is missing"
    return str(folder)


def test_the_bundled_model_has_its_purpose_line_and_other_models_none(tmp_path):
    assert model_purpose(_bundled()) == LINE
    assert model_purpose("tiny-chat") == LINE  # named as the command line accepts it
    impostor = tmp_path / "tiny-chat"
    impostor.mkdir()
    assert model_purpose(str(impostor)) == ""  # same folder name, not the bundled model
    for other in ("GSAI-ML/LLaDA-8B-Instruct", "", None, str(tmp_path)):
        assert model_purpose(other) == ""


def test_the_model_list_shows_the_line_beside_the_bundled_model_only():
    labels = {choice.value: choice.label for choice in ModelHost().choices()}
    assert LINE in labels[_bundled()]
    assert sum(LINE in label for label in labels.values()) == 1


def test_the_banner_shows_the_line_while_the_bundled_model_is_loaded():
    def banner(name):
        host = ModelHost(name=name)
        return handlers.banner_html(SimpleNamespace(host=host, share_note=""))

    assert LINE in banner(_bundled())
    assert LINE not in banner("GSAI-ML/LLaDA-8B-Instruct")
