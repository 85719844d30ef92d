"""Print the pinned requirements of pyproject.toml's dependencies and the named extras, one a line.

    python extra_requirements.py PYPROJECT EXTRA [EXTRA ...] [--without NAME ...]

An extra's own references to this project (``grpojob[environment]``) are expanded. The Dockerfile
installs a list printed here before the project's wheel, so that a source change rebuilds only the
wheel's small layer and not the few GB of torch and Ray; the versions stay written once, in
pyproject.toml. ``--without`` leaves out the named packages (those that vLLM pins for itself).
"""

import re
import sys
import tomllib


def requirements(project: dict, extras: list[str]) -> list[str]:
    """The dependencies and the extras' requirements, self-references expanded, in order, once each."""
    found = list(project["dependencies"])
    pending = list(extras)
    seen = set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in project["optional-dependencies"][extra]:
            own = re.fullmatch(rf"{project['name']}\[([\w,\-]+)\]", requirement)
            if own:
                pending += own.group(1).split(",")
            else:
                found.append(requirement)
    return list(dict.fromkeys(found))


def main(argv: list[str]) -> None:
    path, names = argv[0], argv[1:]
    without = names[names.index("--without") + 1 :] if "--without" in names else []
    extras = names[: names.index("--without")] if "--without" in names else names
    with open(path, "rb") as handle:
        project = tomllib.load(handle)["project"]
    for requirement in requirements(project, extras):
        if re.split(r"[\[=<>!~ ;]", requirement, maxsplit=1)[0] not in without:
            print(requirement)


if __name__ == "__main__":
    main(sys.argv[1:])
