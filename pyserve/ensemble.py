"""Ensembles: pipelines of models whose edges are named tensors, run inside the core.

``Step`` declares one node of the graph: the model it runs, which ensemble tensor feeds each model input and which
ensemble tensor each model output becomes (Triton's ``input_map`` / ``output_map``, keyed by the model's own tensor
names). ``EnsembleSpec`` is the one internal form of an ensemble, whatever declared it (``Serve.bind_ensemble``
today; a Triton ``config.pbtxt`` with ``ensemble_scheduling`` can produce the same object). It checks its graph on
construction (tensor names connect, no cycles, every output produced), and ``check_models`` checks it against the
models it composes (each exists, tensor names, datatypes and shapes agree): ``Serve.bind_ensemble`` and the core
run that same function, against the models each of them knows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyserve.config import ModelConfig, ModelSpec, Tensor
from pyserve.errors import ConfigError

# (model name, version or None for the latest) -> that model's spec, or None when it is not bound.
SpecLookup = Callable[[str, "int | None"], "ModelSpec | None"]


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of an ensemble: run ``model`` on ensemble tensors and publish its outputs as ensemble tensors.

    ``inputs`` maps each input of the model to the ensemble tensor that feeds it, ``outputs`` each output of the
    model to the ensemble tensor it becomes (Triton's ``input_map`` / ``output_map``)::

        Step("tokenize", inputs={"text": "TEXT"}, outputs={"ids": "token_ids"})

    ``version`` None runs the model's latest version. ``name`` labels the step in error messages (default: the
    model's name).
    """

    model: str
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    version: int | None = None
    name: str = ""

    def __post_init__(self) -> None:
        where = f"step {self.name or self.model!r}"
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"ensemble step: model must be a non-empty string, got {self.model!r}")
        for field in ("inputs", "outputs"):
            mapping = getattr(self, field)
            if not isinstance(mapping, Mapping):
                raise ConfigError(f"{where}: {field} must be a mapping of model tensor -> ensemble tensor")
            for key, value in mapping.items():
                if not isinstance(key, str) or not key or not isinstance(value, str) or not value:
                    raise ConfigError(f"{where}: {field} must map non-empty names to names, got {key!r}: {value!r}")
            object.__setattr__(self, field, dict(mapping))
        if not self.outputs:
            raise ConfigError(f"{where}: map at least one output of model '{self.model}' to an ensemble tensor")
        targets = list(self.outputs.values())
        dupes = sorted({t for t in targets if targets.count(t) > 1})
        if dupes:
            raise ConfigError(f"{where}: several outputs map to the same ensemble tensor(s) {dupes}")
        if self.version is not None and (
            not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1
        ):
            raise ConfigError(f"{where}: version must be None (latest) or an integer >= 1, got {self.version!r}")
        if not isinstance(self.name, str):
            raise ConfigError(f"ensemble step: name must be a string, got {self.name!r}")


