"""Dockerfile, .dockerignore and requirements/*.lock, checked statically (there is no Docker
engine here): pinned slim bases, a builder stage whose venv is all the final stage takes,
hash-pinned runtime dependencies that cover pyproject.toml and nothing of the dev extra, a
non-root user, a health check on /healthz (run here against a stub server), every path
thinkgate writes under the VOLUME, and lock files that fail this suite when pyproject.toml's
dependencies change without ``make lock``."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import posixpath
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from sqlalchemy.engine import make_url

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
RUNTIME_LOCK = ROOT / "requirements" / "runtime.lock"
BUILD_LOCK = ROOT / "requirements" / "build.lock"
# Each lock and the pyproject.toml list it is compiled from (see the Makefile's `lock` target).
LOCK_INPUTS = {RUNTIME_LOCK: ("project", "dependencies"), BUILD_LOCK: ("build-system", "requires")}
RELOCK = "pyproject.toml changed since the lock was made: run `make lock` and commit the result"

# Never in the runtime lock, whatever pyproject.toml's dev extra says.
DEV_TOOLS = {
    "pytest",
    "ruff",
    "mypy",
    "hypothesis",
    "coverage",
    "black",
    "flake8",
    "pip-tools",
    "uv",
    "pip",
    "setuptools",
    "wheel",
}
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|clang|make|cmake|build-essential|build-base|musl-dev|python3?-dev"
    r"|[\w.+-]+-dev|git|rustc|cargo)\b"
)


# -- the Dockerfile, by stage -------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    image: str  # what FROM names
    name: str | None  # its AS name
    instructions: tuple[tuple[str, str], ...]  # (INSTRUCTION, value), comments left out

    def values(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]

    def last(self, instruction: str) -> str:
        values = self.values(instruction)
        assert values, f"the stage FROM {self.image} has no {instruction}"
        return values[-1]


@cache
def stages() -> tuple[Stage, ...]:
    parser = DockerfileParser(path=str(DOCKERFILE), env_replace=False)
    found: list[Stage] = []
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "FROM":
            words = [word for word in value.split() if not word.startswith("--")]
            alias = words[2] if len(words) == 3 and words[1].lower() == "as" else None
            found.append(Stage(words[0], alias, ()))
        elif instruction != "COMMENT":
            assert found, f"{instruction} before the first FROM"
            last = found[-1]
            found[-1] = Stage(last.image, last.name, (*last.instructions, (instruction, value)))
    return tuple(found)


def final() -> Stage:
    return stages()[-1]


@cache
def final_env() -> dict[str, str]:
    envs: dict[str, str] = DockerfileParser(path=str(DOCKERFILE), env_replace=False).envs
    return envs


def split_image(reference: str) -> tuple[str, str | None, str | None]:
    """``name[:tag][@digest]`` → (name, tag, digest); a registry port is not a tag."""
    name, _, digest = reference.partition("@")
    repository, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:
        return name, None, digest or None
    return repository, tag, digest or None


def shell_commands(stage: Stage) -> list[str]:
    """The stage's RUN lines cut into simple commands (at ``&&``, ``||``, ``;`` and ``|``),
    whitespace normalised."""
    pieces = [p for run in stage.values("RUN") for p in re.split(r"&&|\|\||;|\|", run)]
    return [" ".join(piece.split()) for piece in pieces if piece.strip()]


PIP_INSTALL = re.compile(r"\bpip3?\s+install\b")


def pip_installs(stage: Stage) -> list[str]:
    return [command for command in shell_commands(stage) if PIP_INSTALL.search(command)]


def exec_form(value: str) -> list[str]:
    loaded = json.loads(value)
    assert isinstance(loaded, list), f"not the exec (JSON) form: {value}"
    return [str(word) for word in loaded]


# -- lock files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    requirement: Requirement
    hashes: tuple[str, ...]

    @property
    def name(self) -> str:
        return canonicalize_name(self.requirement.name)

    @property
    def version(self) -> str:
        (spec,) = self.requirement.specifier
        assert spec.operator == "==", f"{self.requirement} is not pinned with =="
        return spec.version


def lock_header(path: Path) -> dict[str, str]:
    """The ``# key: value`` lines the Makefile writes at the top of a lock."""
    found = re.findall(r"^# (input-sha256|resolved-for): (.+)$", path.read_text(), re.M)
    return dict(found)


