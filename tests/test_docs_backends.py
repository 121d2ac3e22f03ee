"""docs/writing-a-backend.md is what backend authors follow literally, so every code block in it is checked
(markers as in tests/doc_blocks.py): `protocol` is Orchard's backend contract member for member;
`capabilities` and `config` run, and what they print or define behaves as the page says; `in-file`
blocks are in the file they name; `cli` lines parse."""

from __future__ import annotations

import contextlib
import inspect
import io
from pathlib import Path

from orchard.core import backend as backend_module
from tests import doc_blocks

DOC = doc_blocks.ROOT / "docs" / "writing-a-backend.md"


def _run(kind: str) -> dict:
    (_, code, line), = doc_blocks.of_kind(DOC, kind)
    namespace: dict = {}
    exec(compile(code, f"{DOC.name}:{line}", "exec", dont_inherit=True), namespace)
    return namespace


def test_every_block_has_a_known_check():
    kinds = {kind for kind, *_ in doc_blocks.blocks(DOC)}
    assert kinds == {"cli", "protocol", "capabilities", "config", "in-file"}


def test_the_protocol_block_is_orchards_contract():
    documented = _run("protocol")["Backend"]
    real, plugin = backend_module.Backend, backend_module.BackendPlugin
    assert set(documented.__annotations__) == set(real.__annotations__) | {"Config"}
    assert "Config" in plugin.__annotations__
    methods = {name for name, value in vars(real).items() if inspect.isfunction(value) and not name.startswith("_")}
    assert methods | {"from_config"} == {name for name, value in vars(documented).items()
                                         if callable(getattr(value, "__func__", value)) and not name.startswith("_")
                                         and name not in ("Config",)}
    for name in methods:
        assert inspect.signature(getattr(documented, name)).parameters.keys() == \
            inspect.signature(getattr(real, name)).parameters.keys(), name


def test_the_capabilities_example_prints_the_refusal():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _run("capabilities")
    assert printed.getvalue().startswith("the acme backend cannot honour this sandbox spec: it lacks the "
                                         "disk_mb limit")


def test_the_config_example_is_a_backend_config(tmp_path):
    config_cls = _run("config")["AcmeConfig"]
    config = config_cls.from_env(tmp_path, {"ACME_HOST": "tcp://10.0.0.2:2375"})
    assert (config.backend, config.endpoint, config.cache_dir) == ("acme", "tcp://10.0.0.2:2375",
                                                                    Path(tmp_path) / "cache")
    assert isinstance(config, backend_module.BackendConfig)


def test_snippets_are_in_the_files_they_quote():
    doc_blocks.check_in_file_blocks(DOC)


def test_cli_lines_name_real_commands_and_options():
    doc_blocks.check_cli_lines(DOC)
