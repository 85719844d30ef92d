"""Build the test cluster's programs from pinned Go modules, once, into a cache outside the repo.

    python -m grpojob_testing.build            # build whatever is not cached yet
    python -m grpojob_testing.build check      # go.mod files agree with versions.toml
    python -m grpojob_testing.build pin        # rewrite go.mod/go.sum from versions.toml

Every download is verified by the wrapper module's committed go.sum (the go command runs with
``-mod=readonly``). A finished build is marked by a ``.complete`` file, so an interrupted build is
redone rather than trusted. Builds of one component take turns (a lock file beside its directory): two
runs at once (`make cluster-up` while `make test` starts) would otherwise write one staging directory.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

TESTING_DIR = Path(__file__).resolve().parent.parent
VERSIONS_FILE = TESTING_DIR / "versions.toml"
WRAPPERS_DIR = TESTING_DIR / "go"

KUBERNETES_STAGING_MODULES = (
    "api",
    "apiextensions-apiserver",
    "apimachinery",
    "apiserver",
    "cli-runtime",
    "client-go",
    "cloud-provider",
    "cluster-bootstrap",
    "code-generator",
    "component-base",
    "component-helpers",
    "controller-manager",
    "cri-api",
    "cri-client",
    "csi-translation-lib",
    "dynamic-resource-allocation",
    "endpointslice",
    "externaljwt",
    "kms",
    "kube-aggregator",
    "kube-controller-manager",
    "kube-proxy",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "metrics",
    "mount-utils",
    "pod-security-admission",
    "sample-apiserver",
    "sample-cli-plugin",
    "sample-controller",
)


def cache_root() -> Path:
    """Where Go modules, Go's build cache and built programs live (``GRPOJOB_CACHE`` overrides)."""
    return Path(os.environ.get("GRPOJOB_CACHE", Path.home() / ".cache" / "grpojob"))


@dataclass(frozen=True)
class Component:
    """One pinned program (or set of programs) built from one wrapper module."""

    name: str
    module: str
    version: str
    tools: tuple[str, ...]
    staging_version: str | None = None
    crds: str | None = None

    @property
    def wrapper_dir(self) -> Path:
        return WRAPPERS_DIR / self.name

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for file in ("go.mod", "go.sum", "main.go"):
            path = self.wrapper_dir / file
            if path.exists():
                digest.update(path.read_bytes())
        return digest.hexdigest()[:12]

    @property
    def bin_dir(self) -> Path:
        return cache_root() / "bin" / f"{self.name}-{self.version}-{self.fingerprint()}"

    def ldflags(self) -> str:
        flags = ["-s", "-w"]
        if self.name == "kubernetes":
            major, minor = self.version.lstrip("v").split(".")[:2]
            for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
                flags += [
                    f"-X {pkg}.gitVersion={self.version}",
                    f"-X {pkg}.gitMajor={major}",
                    f"-X {pkg}.gitMinor={minor}",
                    f"-X {pkg}.gitTreeState=clean",
                    f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
                ]
        return " ".join(flags)


def load_components(path: Path = VERSIONS_FILE) -> dict[str, Component]:
    """Read versions.toml into Components, keyed by name."""
    data = tomllib.loads(path.read_text())
    return {
        name: Component(
            name=name,
            module=entry["module"],
            version=entry["version"],
            tools=tuple(entry["tools"]),
            staging_version=entry.get("staging_version"),
            crds=entry.get("crds"),
        )
        for name, entry in data.items()
    }


def go_env() -> dict[str, str]:
    """The environment every go command runs with: caches outside the repo, static binaries."""
    root = cache_root()
    return {
        **os.environ,
        "GOMODCACHE": str(root / "go" / "mod"),
        "GOCACHE": str(root / "go" / "build"),
        "CGO_ENABLED": "0",
        "GOFLAGS": "-mod=readonly",
        "GOTOOLCHAIN": "local",
    }


def required_version(go_mod: str, module: str) -> str | None:
    """The version go.mod requires of ``module`` (single-line or block form), or None."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.MULTILINE)
    return match.group(1) if match else None


def mismatches(component: Component) -> list[str]:
    """What in the wrapper's go.mod disagrees with versions.toml (empty when it agrees)."""
    go_mod_path = component.wrapper_dir / "go.mod"
    if not go_mod_path.exists():
        return [f"{go_mod_path} is missing"]
    go_mod = go_mod_path.read_text()
    problems = []
    found = required_version(go_mod, component.module)
    if found != component.version:
        problems.append(f"{go_mod_path}: requires {component.module} {found}, versions.toml says {component.version}")
    if component.staging_version:
        for name in KUBERNETES_STAGING_MODULES:
            pattern = rf"k8s.io/{re.escape(name)} => k8s.io/{re.escape(name)} {re.escape(component.staging_version)}\n"
            if not re.search(pattern, go_mod):
                problems.append(f"{go_mod_path}: k8s.io/{name} is not replaced by {component.staging_version}")
    return problems


