"""Owner API keys of `orchard serve`: each key is bound to one owner, so the owner of a sandbox is whoever
holds the key, never a name the client chose, and per-owner caps cannot be dodged by naming another owner.

The keys live in a JSON file (default `<home>/api-keys.json`, mode 0600) of `ApiKeyEntry`s: the owner, the
key's own cap on that owner's live sandboxes, its expiry and the SHA-256 of the key, never the key itself
(`orchard serve keys add` prints it once). Keys are 256 random bits, so a plain hash cannot be reversed by
guessing. The server reads the file again whenever it changes: an added, revoked or expired key counts from
its next request, without a restart."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchard.core.errors import InvalidRequest, NotFound, describe_validation_errors

log = logging.getLogger("orchard.sandbox.server")

KEYS_FILE_NAME = "api-keys.json"
KEY_PREFIX = "ok_"
OWNER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$"


class ApiKeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    id: str = Field(pattern=r"^k-[0-9a-f]{8,32}$", description="public name of the key (list, revoke)")
    owner: str = Field(pattern=OWNER_PATTERN, description="the owner of every sandbox created with the key")
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the key; the key is not stored")
    max_sandboxes: int | None = Field(default=None, ge=1, description="most live sandboxes of this owner when "
                                                                       "created with this key (None: the server's "
                                                                       "per-owner cap only)")
    expires_at: float | None = Field(default=None, description="Unix time after which the key is refused")
    created_at: float

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class ApiKeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    keys: list[ApiKeyEntry] = Field(default_factory=list)


def keys_file(home: Path) -> Path:
    return home / KEYS_FILE_NAME


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_keys(path: Path) -> ApiKeyFile:
    """The file's keys (none if it does not exist); InvalidRequest naming the file when it is unreadable."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ApiKeyFile()
    except OSError as exc:
        raise InvalidRequest(f"cannot read the API key file {path}: {exc.strerror or exc}") from None
    try:
        return ApiKeyFile.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidRequest(f"the API key file {path} is not valid: "
                             f"{describe_validation_errors(exc.errors())}; fix or remove it") from None


def write_keys(path: Path, keys: ApiKeyFile) -> None:
    """Atomically, mode 0600: a server reading it meanwhile sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(keys.model_dump_json(indent=2) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_key(path: Path, owner: str, *, max_sandboxes: int | None = None,
            expires_at: float | None = None) -> tuple[ApiKeyEntry, str]:
    """A new key for `owner`: (its entry, the key). The key is returned once and never stored."""
    now = time.time()
    if expires_at is not None and expires_at <= now:
        raise InvalidRequest("the expiry is in the past; give a later time or a duration such as 30d")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    try:
        entry = ApiKeyEntry(id=f"k-{secrets.token_hex(6)}", owner=owner, key_sha256=key_hash(key),
                            max_sandboxes=max_sandboxes, expires_at=expires_at, created_at=now)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid key: {describe_validation_errors(exc.errors())} (an owner is 1 to 100 "
                             "letters, digits, '.', '_', '@' or '-', starting with a letter or digit)") from None
    keys = read_keys(path)
    keys.keys.append(entry)
    write_keys(path, keys)
    return entry, key


def revoke_key(path: Path, key_id: str) -> ApiKeyEntry:
    """Remove key `key_id` from the file: refused from the server's next request on."""
    keys = read_keys(path)
    found = [k for k in keys.keys if k.id == key_id]
    if not found:
        known = ", ".join(k.id for k in keys.keys) or "none"
        raise NotFound(f"no API key {key_id!r} in {path} (keys there: {known}); `orchard serve keys list` shows them")
    keys.keys = [k for k in keys.keys if k.id != key_id]
    write_keys(path, keys)
    return found[0]


class KeyRing:
    """The server's view of the key file, read again when the file changes (size, mtime or inode)."""

    def __init__(self, path: Path) -> None:
        """InvalidRequest when the file cannot be read now: the server does not start with it."""
        self.path = path
        self._seen: tuple | None = None
        self._by_hash: dict[str, ApiKeyEntry] = {}
        self._reload()

    def reload(self) -> None:
        """A file broken while serving keeps the keys read last (and says so in the log)."""
        try:
            self._reload()
        except InvalidRequest as exc:
            log.error("%s; still using the keys read before", exc)

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
            stamp: tuple | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        if stamp == self._seen:
            return
        self._seen = stamp  # a broken file is reported once, not at every request
        keys = read_keys(self.path) if stamp is not None else ApiKeyFile()
        self._by_hash = {k.key_sha256: k for k in keys.keys}

    def find(self, key: str) -> ApiKeyEntry | None:
        """The entry of `key` (expired or not), or None."""
        self.reload()
        return self._by_hash.get(key_hash(key))
