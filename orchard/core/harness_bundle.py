"""What a harness declares to be installed as a *harness bundle*: its own Python, its pinned requirements and
the Debian packages it needs, built once and mounted read-only at `/.orchard/harness/<name>` into any task
image (docs/harness-bundles.md; the builder is orchard/sandbox/harness_bundles/).

Specs are found by name through the entry-point group `orchard.harness_bundles` (`name = "module:SPEC"`,
the target a `HarnessBundleSpec` or a function returning one), so a plugin ships its own next to its
adapter and nothing is imported by name."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchard.core.errors import InvalidRequest, PluginError
from orchard.core.plugins import Registry, check_name
from orchard.core.sandbox import BUNDLE_NAME_PATTERN, HARNESS_MOUNT_ROOT

BUNDLE_ENTRY_POINT_GROUP = "orchard.harness_bundles"
# `name==version` or `name[extra,...]==version`: exact pins only, so a bundle's content is its spec's.
PINNED_REQUIREMENT = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(\[[A-Za-z0-9._,-]+\])?"
                                r"==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
DEBIAN_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
BUNDLE_PLACEHOLDER = "{bundle}"  # in `entry` and `env`: where the bundle is mounted inside the sandbox
VENV_DIR = "venv"


class HarnessBundleSpec(BaseModel):
    """One harness bundle: `python` (a CPython the builder has, e.g. "3.13"), exact pip pins, extra Debian
    packages (their programs run from the bundle, like its Python), the harness's entry command and
    environment. In `entry` and `env`, `{bundle}` stands for the bundle's mount point; an `entry` program
    without a `/` is one of the bundle venv's programs (a console script, or `python`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=BUNDLE_NAME_PATTERN, description="mounted at /.orchard/harness/<name>")
    python: str = Field(default="3.13", pattern=r"^3\.[0-9]{1,2}$", description="CPython major.minor")
    requirements: list[str] = Field(default_factory=list, max_length=256,
                                    description="exact pins, `name==version` (dependencies are resolved by "
                                                "pip at build time, unless `locked`, and recorded in the "
                                                "manifest)")
    locked: bool = Field(default=False, description="`requirements` is the complete resolved set (a lock, "
                                                    "every transitive distribution pinned): pip installs it "
                                                    "with --no-deps and resolves nothing")
    debian_packages: list[str] = Field(default_factory=list, max_length=64,
                                       description="Debian packages added beside the interpreter, e.g. ripgrep")
    entry: list[str] = Field(default_factory=list, description="the harness's command, e.g. ['kimi', '--print']")
    env: dict[str, str] = Field(default_factory=dict, description="environment the harness runs with")

    @field_validator("requirements")
    @classmethod
    def _pinned(cls, v: list[str]) -> list[str]:
        for req in v:
            if not PINNED_REQUIREMENT.match(req):
                raise ValueError(f"requirement {req[:120]!r} is not an exact pin: write `name==version` (a "
                                 "bundle is cached by its spec, so only exact versions keep it reproducible)")
        return v

    @field_validator("debian_packages")
    @classmethod
    def _debian_names(cls, v: list[str]) -> list[str]:
        for package in v:
            if not DEBIAN_PACKAGE.match(package):
                raise ValueError(f"{package[:80]!r} is not a Debian package name (lowercase letters, digits, "
                                 "'+', '-', '.')")
        return v

    @model_validator(mode="after")
    def _entry_program(self) -> "HarnessBundleSpec":
        if self.entry and not self.entry[0]:
            raise ValueError("entry's first element (the program) is empty")
        return self

    def mount_point(self) -> str:
        return f"{HARNESS_MOUNT_ROOT}/{self.name}"

    def entry_argv(self, *args: str) -> list[str]:
        """`entry` (plus `args`) as a command line inside a sandbox with this bundle mounted."""
        if not self.entry:
            raise InvalidRequest(f"harness bundle {self.name!r} declares no entry command")
        argv = [self._expand(part) for part in self.entry]
        if "/" not in argv[0]:
            argv[0] = f"{self.mount_point()}/{VENV_DIR}/bin/{argv[0]}"
        return [*argv, *args]

    def entry_env(self) -> dict[str, str]:
        return {key: self._expand(value) for key, value in self.env.items()}

    def _expand(self, text: str) -> str:
        return text.replace(BUNDLE_PLACEHOLDER, self.mount_point())


def lock_pins(text: str) -> list[str]:
    """The pins of a lock file (what `orchard harness lock` prints): one `name==version` a line, `#` comments
    and blank lines ignored."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


BUNDLES = Registry("harness bundle", BUNDLE_ENTRY_POINT_GROUP, "docs/harness-bundles.md")


def bundle_spec_names() -> list[str]:
    """Every registered bundle's name (nothing is imported)."""
    return BUNDLES.names()


def get_bundle_spec(name: str) -> HarnessBundleSpec:
    """The spec registered as `name` (or named by import path `module:SPEC`); InvalidRequest naming the known
    ones when there is none."""
    target, entry = BUNDLES.load(name)
    spec = target() if callable(target) and not isinstance(target, HarnessBundleSpec) else target
    if not isinstance(spec, HarnessBundleSpec):
        raise PluginError(f"{BUNDLES.where(entry)} is not a HarnessBundleSpec (got {type(spec).__name__})")
    check_name(BUNDLES, entry, spec.name)
    return spec