def logical_lines(path: Path) -> Iterator[str]:
    """Requirement lines with their continuations joined; comment lines dropped."""
    current: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        current.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            yield " ".join(current)
            current = []


@cache
def read_lock(path: Path) -> dict[str, Pin]:
    pins = {}
    for line in logical_lines(path):
        spec, *options = line.split(" --")
        hashes = tuple(o.removeprefix("hash=") for o in options if o.startswith("hash="))
        pin = Pin(Requirement(spec), hashes)
        pins[pin.name] = pin
    assert pins, f"{path} holds no requirement"
    return pins


@cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def input_sha256(items: list[str]) -> str:
    """As the Makefile's LOCK_INPUT computes it: sha256 of the JSON of the sorted list."""
    return hashlib.sha256(json.dumps(sorted(items)).encode()).hexdigest()


def image_python() -> str:
    """The Python release the lock was resolved for (``# resolved-for: cpython 3.11.15 linux``)."""
    match = re.fullmatch(
        r"cpython (\d+\.\d+\.\d+) linux", lock_header(RUNTIME_LOCK)["resolved-for"]
    )
    assert match, lock_header(RUNTIME_LOCK)
    return match[1]


def image_markers(extra: str = "") -> dict[str, str]:
    """PEP 508 marker values inside the image (CPython on Linux)."""
    version = image_python()
    return {
        "implementation_name": "cpython",
        "implementation_version": version,
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_full_version": version,
        "python_version": version.rsplit(".", 1)[0],
        "sys_platform": "linux",
        "extra": extra,
    }


def applies(requirement: Requirement, extra: str = "") -> bool:
    return requirement.marker is None or requirement.marker.evaluate(image_markers(extra))


def runtime_requirements() -> list[Requirement]:
    return [Requirement(line) for line in pyproject()["project"]["dependencies"]]


# -- base images and stages ---------------------------------------------------------------


def base_images() -> list[str]:
    """What each FROM pulls: every FROM that does not name an earlier stage."""
    earlier: set[str] = set()
    images = []
    for stage in stages():
        if stage.image not in earlier:
            images.append(stage.image)
        if stage.name:
            earlier.add(stage.name)
    return images


def test_every_base_image_is_pinned() -> None:
    for image in base_images():
        assert "$" not in image, f"FROM {image}: an ARG can hide an unpinned image"
        _, tag, digest = split_image(image)
        assert tag or digest, f"FROM {image} has neither tag nor digest"
        assert tag != "latest", f"FROM {image}: latest is not a version"


def test_the_bases_are_slim_python_at_the_release_the_lock_was_resolved_for() -> None:
    for image in base_images():
        name, tag, _ = split_image(image)
        assert name in {"python", "docker.io/library/python"}, image
        assert tag is not None
        match = re.fullmatch(r"(\d+\.\d+\.\d+)-slim(-[a-z]+)?", tag)
        assert match, f"FROM {image}: want an exact patch release of a -slim image"
        assert match[1] == image_python(), (
            f"FROM {image} but requirements/runtime.lock was resolved for "
            f"{image_python()}: set LOCK_PYTHON in the Makefile and run `make lock`"
        )


def test_a_builder_stage_makes_the_venv_and_the_final_stage_takes_only_that() -> None:
    assert len(stages()) >= 2
    builders = {stage.name for stage in stages()[:-1]}
    copies = final().values("COPY") + final().values("ADD")
    assert copies, "the final stage copies nothing from a builder stage"
    for copy in copies:
        words = copy.split()
        sources = [word.removeprefix("--from=") for word in words if word.startswith("--from=")]
        assert sources, f"COPY {copy}: build-context files belong in the wheel"
        assert sources[0] in builders, f"COPY {copy}"
        assert [word for word in words if not word.startswith("--")] == ["/opt/venv"] * 2
    assert final_env()["PATH"].startswith("/opt/venv/bin:")


def test_the_final_stage_installs_no_build_tools_and_nothing_with_pip() -> None:
    for command in shell_commands(final()):
        words = set(command.split())
        if {"install", "add"} & words and {"apt-get", "apt", "apk"} & words:
            assert not BUILD_TOOLS.search(command), f"build tool in the final stage: {command}"
    assert not pip_installs(final()), "the final stage installs with pip: use the builder"


