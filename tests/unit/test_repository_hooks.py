"""Load hooks: the checksum check (config parameters and Triton's checksum agent), user hooks that replace the
model directory or refuse the load, and how read_model runs them."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2
from pyserve.repository import checksum_hook, parse_config_text, read_model, run_hooks

WEIGHTS = b"the model's weights"
MD5 = hashlib.md5(WEIGHTS).hexdigest()
SHA256 = hashlib.sha256(WEIGHTS).hexdigest()
BASE_CONFIG = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def model_dir(root: Path, config: str = BASE_CONFIG, filename: str = "model.onnx") -> Path:
    directory = root / "m"
    (directory / "1").mkdir(parents=True)
    (directory / "1" / filename).write_bytes(WEIGHTS)
    (directory / "config.pbtxt").write_text(config)
    return directory


def parameter(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def agent(name: str, key: str, value: str) -> str:
    entry = f'name: "{name}" parameters {{ key: "{key}" value: "{value}" }}'
    return f"model_repository_agents {{ agents [ {{ {entry} }} ] }}\n"


@pytest.mark.parametrize(
    "listing",
    [
        parameter("sha256:1/model.onnx", SHA256),
        parameter("MD5:1/model.onnx", MD5.upper()),
        agent("checksum", "MD5:1/model.onnx", MD5),
        agent("checksum", "sha256:1/model.onnx", SHA256),
    ],
)
def test_matching_checksums_pass(tmp_path: Path, listing: str) -> None:
    directory = model_dir(tmp_path)
    checksum_hook(directory, parse_config_text(BASE_CONFIG + listing, "m"))


@pytest.mark.parametrize(
    "listing",
    [parameter("sha256:1/model.onnx", "0" * 64), agent("checksum", "MD5:1/model.onnx", "0" * 32)],
)
def test_a_mismatch_names_the_file_and_both_digests(tmp_path: Path, listing: str) -> None:
    directory = model_dir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        checksum_hook(directory, parse_config_text(BASE_CONFIG + listing, "m"))
    message = str(caught.value)
    assert message.startswith("model 'm': ")
    assert "checksum mismatch for file '1/model.onnx'" in message
    assert "0" * 32 in message
    assert (SHA256 if "sha256" in listing else MD5) in message


def test_a_listed_file_that_is_missing_is_an_error(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    config = parse_config_text(BASE_CONFIG + parameter("md5:2/model.onnx", MD5), "m")
    with pytest.raises(ConfigError, match=r"model 'm': file '2/model.onnx' listed for a checksum does not exist"):
        checksum_hook(directory, config)


@pytest.mark.parametrize("key", ["CRC32:1/model.onnx", "1/model.onnx", "md5:"])
def test_a_checksum_agent_key_names_an_algorithm_and_a_file(tmp_path: Path, key: str) -> None:
    directory = model_dir(tmp_path)
    config = parse_config_text(BASE_CONFIG + agent("checksum", key, MD5), "m")
    with pytest.raises(ConfigError, match=r"must be '<algorithm>:<path in the model directory>'"):
        checksum_hook(directory, config)


def test_a_checksum_path_cannot_leave_the_model_directory(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    (tmp_path / "secret").write_bytes(WEIGHTS)
    config = parse_config_text(BASE_CONFIG + parameter("md5:../secret", MD5), "m")
    with pytest.raises(ConfigError, match=r"lies outside the model directory"):
        checksum_hook(directory, config)


def test_read_model_refuses_a_model_whose_checksum_fails(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, BASE_CONFIG + agent("checksum", "MD5:1/model.onnx", "0" * 32))
    with pytest.raises(ConfigError, match=r"model 'm': MD5 checksum mismatch for file '1/model.onnx'"):
        read_model(directory)


def test_read_model_refuses_an_agent_pyserve_does_not_provide(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, BASE_CONFIG + agent("decrypt", "key", "secret"))
    with pytest.raises(ConfigError, match=r"model 'm': repository agent 'decrypt' is not available"):
        read_model(directory)


def test_a_hook_can_hand_back_another_directory_to_load_from(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, filename="model.onnx.enc")
    seen: list[tuple[Path, str]] = []

    def decrypt(source: Path, config: model_config_pb2.ModelConfig) -> Path:
        seen.append((source, config.name))
        target = tmp_path / "decrypted" / "m"
        shutil.copytree(source, target)
        (target / "1" / "model.onnx.enc").rename(target / "1" / "model.onnx")
        return target

    definition = read_model(directory, hooks=[decrypt])
    assert seen == [(directory, "m")]
    assert definition.model_dir == tmp_path / "decrypted" / "m"
    assert definition.model_files == {1: tmp_path / "decrypted" / "m" / "1" / "model.onnx"}


def test_without_the_hook_the_same_model_has_no_model_file(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, filename="model.onnx.enc")
    with pytest.raises(ConfigError, match=r"model 'm': version 1 has no model file 1/model.onnx"):
        read_model(directory)


def test_hooks_run_in_order_each_on_the_directory_the_last_one_left(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    calls: list[Path] = []

    def to_first(source: Path, config: model_config_pb2.ModelConfig) -> Path:
        calls.append(source)
        return first

    def keep(source: Path, config: model_config_pb2.ModelConfig) -> None:
        calls.append(source)

    def to_second(source: Path, config: model_config_pb2.ModelConfig) -> Path:
        calls.append(source)
        return second

    config = parse_config_text('name: "m"', "m")
    assert run_hooks(tmp_path, config, [to_first, keep, to_second]) == second
    assert calls == [tmp_path, first, first]


def test_a_hook_sees_a_copy_of_the_config(tmp_path: Path) -> None:
    def meddle(source: Path, config: model_config_pb2.ModelConfig) -> None:
        config.max_batch_size = 1

    config = parse_config_text("max_batch_size: 8", "m")
    run_hooks(tmp_path, config, [meddle])
    assert config.max_batch_size == 8


def test_a_hook_that_raises_refuses_the_load(tmp_path: Path) -> None:
    def deny(source: Path, config: model_config_pb2.ModelConfig) -> None:
        raise PermissionError("model is not signed")

    directory = model_dir(tmp_path)
    with pytest.raises(ConfigError, match=r"model 'm': load hook '.*deny' refused the load: PermissionError: model is"):
        read_model(directory, hooks=[deny])


def test_a_hook_must_hand_back_a_directory(tmp_path: Path) -> None:
    def nowhere(source: Path, config: model_config_pb2.ModelConfig) -> Path:
        return tmp_path / "missing"

    with pytest.raises(ConfigError, match=r"returned .*missing.*, which is not a directory"):
        run_hooks(tmp_path, parse_config_text("", "m"), [nowhere])
