"""Semantic Versioning 2.0.0: parse, print and order versions (build metadata is ignored)."""
import functools
import re

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$")


@functools.total_ordering
class Version:
    def __init__(self, major, minor, patch, prerelease=(), build=()):
        self.major, self.minor, self.patch = major, minor, patch
        self.prerelease = tuple(prerelease)
        self.build = tuple(build)

    @classmethod
    def parse(cls, text):
        match = _SEMVER.match(text.strip())
        if not match:
            raise ValueError("not a semantic version: %r" % text)
        major, minor, patch, pre, build = match.groups()
        return cls(int(major), int(minor), int(patch),
                   pre.split(".") if pre else (), build.split(".") if build else ())

    def _key(self):
        # A release sorts after all of its pre-releases.
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, self.prerelease)

    def __eq__(self, other):
        return isinstance(other, Version) and self._key() == other._key()

    def __lt__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self):
        return hash(self._key())

    def __str__(self):
        text = "%d.%d.%d" % (self.major, self.minor, self.patch)
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text
