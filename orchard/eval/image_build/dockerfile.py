"""The Dockerfiles Orchard builds without a daemon (image_build/local.py): one stage `FROM` a base image,
then RUN, WORKDIR, ENV, COPY (files of the build context), ARG and USER root; instructions that only describe
the image to a container engine (CMD, ENTRYPOINT, EXPOSE, LABEL, ...) are read and left out. Anything else
(ADD, a second FROM, COPY --from, SHELL, USER someone) is refused, naming the line: the task is then not
runnable on the local backend, and says why."""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from typing import Literal

from pydantic import BaseModel

Kind = Literal["FROM", "RUN", "WORKDIR", "ENV", "COPY", "ARG", "USER"]
BUILT = frozenset({"FROM", "RUN", "WORKDIR", "ENV", "COPY", "ARG", "USER"})
IGNORED = frozenset({"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "MAINTAINER", "STOPSIGNAL", "HEALTHCHECK", "VOLUME",
                     "ONBUILD"})
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::-([^}]*))?\}|(\w+))")


class DockerfileError(ValueError):
    pass


class Step(BaseModel):
    kind: Kind
    line: int
    args: list[str]  # RUN: one shell command; ENV/ARG: name, value; COPY: sources..., destination; others: one


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with continuations joined and comments dropped."""
    lines: list[tuple[int, str]] = []
    current, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not current:
            start = number
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append((start, current + stripped))
        current = ""
    if current.strip():
        lines.append((start, current.strip()))
    return lines


def _substitute(text: str, values: dict[str, str]) -> str:
    return _VARIABLE.sub(lambda m: values.get(m.group(1) or m.group(3), m.group(2) or ""), text)


def _pairs(rest: str, kind: str, number: int) -> list[tuple[str, str]]:
    """ENV/ARG's `name=value ...`, or ENV's legacy `name value`; ARG may have no value."""
    words = shlex.split(rest)
    if not words:
        raise DockerfileError(f"line {number}: {kind} needs a name")
    if "=" not in words[0] and kind == "ENV":
        name, _, value = rest.strip().partition(" ")
        return [(name, value.strip())]
    pairs = []
    for word in words:
        name, equals, value = word.partition("=")
        if not re.fullmatch(r"[A-Za-z_]\w*", name) or (kind == "ENV" and not equals):
            raise DockerfileError(f"line {number}: {kind} {word!r} is not name=value")
        pairs.append((name, value))
    return pairs


def parse(text: str) -> list[Step]:
    """The build's steps, with ARG and ENV values substituted where Docker substitutes them."""
    steps: list[Step] = []
    values: dict[str, str] = {}
    for number, line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        kind, rest = keyword.upper(), rest.strip()
        if kind in IGNORED:
            continue
        if kind not in BUILT:
            raise DockerfileError(f"line {number}: {keyword} is not supported by the local builder (it builds FROM, "
                                  "RUN, WORKDIR, ENV, COPY, ARG and USER root)")
        if kind == "RUN":
            if rest.startswith("["):
                try:
                    rest = shlex.join(json.loads(rest))
                except (ValueError, TypeError):
                    raise DockerfileError(f"line {number}: RUN's exec form is not a JSON list of strings") from None
            if rest.startswith("--"):
                raise DockerfileError(f"line {number}: RUN {rest.split()[0]} is not supported by the local builder")
            steps.append(Step(kind="RUN", line=number, args=[rest]))
            continue
        if kind in ("ENV", "ARG"):
            for name, value in _pairs(rest, kind, number):
                value = _substitute(value, values)
                if kind == "ARG" and name in values:
                    continue  # an ARG does not override an ENV or an earlier ARG's value
                values[name] = value
                steps.append(Step(kind=kind, line=number, args=[name, value]))
            continue
        rest = _substitute(rest, values)
        if kind == "FROM":
            if steps and any(step.kind == "FROM" for step in steps):
                raise DockerfileError(f"line {number}: a second FROM (a multi-stage build) is not supported by the "
                                      "local builder")
            words = rest.split()
            if not words or words[0].startswith("--") or len(words) not in (1, 3):
                raise DockerfileError(f"line {number}: FROM {rest!r} is not `FROM IMAGE`")
            steps.append(Step(kind="FROM", line=number, args=[words[0]]))
        elif kind == "COPY":
            words = shlex.split(rest)
            if any(word.startswith("--") for word in words):
                raise DockerfileError(f"line {number}: COPY {words[0]} is not supported by the local builder")
            if len(words) < 2:
                raise DockerfileError(f"line {number}: COPY needs a source and a destination")
            steps.append(Step(kind="COPY", line=number, args=words))
        elif kind == "USER":
            if rest.split(":")[0] not in ("root", "0"):
                raise DockerfileError(f"line {number}: USER {rest} is not supported by the local builder (only root)")
        elif kind == "WORKDIR":
            steps.append(Step(kind="WORKDIR", line=number, args=[rest]))
    if not steps or steps[0].kind not in ("FROM", "ARG") or not any(step.kind == "FROM" for step in steps):
        raise DockerfileError("it has no FROM")
    return steps


def last_workdir(text: str) -> str | None:
    """The directory the image's processes start in (its last WORKDIR, ARG and ENV values substituted), read
    leniently: also from a Dockerfile the local builder does not take, which the Docker backend builds."""
    values: dict[str, str] = {}
    workdir = None
    for number, line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        kind = keyword.upper()
        if kind in ("ENV", "ARG"):
            try:
                values.update((name, _substitute(value, values)) for name, value in _pairs(rest.strip(), kind, number))
            except (DockerfileError, ValueError):
                continue
        elif kind == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir or "/", _substitute(rest.strip(), values)))
        elif kind == "FROM":
            workdir = None  # a new stage starts at its base's
    return workdir
