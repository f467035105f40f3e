"""The registry of bound models: every model version the core serves, by name then version.

A model version itself is a ``ModelEntry`` (``pyserve.core.inference``, beside the requests that point at it).
"""

from __future__ import annotations

from pyserve.core.inference import ModelEntry
from pyserve.errors import ModelAlreadyBoundError, ModelNotFoundError


class Registry:
    """All bound model versions, by name then version."""

    def __init__(self) -> None:
        self._models: dict[str, dict[int, ModelEntry]] = {}

    def add(self, entry: ModelEntry) -> None:
        """Register a model version; binding the same name and version twice is an error."""
        versions = self._models.setdefault(entry.name, {})
        if entry.version in versions:
            raise ModelAlreadyBoundError(f"model '{entry.name}' version {entry.version} is already bound")
        versions[entry.version] = entry

    def remove(self, name: str, version: int) -> ModelEntry | None:
        """Forget a model version."""
        versions = self._models.get(name, {})
        entry = versions.pop(version, None)
        if not versions:
            self._models.pop(name, None)
        return entry

    def get(self, name: str, version: str | int | None = None) -> ModelEntry:
        """A model version; without a version, the highest one. Raises ModelNotFoundError."""
        versions = self._models.get(name)
        if not versions:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found")
        if version is None or version == "":
            return versions[max(versions)]
        try:
            number = int(version)
        except (TypeError, ValueError):
            raise ModelNotFoundError(f"Request for unknown model: '{name}' version {version!r} is not found") from None
        entry = versions.get(number)
        if entry is None:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' version {number} is not found")
        return entry

    def entries(self) -> list[ModelEntry]:
        """Every model version, sorted by name and version."""
        return [self._models[name][v] for name in sorted(self._models) for v in sorted(self._models[name])]

    def versions(self, name: str) -> list[ModelEntry]:
        """All versions of one model (empty when unknown)."""
        return [entry for _, entry in sorted(self._models.get(name, {}).items())]
