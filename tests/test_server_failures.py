"""A real tritonserver that cannot come up: the launcher names the model's own error and the fix."""

from __future__ import annotations

import pytest

from hf2triton.errors import UserError
from hf2triton.specs import ServerSpec
from hf2triton.triton.modelconfig import build_model_config, config_text
from hf2triton.triton.process import start_server, stop_server
from hf2triton.triton.settings import Settings
from tests.helpers import server_block

pytestmark = pytest.mark.integration

FAILING_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        import hf2triton_no_such_module  # noqa: F401


    def execute(self, requests):
        return []
"""


def make_settings(tmp_path, models, startup_timeout_s=60) -> Settings:
    ports = {k: v for k, v in server_block().items() if k != "startup_timeout_s"}
    return Settings.of(ServerSpec(**ports, startup_timeout_s=startup_timeout_s), models, str(tmp_path / "work"), str(tmp_path / "repo"))


def start_failure(tmp_path, name: str, model_py: str | None, startup_timeout_s: int = 60) -> str:
    """Start a server over one model that cannot load; the UserError it ends with, rendered."""
    model = tmp_path / "repo" / name
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(config_text(build_model_config(name, "feature-extraction", 2, 1, "KIND_CPU", 0, {}, 4)))
    if model_py is not None:
        (model / "1" / "model.py").write_text(model_py)
    settings = make_settings(tmp_path, [name], startup_timeout_s)
    try:
        with pytest.raises(UserError) as info:
            start_server(settings)
    finally:
        stop_server(settings)
    return info.value.render()


def test_model_failing_in_initialize_is_explained(tmp_path, capsys):
    message = start_failure(tmp_path, "broken", FAILING_MODEL)
    assert "model broken failed to load" in message and "tritonserver.log" in message
    assert "install it into the .venv" in message, message  # the ModuleNotFoundError pitfall's fix
    printed = capsys.readouterr().err
    assert "hf2triton_no_such_module" in printed, printed


def test_missing_model_py_hits_the_startup_timeout(tmp_path):
    message = start_failure(tmp_path, "nofile", None, startup_timeout_s=20)
    assert "not ready after 20 s" in message or "exited" in message
    # the hint names the real cause and a command that works (it blamed shared memory, suggested `snakemake lint`)
    assert "1/model.py missing" in message and "`make serve`" in message, message
    assert "shared memory" not in message and "snakemake lint" not in message, message