@dataclasses.dataclass(frozen=True)
class EnsembleSpec:
    """An ensemble as the core serves it: its own tensors (like a model's) and a DAG of steps.

    With ``max_batch_size`` > 0 the ensemble's tensors have a batch dimension (left out of their shapes, as for a
    model) and every composing model must batch at least that many rows.
    """

    name: str
    version: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    steps: tuple[Step, ...]
    max_batch_size: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        if not isinstance(self.max_batch_size, int) or self.max_batch_size < 0:
            raise ConfigError(f"ensemble '{self.name}': max_batch_size must be >= 0, got {self.max_batch_size!r}")
        self.model_spec()  # name, version and tensor declarations, checked as a model's are
        if not self.steps:
            raise ConfigError(f"ensemble '{self.name}': at least one step is required")
        for step in self.steps:
            if not isinstance(step, Step):
                raise ConfigError(f"ensemble '{self.name}': steps must be Step objects, got {step!r}")
        given = [step.name for step in self.steps if step.name]
        dupes = sorted({n for n in given if given.count(n) > 1})
        if dupes:
            raise ConfigError(f"ensemble '{self.name}': duplicate step names {dupes}")
        self._check_graph()

    # what the core needs ------------------------------------------------------------------------------------------

    def model_spec(self) -> ModelSpec:
        """The ensemble seen as a model (its name, version, tensors, batching), as the registry serves it."""
        return ModelSpec(
            name=self.name,
            version=self.version,
            inputs=tuple(self.inputs),
            outputs=tuple(self.outputs),
            config=ModelConfig(max_batch_size=self.max_batch_size, batcher=None),
        )

    def labels(self) -> list[str]:
        """How errors name each step: its name, else its model's (with its position when the model repeats)."""
        models = [step.model for step in self.steps]
        return [
            step.name or (step.model if models.count(step.model) == 1 else f"{step.model}#{index}")
            for index, step in enumerate(self.steps)
        ]

    def producers(self) -> dict[str, int]:
        """Ensemble tensor -> index of the step that produces it."""
        return {tensor: index for index, step in enumerate(self.steps) for tensor in step.outputs.values()}

    def to_wire(self) -> dict[str, Any]:
        """A msgpack-able description for the core process."""
        io = self.model_spec().to_wire()
        return {
            "name": self.name,
            "version": self.version,
            "max_batch_size": self.max_batch_size,
            "inputs": io["inputs"],
            "outputs": io["outputs"],
            "steps": [
                {
                    "model": step.model,
                    "version": step.version,
                    "inputs": dict(step.inputs),
                    "outputs": dict(step.outputs),
                    "name": step.name,
                }
                for step in self.steps
            ],
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> EnsembleSpec:
        """Rebuild a spec sent by to_wire()."""
        return cls(
            name=data["name"],
            version=data["version"],
            inputs=tuple(Tensor(n, d, tuple(s), o) for n, d, s, o in data["inputs"]),
            outputs=tuple(Tensor(n, d, tuple(s), o) for n, d, s, o in data["outputs"]),
            steps=tuple(Step(s["model"], s["inputs"], s["outputs"], s["version"], s["name"]) for s in data["steps"]),
            max_batch_size=data["max_batch_size"],
        )

    # the graph on its own -----------------------------------------------------------------------------------------

    def _check_graph(self) -> None:
        labels = self.labels()
        inputs = {t.name for t in self.inputs}
        producers: dict[str, int] = {}
        for index, step in enumerate(self.steps):
            for tensor in step.outputs.values():
                if tensor in inputs:
                    raise ConfigError(
                        f"ensemble '{self.name}': step '{labels[index]}' writes tensor '{tensor}', which is an input "
                        "of the ensemble"
                    )
                if tensor in producers:
                    raise ConfigError(
                        f"ensemble '{self.name}': tensor '{tensor}' is produced by both step "
                        f"'{labels[producers[tensor]]}' and step '{labels[index]}'"
                    )
                producers[tensor] = index
        consumed: set[str] = set()
        for index, step in enumerate(self.steps):
            for model_input, tensor in step.inputs.items():
                if tensor not in inputs and tensor not in producers:
                    raise ConfigError(
                        f"ensemble '{self.name}': step '{labels[index]}' input '{model_input}' reads tensor "
                        f"'{tensor}', which is neither an ensemble input nor produced by any step"
                    )
                consumed.add(tensor)
        unused = sorted(inputs - consumed)
        if unused:
            raise ConfigError(f"ensemble '{self.name}': input(s) {unused} are not read by any step")
        for output in self.outputs:
            if output.name not in producers:
                raise ConfigError(f"ensemble '{self.name}': output '{output.name}' is not produced by any step")
        cycle = _find_cycle(self.steps, producers)
        if cycle:
            path = " -> ".join(f"'{labels[i]}'" for i in cycle)
            raise ConfigError(f"ensemble '{self.name}': steps form a cycle: {path}")


def _find_cycle(steps: tuple[Step, ...], producers: dict[str, int]) -> list[int]:
    """A cycle of step indexes (first repeated last), or [] when the steps form a DAG."""
    after = [sorted({producers[t] for t in step.inputs.values() if t in producers}) for step in steps]
    state = [0] * len(steps)  # 0 unseen, 1 on the current path, 2 done
    path: list[int] = []

    def visit(index: int) -> list[int]:
        state[index] = 1
        path.append(index)
        for before in after[index]:
            if state[before] == 1:
                return [*path[path.index(before) :], before][::-1]
            if state[before] == 0:
                found = visit(before)
                if found:
                    return found
        path.pop()
        state[index] = 2
        return []

    for start in range(len(steps)):
        if state[start] == 0:
            found = visit(start)
            if found:
                return found
    return []


# the graph against the models it composes --------------------------------------------------------------------------


def check_models(spec: EnsembleSpec, lookup: SpecLookup) -> None:
    """Check every step against its model: it exists, is not decoupled, its tensors are mapped, and each ensemble
    tensor has the same datatype and a compatible shape wherever it is written and read. Raises ConfigError."""
    name = spec.name
    labels = spec.labels()
    batching = spec.max_batch_size > 0
    # ensemble tensor -> (datatype, full shape, who defines it)
    known: dict[str, tuple[str, tuple[int, ...], str]] = {
        t.name: (t.datatype, _full_shape(t.shape, batching), f"ensemble input '{t.name}'") for t in spec.inputs
    }
    optional_inputs = {t.name for t in spec.inputs if t.optional}
    models: list[ModelSpec] = []
    for index, step in enumerate(spec.steps):
        where = f"ensemble '{name}' step '{labels[index]}'"
        model = lookup(step.model, step.version)
        if model is None:
            which = f"version {step.version} of model '{step.model}'" if step.version else f"model '{step.model}'"
            raise ConfigError(f"{where}: {which} is not bound; bind the models of an ensemble before it")
        if model.config.decoupled:
            raise ConfigError(
                f"{where}: model '{step.model}' is decoupled; ensembles of streaming models are not supported"
            )
        if batching and model.config.max_batch_size < spec.max_batch_size:
            raise ConfigError(
                f"{where}: model '{step.model}' takes batches of at most {model.config.max_batch_size} rows, "
                f"fewer than the ensemble's max_batch_size {spec.max_batch_size}"
            )
        declared_inputs = {t.name: t for t in model.inputs}
        declared_outputs = {t.name: t for t in model.outputs}
        for model_input in step.inputs:
            if model_input not in declared_inputs:
                raise ConfigError(
                    f"{where}: model '{step.model}' has no input '{model_input}' (inputs: {sorted(declared_inputs)})"
                )
        for tensor in model.inputs:
            if not tensor.optional and tensor.name not in step.inputs:
                raise ConfigError(f"{where}: required input '{tensor.name}' of model '{step.model}' is not mapped")
        for model_output, tensor_name in step.outputs.items():
            declared = declared_outputs.get(model_output)
            if declared is None:
                outputs = sorted(declared_outputs)
                raise ConfigError(f"{where}: model '{step.model}' has no output '{model_output}' (outputs: {outputs})")
            model_batching = model.config.max_batch_size > 0
            known[tensor_name] = (
                declared.datatype,
                _full_shape(declared.shape, model_batching),
                f"step '{labels[index]}' output '{model_output}'",
            )
        models.append(model)
    for index, step in enumerate(spec.steps):
        model = models[index]
        model_batching = model.config.max_batch_size > 0
        declared_inputs = {t.name: t for t in model.inputs}
        for model_input, tensor_name in step.inputs.items():
            declared = declared_inputs[model_input]
            where = f"step '{labels[index]}' input '{model_input}'"
            if tensor_name in optional_inputs and not declared.optional:
                raise ConfigError(
                    f"ensemble '{name}': optional ensemble input '{tensor_name}' feeds {where} of model "
                    f"'{step.model}', which is required"
                )
            _check_edge(name, tensor_name, known[tensor_name], declared.datatype, declared.shape, model_batching, where)
    for output in spec.outputs:
        where = f"ensemble output '{output.name}'"
        _check_edge(name, output.name, known[output.name], output.datatype, output.shape, batching, where)


def _check_edge(
    ensemble: str,
    tensor: str,
    source: tuple[str, tuple[int, ...], str],
    datatype: str,
    dims: tuple[int, ...],
    batching: bool,
    reader: str,
) -> None:
    source_type, source_shape, writer = source
    if source_type != datatype:
        raise ConfigError(
            f"ensemble '{ensemble}': tensor '{tensor}' is {source_type} from {writer} but {reader} expects {datatype}"
        )
    shape = _full_shape(dims, batching)
    fits = len(shape) == len(source_shape) and all(
        a == b or -1 in (a, b) for a, b in zip(shape, source_shape, strict=True)
    )
    if not fits:
        raise ConfigError(
            f"ensemble '{ensemble}': tensor '{tensor}' has shape {list(source_shape)} from {writer}, which does not "
            f"fit shape {list(shape)} of {reader} (-1 is any size; a batching model's first dimension is its batch)"
        )


def _full_shape(dims: tuple[int, ...], batching: bool) -> tuple[int, ...]:
    return (-1, *dims) if batching else tuple(dims)


def spec_lookup(specs: Iterable[ModelSpec]) -> SpecLookup:
    """A lookup over known specs: the given version, or the highest version of that name."""
    by_name: dict[str, dict[int, ModelSpec]] = {}
    for spec in specs:
        by_name.setdefault(spec.name, {})[spec.version] = spec

    def lookup(name: str, version: int | None) -> ModelSpec | None:
        versions = by_name.get(name)
        if not versions:
            return None
        return versions.get(version) if version is not None else versions[max(versions)]

    return lookup