def test_no_add_from_a_url() -> None:
    for stage in stages():
        for value in stage.values("ADD"):
            assert not re.search(r"(https?|git|ftp)://|git@", value), f"ADD {value}"


# -- the user, the entrypoint, the health check -------------------------------------------


def test_the_final_stage_runs_as_a_non_root_numeric_user() -> None:
    user, _, group = final().last("USER").partition(":")
    assert user.isdigit(), f"USER {user}: numeric, so that Kubernetes runAsNonRoot can check it"
    assert int(user) != 0
    assert not group or (group.isdigit() and int(group) != 0)


def test_the_entrypoint_is_thinkgate_serve_on_all_interfaces_on_the_exposed_port() -> None:
    assert exec_form(final().last("ENTRYPOINT")) == ["thinkgate", "serve"]
    assert final_env()["THINKGATE_HOST"] == "0.0.0.0"
    port = final_env().get("THINKGATE_PORT", str(Settings.model_fields["port"].default))
    assert final().last("EXPOSE").split() == [port]


def test_python_writes_no_bytecode_and_pip_keeps_no_cache() -> None:
    assert final_env().get("PYTHONDONTWRITEBYTECODE") == "1"
    for stage in stages():
        cache_off = any("PIP_NO_CACHE_DIR=1" in env for env in stage.values("ENV"))
        for command in pip_installs(stage):
            assert cache_off or "--no-cache-dir" in command, f"pip keeps its cache: {command}"


def healthcheck_command() -> list[str]:
    options, _, command = final().last("HEALTHCHECK").partition("CMD")
    assert command, "HEALTHCHECK NONE, or no CMD"
    assert "--timeout=" in options
    return exec_form(command.strip())


def test_the_healthcheck_asks_healthz_with_python_not_curl() -> None:
    command = healthcheck_command()
    assert command[:2] == ["python", "-c"]
    assert "/healthz" in command[2]
    assert not re.search(r"\b(curl|wget)\b", " ".join(command)), "the slim base has neither"


@contextmanager
def stub_gateway(status: int, seen: list[str]) -> Iterator[int]:
    """An HTTP server on a free port answering every GET with ``status``; yields the port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_the_healthcheck_passes_only_on_a_2xx_from_healthz(status: int, healthy: bool) -> None:
    """The HEALTHCHECK's own command, run here (with this interpreter) against a stub."""
    seen: list[str] = []
    command = [sys.executable, *healthcheck_command()[1:]]
    with stub_gateway(status, seen) as port:
        env = {"PATH": os.environ.get("PATH", ""), "THINKGATE_PORT": str(port)}
        result = subprocess.run(command, env=env, capture_output=True, timeout=30, check=False)
    assert (result.returncode == 0) is healthy, result.stderr.decode()
    assert seen == ["/healthz"]


def test_the_healthcheck_fails_when_nothing_listens() -> None:
    with stub_gateway(200, []) as port:
        pass  # the port is free again, and nothing listens on it
    command = [sys.executable, *healthcheck_command()[1:]]
    env = {"PATH": os.environ.get("PATH", ""), "THINKGATE_PORT": str(port)}
    result = subprocess.run(command, env=env, capture_output=True, timeout=30, check=False)
    assert result.returncode != 0


# -- where thinkgate writes ---------------------------------------------------------------


def volumes() -> list[PurePosixPath]:
    paths: list[PurePosixPath] = []
    for value in final().values("VOLUME"):
        words = json.loads(value) if value.startswith("[") else value.split()
        paths.extend(PurePosixPath(word) for word in words)
    assert paths, "the final stage declares no VOLUME"
    return paths


def in_image(path: str) -> PurePosixPath:
    """``path`` as the process sees it: relative paths start at the final WORKDIR."""
    return PurePosixPath(posixpath.normpath(PurePosixPath(final().last("WORKDIR")) / path))


