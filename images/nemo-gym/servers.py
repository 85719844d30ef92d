#!/usr/bin/env python3
"""The NeMo Gym servers an image prepares, at build time, and the check at start that a job names no other.

    grpojob-servers prepare SERVER ...     # at build time: SERVER is <server type>/<server name>
    grpojob-servers check [GYM_ARG ...]    # before `gym env start GYM_ARG ...`, in its working directory

`gym env start` runs each server of its config (the files of `config_paths` under `env.yaml` of its working
directory and its command-line overrides) from `<server type>/<server name>/`, found in the working
directory or else in NeMo Gym's install root (site-packages), in the virtual environment
`<uv_venv_dir>/<server type>/<server name>/.venv` when that holds bin/python and bin/activate, and would
otherwise make one and install the server's requirements into it (with uv and the network, which the
image has not). `prepare` makes each SERVER's environment the image's own (/opt/nemo-gym, a link) once
its directory is in the install root and every package its requirements name is installed there; it fails
the build otherwise, saying what is missing. `check` exits 1 with one line naming the first server of the
config that the image did not prepare and how to prepare it: the pod's termination message, which the
GRPOJob's EnvironmentsReady condition quotes. It fails only on what it can read: a config it cannot read is
left to `gym env start` to report.

Standard library and PyYAML (NeMo Gym's own) only; run with the image's Python.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

VENV = Path("/opt/nemo-gym")
SERVERS_DIR = VENV / "servers"
IMAGE = "ghcr.io/grpojob/nemo-gym:0.1.0"
CONFIG_FILE = "env.yaml"
# The packages a server's requirements name that are NeMo Gym itself (its requirements.txt installs
# `-e nemo-gym[dev] @ ../../`, the package the server belongs to).
NEMO_GYM = "nemo-gym"


def install_root() -> Path | None:
    """NeMo Gym's install root (the directory holding `nemo_gym/` and the servers), if it is installed."""
    spec = importlib.util.find_spec("nemo_gym")
    return Path(spec.origin).parent.parent if spec and spec.origin else None


def server_dirs(config: Mapping[str, Any]) -> list[str]:
    """`<server type>/<server name>` of each server instance of a NeMo Gym ``config``, as `gym env start`
    finds them: a top-level mapping whose first value is a mapping whose first value has an `entrypoint`."""
    found = []
    for instance in config.values():
        if not isinstance(instance, Mapping) or not instance:
            continue
        kind, servers = next(iter(instance.items()))
        if not isinstance(servers, Mapping) or not servers:
            continue
        name, server = next(iter(servers.items()))
        if isinstance(server, Mapping) and "entrypoint" in server:
            found.append(f"{kind}/{name}")
    return list(dict.fromkeys(found))


def prepared(server: str, servers_dir: Path = SERVERS_DIR) -> bool:
    """Whether `gym env start +uv_venv_dir=<servers_dir>` finds ``server``'s environment and installs nothing."""
    venv = servers_dir / server / ".venv"
    return (venv / "bin" / "python").exists() and (venv / "bin" / "activate").exists()


def overrides(args: Iterable[str]) -> dict[str, str]:
    """`gym env start`'s command-line overrides (`key=value`, `+key=value`, `++key=value`) by key."""
    pairs = (arg.lstrip("+").split("=", 1) for arg in args if "=" in arg)
    return {key: value for key, value in pairs}


