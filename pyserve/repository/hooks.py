"""Load hooks: code run on a model's directory before the model is read, in the spirit of Triton's repository agents.

A hook is any callable ``hook(model_dir, config)`` (``config`` is the parsed ``model_config_pb2.ModelConfig``, a
copy: changing it changes nothing). It returns None to load from ``model_dir`` as it is, or another directory to load
from instead (a decrypted or downloaded copy), and raises to refuse the load.

``checksum_hook`` is the one built-in hook, run for every model: it checks the digests a config lists, either as
Triton's checksum agent reads them::

    model_repository_agents { agents [ { name: "checksum", parameters { key: "MD5:1/model.onnx" value: "..." } } ] }

or as model parameters whose key names an algorithm::

    parameters { key: "sha256:1/model.onnx" value { string_value: "..." } }

Paths are relative to the model directory; the algorithms are hashlib's (md5, sha1, sha256, sha512, ...), in any
case.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from pyserve.errors import ConfigError
from pyserve.frontends.protocol import model_config_pb2

CHECKSUM_AGENT = "checksum"
# Triton repository agents pyserve provides, by the name a config's model_repository_agents gives them.
AVAILABLE_AGENTS = (CHECKSUM_AGENT,)
_ALGORITHMS = frozenset({"md5", "sha1", "sha224", "sha256", "sha384", "sha512", "blake2b", "blake2s"})


class LoadHook(Protocol):
    """Runs before a model is read: returns a directory to load from instead, or None; raises to refuse the load."""

    def __call__(self, model_dir: Path, config: model_config_pb2.ModelConfig) -> Path | None:
        """Check or prepare ``model_dir`` for loading the model ``config`` describes."""
        ...


def check_agents(model_name: str, config: model_config_pb2.ModelConfig) -> None:
    """Refuse a config that asks for a repository agent pyserve does not provide."""
    for agent in config.model_repository_agents.agents:
        if agent.name not in AVAILABLE_AGENTS:
            available = ", ".join(repr(name) for name in AVAILABLE_AGENTS)
            raise ConfigError(
                f"model '{model_name}': repository agent '{agent.name}' is not available (pyserve provides "
                f"{available}; run other checks as a load hook)"
            )


def checksum_hook(model_dir: Path, config: model_config_pb2.ModelConfig) -> None:
    """Check every file digest the config lists; ConfigError naming the file (and both digests on a mismatch)."""
    model_name = config.name or model_dir.name
    for key, expected in _listed_checksums(config):
        algorithm, _, relative = key.partition(":")
        if not relative or algorithm.lower() not in _ALGORITHMS:
            raise ConfigError(
                f"model '{model_name}': checksum key {key!r} must be '<algorithm>:<path in the model directory>' "
                f"with an algorithm among {', '.join(sorted(_ALGORITHMS))}"
            )
        path = (model_dir / relative).resolve()
        if not path.is_relative_to(model_dir.resolve()):
            raise ConfigError(f"model '{model_name}': checksum path '{relative}' lies outside the model directory")
        if not path.is_file():
            raise ConfigError(f"model '{model_name}': file '{relative}' listed for a checksum does not exist")
        actual = _digest(path, algorithm.lower())
        if actual != expected.strip().lower():
            raise ConfigError(
                f"model '{model_name}': {algorithm.upper()} checksum mismatch for file '{relative}': expected "
                f"{expected}, got {actual}"
            )


def run_hooks(model_dir: Path, config: model_config_pb2.ModelConfig, hooks: Sequence[LoadHook]) -> Path:
    """Run the hooks in order, each on the directory the previous one left; the directory to load from.

    A ConfigError from a hook passes through; any other exception becomes a ConfigError naming the hook.
    """
    model_name = config.name or model_dir.name
    for hook in hooks:
        view = model_config_pb2.ModelConfig()
        view.CopyFrom(config)
        try:
            replacement = hook(model_dir, view)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"model '{model_name}': load hook {_hook_name(hook)} refused the load: {type(exc).__name__}: {exc}"
            ) from exc
        if replacement is not None:
            replacement = Path(replacement)
            if not replacement.is_dir():
                raise ConfigError(
                    f"model '{model_name}': load hook {_hook_name(hook)} returned {str(replacement)!r}, which is "
                    "not a directory"
                )
            model_dir = replacement
    return model_dir


def _listed_checksums(config: model_config_pb2.ModelConfig) -> list[tuple[str, str]]:
    listed = [
        (key, parameter.string_value)
        for key, parameter in sorted(config.parameters.items())
        if key.partition(":")[0].lower() in _ALGORITHMS
    ]
    for agent in config.model_repository_agents.agents:
        if agent.name == CHECKSUM_AGENT:
            listed.extend(sorted(agent.parameters.items()))
    return listed


def _digest(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _hook_name(hook: LoadHook) -> str:
    return repr(getattr(hook, "__qualname__", None) or type(hook).__qualname__)
