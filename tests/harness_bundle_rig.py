"""A tiny harness bundle for tests, registered the way a plug-in registers one (an entry point in
`orchard.harness_bundles`) and built once per test session: Debian's Python 3.13 plus one small pure-Python
pin with a console script (tabulate). Downloads (.debs, wheels) are kept between sessions in one directory
of this machine's temp dir, so the suite does not download them again."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from orchard.core.harness_bundle import HarnessBundleSpec
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