def path_list(value: Any) -> list[str]:
    """A `config_paths` value: a list, or Hydra's `[a,b]` of the command line."""
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        return [p.strip().strip("'\"") for p in value.strip().strip("[]").split(",") if p.strip()]
    return []


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base`` key by key, keeping ``base``'s order (as OmegaConf merges)."""
    merged = dict(base)
    for key, value in over.items():
        old = merged.get(key)
        merged[key] = deep_merge(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    return merged


def read_yaml(path: Path) -> dict[str, Any]:
    import yaml  # NeMo Gym's; imported here so that `prepare` needs nothing but the standard library

    loaded = yaml.safe_load(path.read_text())
    return loaded if isinstance(loaded, dict) else {}


def gym_config(args: list[str], work_dir: Path, root: Path | None) -> dict[str, Any]:
    """The config `gym env start args` would start in ``work_dir``, as far as servers go: its `config_paths`
    (from `env.yaml` and the command line, and those the files name in turn, each looked up in the working
    directory, then the install root ``root``), with `env.yaml` over them."""
    env_file = work_dir / CONFIG_FILE
    env = read_yaml(env_file) if env_file.exists() else {}
    paths = path_list(overrides(args).get("config_paths", env.get("config_paths")))
    merged: dict[str, Any] = {}
    for relative in paths:  # grows while files name more
        path = Path(relative)
        if not path.is_absolute():
            local = work_dir / path
            path = local if local.exists() or root is None else root / path
        config = read_yaml(path)
        paths.extend(p for p in path_list(config.get("config_paths")) if p not in paths)
        merged = deep_merge(merged, config)
    return deep_merge(merged, env)


def unprepared_line(server: str, root: Path | None) -> str:
    """The one line `check` exits with: which server, and the two ways to prepare it."""
    copy = f"; a server of your own: COPY its directory to {root / server} first" if root else ""
    return (
        f"NeMo Gym server {server} is not prepared in this image: rebuild it with "
        f'--build-arg SERVERS="... {server}", or build FROM {IMAGE} with RUN grpojob-servers prepare {server}'
        f"{copy} (grpojob docs: guides/nemo-gym.md)"
    )


def check(args: list[str], work_dir: Path, root: Path | None) -> str:
    """The line naming the first server of the config that the image did not prepare, or "" when every one
    is (or no `uv_venv_dir` is given, where `gym env start` installs at start, or the config is unreadable)."""
    venv_dir = overrides(args).get("uv_venv_dir")
    if not venv_dir:
        return ""
    try:
        config = gym_config(args, work_dir, root)
    except Exception:  # `gym env start` reports a config it cannot read better than we can
        return ""
    missing = [server for server in server_dirs(config) if not prepared(server, Path(venv_dir))]
    return unprepared_line(missing[0], root) if missing else ""


def requirement_names(server_dir: Path) -> list[str]:
    """The packages a server's requirements.txt or pyproject.toml names, but NeMo Gym itself."""
    names: list[str] = []
    requirements, pyproject = server_dir / "requirements.txt", server_dir / "pyproject.toml"
    if requirements.exists():
        names = [line.split("#")[0].strip() for line in requirements.read_text().splitlines()]
        names = [line for line in names if line and not line.startswith("-")]
    elif pyproject.exists():
        names = tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", [])
    found = (re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) for name in names)
    packages = [match.group(0) for match in found if match]
    return [p for p in packages if canonical(p) != NEMO_GYM]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(package: str) -> bool:
    """Whether ``package`` is installed in the Python this runs with."""
    try:
        importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def prepare(server: str, root: Path, servers_dir: Path, venv: Path, is_installed: Callable[[str], bool]) -> str:
    """Make ``server``'s environment under ``servers_dir`` the image's ``venv``; return why it cannot be ("" once
    it is): its directory is not in the install root ``root``, or a package its requirements name is missing."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", server):
        return f"{server}: not <server type>/<server name> (such as resources_servers/mcqa)"
    server_dir = root / server
    if not server_dir.is_dir():
        return f"{server}: no directory {server_dir} (a server of your own: COPY its directory there first)"
    missing = [p for p in requirement_names(server_dir) if not is_installed(p)]
    if missing:
        return (
            f"{server}: its requirements are not installed in {venv}: {' '.join(missing)} "
            f"(install them there first, pinned)"
        )
    link = servers_dir / server / ".venv"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(venv)
    return ""


def main(argv: list[str]) -> int:
    """The command line (see the module's docstring)."""
    if not argv or argv[0] not in ("prepare", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    root = install_root()
    if command == "check":
        line = check(args, Path.cwd(), root)
        if line:
            print(line, file=sys.stderr)
        return 1 if line else 0
    if root is None:
        print("grpojob-servers prepare: NeMo Gym is not installed in this Python", file=sys.stderr)
        return 1
    problems = [p for p in (prepare(s, root, SERVERS_DIR, VENV, installed) for s in args) if p]
    for problem in problems:
        print(f"grpojob-servers prepare: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