def written_paths() -> dict[str, PurePosixPath]:
    """Every file thinkgate writes with the image's settings: the Path settings, the SQLite
    database, the demo's key file."""
    env, paths = final_env(), {}
    for name, field in Settings.model_fields.items():
        if field.annotation in (Path, Path | None):
            paths[name] = in_image(env.get(f"THINKGATE_{name.upper()}", str(field.default)))
    url = make_url(env.get("THINKGATE_DATABASE_URL", Settings.model_fields["database_url"].default))
    if url.get_backend_name() == "sqlite" and url.database:
        paths["database_url"] = in_image(url.database)
    home = env.get("THINKGATE_HOME", str(Settings.model_fields["home"].default))
    paths["demo keys"] = in_image(str(Path(home) / "demo-keys.json"))
    return paths


def test_the_image_sets_the_database_key_and_spool_paths() -> None:
    for name in ("database_url", "ledger_key_file", "signing_key_file", "audit_spool_file"):
        assert f"THINKGATE_{name.upper()}" in final_env(), f"THINKGATE_{name.upper()} unset"


def test_every_path_thinkgate_writes_is_under_a_volume() -> None:
    paths = written_paths()
    assert {"ledger_key_file", "signing_key_file", "audit_spool_file", "database_url"} <= set(paths)
    for name, path in paths.items():
        assert path.is_absolute()
        assert any(path.is_relative_to(volume) for volume in volumes()), f"{name}: {path}"


def test_every_thinkgate_variable_in_the_image_is_a_setting() -> None:
    names = {f"THINKGATE_{name.upper()}" for name in Settings.model_fields}
    for variable in final_env():
        if variable.startswith("THINKGATE_"):
            assert variable in names, f"{variable} is no setting of gateway/settings.py"


# -- the lock files -----------------------------------------------------------------------


def install_commands() -> list[str]:
    return [command for stage in stages() for command in pip_installs(stage)]


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, BUILD_LOCK], ids=lambda path: path.name)
def test_each_lock_is_copied_in_and_installed_with_require_hashes(lock: Path) -> None:
    relative = lock.relative_to(ROOT).as_posix()
    assert any(relative in value for stage in stages() for value in stage.values("COPY"))
    using = [command for command in install_commands() if f"-r {relative}" in command]
    assert using, f"no pip install -r {relative}"
    for command in using:
        assert "--require-hashes" in command
        assert "--no-deps" in command  # the lock is the whole closure: pip resolves nothing


def test_every_pip_install_takes_no_dependencies_from_the_index() -> None:
    for command in install_commands():
        assert "--no-deps" in command, command
        assert "--require-hashes" in command or "--no-index" in command, command


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, BUILD_LOCK], ids=lambda path: path.name)
def test_every_locked_package_is_pinned_and_hashed(lock: Path) -> None:
    for name, pin in read_lock(lock).items():
        assert pin.version, name
        assert pin.hashes, f"{name} has no hash"
        for digest in pin.hashes:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{name}: {digest}"


def test_the_lock_covers_every_runtime_dependency_at_an_allowed_version() -> None:
    pins = read_lock(RUNTIME_LOCK)
    for requirement in runtime_requirements():
        if not applies(requirement):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is missing from the lock: run `make lock`"
        assert requirement.specifier.contains(pins[name].version, prereleases=True), (
            f"locked {name}=={pins[name].version} does not satisfy {requirement}"
        )


