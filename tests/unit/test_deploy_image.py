"""deploy/Dockerfile and .dockerignore, read as text: what the image installs, who it runs as, what it runs.

Building the image needs a container engine: tests/integration/test_deploy.py builds it where ``docker info``
answers, and builds the wheel the image installs, from the context .dockerignore admits, everywhere.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path

import yaml

from pyserve import ServeConfig
from pyserve.cli import _parser

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "deploy" / "Dockerfile"
VALUES = REPO_ROOT / "deploy" / "helm" / "pyserve" / "values.yaml"

Instruction = tuple[str, str]  # (INSTRUCTION, its arguments as written, continuation lines joined)


def instructions(text: str) -> list[Instruction]:
    """A Dockerfile's instructions; comments dropped, backslash continuations joined."""
    result: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not pending):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        result.append((keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, f"a continued instruction never ends: {pending!r}"
    return result


def final_stage() -> list[Instruction]:
    """The instructions of the stage that becomes the image."""
    steps = instructions(DOCKERFILE.read_text())
    last_from = max(index for index, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def exec_form(arguments: str) -> list[str]:
    """A JSON array (exec form) instruction's arguments; shell form would put `sh -c` in front of pyserve."""
    value = json.loads(arguments)
    assert isinstance(value, list) and all(isinstance(item, str) for item in value), arguments
    return value


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps ``path`` (relative, with /) out of the build context: the last matching pattern
    decides, ``!`` admits, and a pattern that matches a folder matches what lies under it. ``**/`` also matches
    no folder. Enough for the patterns this repository's .dockerignore uses; a test below pins them."""
    excluded = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: end + 1]) for end in range(len(parts))]
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!")
        globs = [glob, glob.removeprefix("**/")] if glob.startswith("**/") else [glob]
        if any(fnmatch.fnmatchcase(prefix, g) for prefix in prefixes for g in globs):
            excluded = not negated
    return excluded


def dockerignore_patterns() -> list[str]:
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


# the base, the user, the ports -----------------------------------------------------------------------------------


def test_every_stage_starts_from_a_slim_python() -> None:
    bases = [arguments.split()[0] for keyword, arguments in instructions(DOCKERFILE.read_text()) if keyword == "FROM"]
    assert len(bases) == 2, bases
    assert all(re.fullmatch(r"python:\$\{PYTHON_VERSION\}-slim", base) for base in bases), bases


def test_the_image_runs_as_the_charts_non_root_user() -> None:
    users = [arguments for keyword, arguments in final_stage() if keyword == "USER"]
    assert len(users) == 1, users
    uid, _, gid = users[0].partition(":")
    # Numeric, so that Kubernetes' runAsNonRoot can tell it is not root without reading /etc/passwd.
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    pod = yaml.safe_load(VALUES.read_text())["podSecurityContext"]
    assert (int(uid), int(gid)) == (pod["runAsUser"], pod["runAsGroup"])
    # Nothing after USER runs as root again.
    keywords = [keyword for keyword, _ in final_stage()]
    assert "RUN" not in keywords[keywords.index("USER") :]


def test_the_image_exposes_pyserves_three_ports() -> None:
    [exposed] = [arguments.split() for keyword, arguments in final_stage() if keyword == "EXPOSE"]
    defaults = ServeConfig()
    assert [int(port) for port in exposed] == [defaults.http_port, defaults.grpc_port, defaults.metrics_port]


# what it runs -----------------------------------------------------------------------------------------------------


def test_the_entry_point_is_pyserve_serve_on_every_interface() -> None:
    [entrypoint] = [arguments for keyword, arguments in final_stage() if keyword == "ENTRYPOINT"]
    [cmd] = [arguments for keyword, arguments in final_stage() if keyword == "CMD"]
    assert exec_form(entrypoint) == ["pyserve"]
    command = exec_form(cmd)
    args = _parser().parse_args(command)  # fails the test on a flag pyserve does not have
    assert args.command == "serve" and args.host == "0.0.0.0"
    assert args.model_repository == yaml.safe_load(VALUES.read_text())["modelRepository"]["mountPath"]


def test_the_environment_binds_every_interface_when_the_command_is_replaced() -> None:
    env = " ".join(arguments for keyword, arguments in final_stage() if keyword == "ENV")
    settings = dict(item.split("=", 1) for item in shlex.split(env))
    assert settings["PYSERVE_HOST"] == "0.0.0.0"
    assert "host" in {field for field in ServeConfig.__dataclass_fields__}, "PYSERVE_HOST must name a field"
    assert settings["PATH"].startswith("/opt/pyserve/bin:")


def test_pyserve_is_installed_from_the_checkout_never_from_pypi() -> None:
    installs = [
        arguments
        for keyword, arguments in instructions(DOCKERFILE.read_text())
        if keyword == "RUN" and re.search(r"\bpip install\b", arguments)
    ]
    assert len(installs) == 1, installs
    words = shlex.split(installs[0].partition("pip install")[2])
    targets = [word for word in words if not word.startswith("-")]
    # "." with the optional extras, e.g. .[gpu,onnx-gpu]; the PyPI name "pyserve" is an unrelated package.
    assert targets == [".${PYSERVE_EXTRAS:+[${PYSERVE_EXTRAS}]}"], targets
    assert not any(re.match(r"pyserve\b", word) for word in words)


# the build context ------------------------------------------------------------------------------------------------


def copied_sources() -> list[str]:
    """Every path the build stage COPYs from the context (not --from another stage)."""
    sources = []
    for keyword, arguments in instructions(DOCKERFILE.read_text()):
        if keyword == "COPY" and "--from=" not in arguments:
            sources += arguments.split()[:-1]
    return sources


def test_the_build_copies_what_pip_install_reads() -> None:
    sources = copied_sources()
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert "pyproject.toml" in sources
    readme = re.search(r'^readme = "([^"]+)"$', pyproject, re.MULTILINE)
    assert readme is not None and readme.group(1) in sources, "setuptools reads the readme while it builds"
    assert 'include = ["pyserve*"]' in pyproject, "the packages the build finds: all under pyserve/"
    assert "pyserve" in sources
    assert all((REPO_ROOT / source).exists() for source in sources), sources


def test_dockerignore_admits_the_copied_sources_and_nothing_else() -> None:
    patterns = dockerignore_patterns()
    assert patterns[0] == "*", "an allowlist: everything out, then what the build needs"
    for source in copied_sources():
        assert not dockerignore_excludes(source, patterns), source
    assert not dockerignore_excludes("pyserve/frontends/protocol/grpc_service.proto", patterns)
    for path in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "benchmarks/README.md", "deploy/Dockerfile"):
        assert dockerignore_excludes(path, patterns), path
    for path in ("pyserve/__pycache__/cli.cpython-311.pyc", "pyserve/core/__pycache__/api.cpython-311.pyc"):
        assert dockerignore_excludes(path, patterns), path


def test_the_dockerignore_matcher_follows_docker() -> None:
    # The semantics the matcher above relies on, as Docker documents them.
    assert dockerignore_excludes("a/b.txt", ["*"])
    assert not dockerignore_excludes("a/b.txt", ["*", "!a"])
    assert dockerignore_excludes("a/b.txt", ["*", "!a", "a/b.txt"])
    assert dockerignore_excludes("__pycache__/x.pyc", ["**/__pycache__"])
    assert dockerignore_excludes("a/b/__pycache__/x.pyc", ["**/__pycache__"])
