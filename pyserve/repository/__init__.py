"""Triton-layout model repositories: reading a model's config, versions and files, and the hooks run before a load.

``read_model(model_dir)`` gives a ``ModelDefinition`` (the specs the core serves, the files backends load, the config
in Triton's JSON form); ``list_models``, ``version_dirs`` and ``fingerprint`` read the layout for the repository's
control modes (``fingerprint`` changes when a model's files do: what polling compares).
"""

from pyserve.repository.config_document import parse_config_text
from pyserve.repository.hooks import LoadHook, checksum_hook, run_hooks
from pyserve.repository.layout import fingerprint, list_models, version_dirs
from pyserve.repository.model_config import ModelDefinition, declares_ensemble, read_model

__all__ = [
    "LoadHook",
    "ModelDefinition",
    "checksum_hook",
    "declares_ensemble",
    "fingerprint",
    "list_models",
    "parse_config_text",
    "read_model",
    "run_hooks",
    "version_dirs",
]