def test_the_lock_is_closed_under_dependencies() -> None:
    """pip installs with --no-deps, so a dependency missing from the lock would be missing from
    the image. Walked from pyproject.toml through the metadata of the packages installed here,
    for those installed at their locked version (the others cannot be read offline)."""
    pins = read_lock(RUNTIME_LOCK)
    todo = [r for r in runtime_requirements() if applies(r)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is needed but not in the lock: run `make lock`"
        key = (name, frozenset(requirement.extras))
        if key not in seen:
            seen.add(key)
            todo.extend(dependencies(requirement, pins[name]))


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def dependencies(requirement: Requirement, pin: Pin) -> list[Requirement]:
    """What ``requirement`` (with its extras) needs inside the image, per the metadata of the
    installed distribution when it is the locked version; nothing known otherwise."""
    if installed_version(requirement.name) != pin.version:
        return []
    needed = [Requirement(line) for line in importlib.metadata.requires(requirement.name) or []]
    extras = ("", *requirement.extras)
    return [n for n in needed if any(applies(n, extra) for extra in extras)]


def test_the_lock_holds_nothing_of_the_dev_extra() -> None:
    runtime = {canonicalize_name(r.name) for r in runtime_requirements()}
    dev = {
        canonicalize_name(Requirement(line).name)
        for line in pyproject()["project"]["optional-dependencies"]["dev"]
    }
    leaked = ((dev - runtime) | DEV_TOOLS) & set(read_lock(RUNTIME_LOCK))
    assert not leaked, f"dev-only packages in the runtime lock: {sorted(leaked)}"


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, BUILD_LOCK], ids=lambda path: path.name)
def test_each_lock_was_made_from_the_current_pyproject(lock: Path) -> None:
    table, key = LOCK_INPUTS[lock]
    recorded = lock_header(lock).get("input-sha256")
    assert recorded, f"{lock.name} has no '# input-sha256:' header: run `make lock`"
    assert recorded == input_sha256(pyproject()[table][key]), f"{lock.name}: {RELOCK}"
    assert "make lock" in lock.read_text().splitlines()[0], "the header says how to regenerate"


# -- the build context --------------------------------------------------------------------


class DockerIgnore:
    """.dockerignore as Docker reads it (moby/patternmatcher): each pattern is cleaned and
    matched against the path and each of its parent directories; ``*`` and ``?`` stay within
    one path segment, ``**`` spans any number; ``!`` re-includes; the last match wins."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[re.Pattern[str], bool]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
            self.rules.append((re.compile(_glob_regex(pattern)), negated))

    def ignores(self, path: str) -> bool:
        parts = PurePosixPath(path).parts
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        ignored = False
        for regex, negated in self.rules:
            if any(regex.fullmatch(candidate) for candidate in candidates):
                ignored = not negated
        return ignored


def _glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if char == "[":
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end + 1
            continue
        out.append({"*": "[^/]*", "?": "[^/]"}.get(char, re.escape(char)))
        i += 1
    return "".join(out)


@cache
def dockerignore() -> DockerIgnore:
    return DockerIgnore(DOCKERIGNORE.read_text())


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        ".venv-vllm/bin/python",
        "var/thinkgate.db",
        "var/ledger-keys.json",
        "var/signing-key.pem",
        ".pytest_cache/v/cache/nodeids",
        ".mypy_cache/3.11/cache.db",
        ".ruff_cache/CACHEDIR.TAG",
        ".hypothesis/examples/x",
        "gateway/__pycache__/cli.cpython-311.pyc",
        "thinkgate.egg-info/PKG-INFO",
        "tests/conftest.py",
        ".env",
    ],
)
def test_dockerignore_keeps_local_state_and_caches_out(path: str) -> None:
    assert dockerignore().ignores(path)


def context_sources() -> list[str]:
    """Every build-context path a COPY or ADD names (not --from another stage)."""
    sources: list[str] = []
    for stage in stages():
        for value in stage.values("COPY") + stage.values("ADD"):
            words = value.split()
            if any(word.startswith("--from=") for word in words):
                continue
            sources.extend(word for word in words[:-1] if not word.startswith("--"))
    return sources


def test_everything_the_build_copies_exists_and_reaches_the_context() -> None:
    """The files a COPY names, and every module under the directories it names."""
    for source in context_sources():
        path = ROOT / source
        assert path.exists(), f"COPY {source}: no such file"
        files = [path] if path.is_file() else list(path.rglob("*.py"))
        for file in files:
            relative = file.relative_to(ROOT).as_posix()
            assert not dockerignore().ignores(relative), f"{relative} is .dockerignored"


def test_the_build_copies_every_package_and_file_the_wheel_needs() -> None:
    setuptools = pyproject()["tool"]["setuptools"]["packages"]["find"]
    patterns = [re.compile(_glob_regex(p)) for p in setuptools["include"]]
    packages = {
        path.name
        for path in ROOT.iterdir()
        if (path / "__init__.py").is_file() and any(p.fullmatch(path.name) for p in patterns)
    }
    assert packages
    copied = {PurePosixPath(source).parts[0] for source in context_sources()}
    assert packages <= copied, f"not copied into the builder: {sorted(packages - copied)}"
    assert {"pyproject.toml", pyproject()["project"]["readme"]} <= copied
