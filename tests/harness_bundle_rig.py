"""Harness bundles for tests. A tiny one, registered the way a plug-in registers one (an entry point in
`orchard.harness_bundles`): Debian's Python 3.13 plus one small pure-Python pin with a console script
(tabulate). And one cache per test session (`SessionBundles`, the `session_bundles` fixture of
tests/conftest.py) that every test module's Orchard home shares, so each bundle (kimi-cli, openhands, ...) is
built at most once per session however many modules run it. Downloads (.debs, wheels) are kept between
sessions in one directory of this machine's temp dir, so the suite does not download them again."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from orchard.core.harness_bundle import HarnessBundleSpec, get_bundle_spec
from orchard.sandbox.harness_bundles.build import ensure_bundle
from tests.plugin_site import write_distribution

TINY = "tiny-test"
UNBUILT = "tiny-unbuilt"
TINY_SPEC = HarnessBundleSpec(name=TINY, python="3.13", requirements=["tabulate==0.9.0"], entry=["tabulate"],
                              env={"TINY_HOME": "{bundle}"})
MODULE = "orchard_test_bundles"
SOURCE = f'''
from orchard.core.harness_bundle import HarnessBundleSpec
TINY = HarnessBundleSpec.model_validate_json({TINY_SPEC.model_dump_json()!r})
UNBUILT = HarnessBundleSpec(name={UNBUILT!r}, requirements=["tabulate==0.9.0"])
'''


def shared_downloads() -> Path:
    return Path(tempfile.gettempdir()) / f"orchard-test-harness-downloads-{os.getuid()}"


def register_test_bundles(site: Path) -> None:
    """Write the plug-in distribution into `site` and put it first on sys.path (for the session)."""
    write_distribution(site, "orchard-test-bundles", "0.1", "orchard.harness_bundles",
                       {TINY: f"{MODULE}:TINY", UNBUILT: f"{MODULE}:UNBUILT"}, {f"{MODULE}.py": SOURCE})
    sys.path.insert(0, str(site))


class SessionBundles:
    """One cache directory for the whole test session. Bundles are content-addressed and built under a lock
    per key, so sharing them between modules is safe; everything else of a test stays in its own home (the
    cache is linked into it: `<home>/cache` -> the session's, so the agent bundle is shared too)."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache

    def build(self, *names: str) -> Path:
        """Build each named bundle into the session cache unless it is there already; the cache."""
        for name in names:
            ensure_bundle(get_bundle_spec(name), self.cache, downloads=shared_downloads())
        return self.cache

    def home(self, directory: Path, *names: str) -> Path:
        """`directory` made an Orchard home whose cache is the session's, holding the named bundles."""
        self.cache.mkdir(parents=True, exist_ok=True)
        (directory / "cache").symlink_to(self.cache, target_is_directory=True)
        self.build(*names)
        return directory