def render_go_mod(component: Component) -> str:
    """The wrapper go.mod for a component, before `go mod tidy` adds the indirect requirements."""
    lines = [
        f"// Wrapper module: builds {component.name} from {component.module} {component.version}.",
        "// Generated by `python -m grpojob_testing.build pin` from testing/versions.toml.",
        f"module grpojob.dev/testing/{component.name}",
        "",
        "go 1.24.0" if component.staging_version else "go 1.26.0",
        "",
    ]
    tools = [t for t in component.tools if t != "."]
    if tools:
        lines += ["tool (", *(f"\t{t}" for t in tools), ")", ""]
    lines += [f"require {component.module} {component.version}", ""]
    if component.staging_version:
        lines += ["replace ("]
        lines += [
            f"\tk8s.io/{name} => k8s.io/{name} {component.staging_version}" for name in KUBERNETES_STAGING_MODULES
        ]
        lines += [")", ""]
    return "\n".join(lines)


def pin(component: Component) -> None:
    """Rewrite the wrapper's go.mod from versions.toml and let `go mod tidy` record go.sum."""
    component.wrapper_dir.mkdir(parents=True, exist_ok=True)
    (component.wrapper_dir / "go.mod").write_text(render_go_mod(component))
    env = {**go_env(), "GOFLAGS": "-mod=mod"}
    subprocess.run(["go", "mod", "tidy"], cwd=component.wrapper_dir, env=env, check=True)


def build(component: Component, log=sys.stderr) -> Path:
    """Build a component unless its programs are cached; return the directory holding them. A build that
    another process is running is waited for, not repeated."""
    target = component.bin_dir
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        return _build(component, target, log)


def _build(component: Component, target: Path, log) -> Path:
    problems = mismatches(component)
    if problems:
        raise RuntimeError("\n".join(problems))
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.monotonic()
    print(f"building {component.name} {component.version} into {target}", file=log, flush=True)
    subprocess.run(
        ["go", "build", "-trimpath", "-ldflags", component.ldflags(), "-o", f"{staging}/", *component.tools],
        cwd=component.wrapper_dir,
        env=go_env(),
        check=True,
    )
    if component.crds:
        shutil.copytree(module_dir(component) / component.crds, staging / "crds")
    (staging / ".complete").write_text(f"{time.monotonic() - started:.0f}s\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    print(f"built {component.name} in {time.monotonic() - started:.0f}s", file=log, flush=True)
    return target


def module_dir(component: Component) -> Path:
    """The extracted source of the pinned module in the module cache."""
    out = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", component.module],
        cwd=component.wrapper_dir,
        env=go_env(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not out:
        subprocess.run(["go", "mod", "download", component.module], cwd=component.wrapper_dir, env=go_env(), check=True)
        return module_dir(component)
    return Path(out)


def build_all(log=sys.stderr) -> dict[str, Path]:
    """Build every component (sequentially: the go command already uses every core)."""
    return {name: build(component, log) for name, component in load_components().items()}


def binaries() -> dict[str, Path]:
    """Path of every built program by name (kube-apiserver, etcd, helm, ...), building as needed."""
    found: dict[str, Path] = {}
    for directory in build_all().values():
        for path in directory.iterdir():
            if path.is_file() and os.access(path, os.X_OK):
                found[path.name] = path
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpojob_testing.build", description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", default="build", choices=["build", "check", "pin"])
    parser.add_argument("components", nargs="*", help="names from versions.toml (default: all)")
    args = parser.parse_args(argv)
    components = load_components()
    selected = [components[name] for name in args.components] if args.components else list(components.values())
    if args.command == "check":
        problems = [p for c in selected for p in mismatches(c)]
        print("\n".join(problems) or "go.mod files agree with versions.toml")
        return 1 if problems else 0
    for component in selected:
        if args.command == "pin":
            pin(component)
        else:
            print(build(component))
    return 0


if __name__ == "__main__":
    sys.exit(main())
