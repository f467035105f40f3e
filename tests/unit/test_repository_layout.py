"""The layout of a Triton model repository: model and version directories, fingerprints, version policies, the
backend told from the model file, file overrides and custom-op library paths."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format

from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2
from pyserve.repository import fingerprint, list_models, version_dirs
from pyserve.repository.layout import guess_backend, op_libraries, select_versions, write_model_files


def touch(path: Path, content: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_list_models_names_model_directories_sorted(tmp_path: Path) -> None:
    for name in ("resnet", "bert", ".git", "add_sub"):
        (tmp_path / name).mkdir()
    touch(tmp_path / "README.md")
    assert list_models(tmp_path) == ["add_sub", "bert", "resnet"]


def test_list_models_of_a_missing_repository_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model repository .*missing.* is not a directory"):
        list_models(tmp_path / "missing")


def test_version_dirs_are_the_numeric_subdirectories(tmp_path: Path) -> None:
    for name in ("1", "10", "2", "0", "01", "latest"):
        (tmp_path / name).mkdir()
    touch(tmp_path / "3")  # a file, not a version
    assert version_dirs(tmp_path) == [1, 2, 10]
    assert version_dirs(tmp_path / "missing") == []


def test_fingerprint_changes_with_any_file_under_the_model(tmp_path: Path) -> None:
    model = tmp_path / "m"
    config = touch(model / "config.pbtxt", b"max_batch_size: 8")
    weights = touch(model / "1" / "model.onnx", b"weights")
    first = fingerprint(model)
    assert first == fingerprint(model)

    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1_000_000))
    touched = fingerprint(model)
    assert touched != first

    config.write_bytes(b"max_batch_size: 16")
    edited = fingerprint(model)
    assert edited != touched

    (model / "2").mkdir()
    with_version = fingerprint(model)
    assert with_version != edited

    shutil.rmtree(model / "2")
    weights.unlink()
    assert fingerprint(model) not in (first, touched, edited, with_version)
    assert fingerprint(tmp_path / "missing") == ""


def policy(text: str) -> model_config_pb2.ModelVersionPolicy:
    return text_format.Parse(text, model_config_pb2.ModelVersionPolicy())


@pytest.mark.parametrize(
    ("text", "selected"),
    [
        ("", [3]),
        ("latest { num_versions: 2 }", [2, 3]),
        ("latest { num_versions: 9 }", [1, 2, 3]),
        ("all { }", [1, 2, 3]),
        ("specific { versions: [3, 1] }", [1, 3]),
    ],
)
def test_version_policy_selects_versions(text: str, selected: list[int]) -> None:
    assert select_versions("m", policy(text), [1, 2, 3]) == selected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("specific { versions: [2, 4] }", r"model 'm': version_policy specific selects versions \[2, 4\], but the "),
        ("specific { }", "specific selects versions"),
        ("latest { num_versions: 0 }", "model 'm': version_policy latest num_versions must be >= 1, got 0"),
    ],
)
def test_a_version_policy_that_selects_nothing_is_an_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        select_versions("m", policy(text), [1, 2, 3])


@pytest.mark.parametrize(
    ("filename", "backend"),
    [("model.onnx", "onnxruntime"), ("model.plan", "tensorrt"), ("model.pt", "pytorch"), ("model.py", "python")],
)
def test_the_backend_is_told_from_the_model_file(tmp_path: Path, filename: str, backend: str) -> None:
    touch(tmp_path / "2" / filename)
    assert guess_backend("m", tmp_path, [1, 2]) == backend


def test_without_a_known_model_file_the_backend_cannot_be_told(tmp_path: Path) -> None:
    touch(tmp_path / "1" / "weights.bin")
    with pytest.raises(ConfigError, match=r"model 'm': neither backend nor platform is configured and no model file"):
        guess_backend("m", tmp_path, [1])


def test_a_file_override_becomes_a_fresh_model_directory() -> None:
    model_dir = write_model_files("m", {"config.pbtxt": b"max_batch_size: 2", "1/model.onnx": b"onnx"})
    try:
        assert (model_dir / "config.pbtxt").read_bytes() == b"max_batch_size: 2"
        assert (model_dir / "1" / "model.onnx").read_bytes() == b"onnx"
        assert sorted(p.name for p in model_dir.iterdir()) == ["1", "config.pbtxt"]
    finally:
        shutil.rmtree(model_dir)


@pytest.mark.parametrize("key", ["../escape", "/etc/passwd", "1/../../escape", ""])
def test_a_file_override_stays_inside_the_model_directory(key: str) -> None:
    with pytest.raises(ConfigError, match=r"must be relative to the model dir"):
        write_model_files("m", {key: b"x"})


def test_op_libraries_resolve_against_the_model_directory(tmp_path: Path) -> None:
    touch(tmp_path / "libshipped.so")
    found = op_libraries(tmp_path, ["libshipped.so", "ops/libcustom.so", "libsystem.so", "/opt/lib/libabs.so"])
    assert found == (
        str(tmp_path / "libshipped.so"),
        str(tmp_path / "ops" / "libcustom.so"),
        "libsystem.so",  # not in the model directory: left to the dynamic loader's search path
        "/opt/lib/libabs.so",
    )
