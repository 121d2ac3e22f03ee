"""The Engine API calls the docker backend makes, through the `docker` SDK's low-level client, with its
errors turned into Orchard's: an unreachable daemon is a BackendError naming the socket and how to start
one, a missing image an InvalidRequest naming the image and how to get it, a spec the daemon refuses an
InvalidRequest with the daemon's reason. Every method blocks: the backend runs them in its thread pool."""

from __future__ import annotations

import contextlib
import json
import logging

from orchard.core.errors import BackendError, InvalidRequest

log = logging.getLogger(__name__)

START_HINT = ("start one with `scripts/docker/daemon.sh up` and `eval \"$(scripts/docker/daemon.sh env)\"`, "
              "or point DOCKER_HOST at yours (Podman: `podman system service`)")
LOG_TAIL_BYTES = 2000


def _docker():
    try:
        import docker
    except ImportError as e:
        raise BackendError(f"the docker backend needs the docker SDK ({e}); pip install 'orchard[docker]'") from e
    return docker


class Engine:
    """One daemon, through one `docker.APIClient` (its connection pool is shared by the threads)."""

    def __init__(self, api, base_url: str) -> None:
        self.api, self.base_url = api, base_url
        docker = _docker()
        self._errors = docker.errors
        self._unreachable = (docker.errors.DockerException, OSError)

    @classmethod
    def connect(cls, base_url: str, pool_size: int) -> "Engine":
        """Connect and check that the daemon answers (the API version is negotiated with it)."""
        docker = _docker()
        try:
            api = docker.APIClient(base_url=base_url, version="auto", timeout=60, max_pool_size=pool_size)
        except docker.errors.DockerException as e:
            raise BackendError(f"cannot reach the Docker daemon at {base_url} ({_short(e)}); {START_HINT}") from e
        return cls(api, base_url)

    def _daemon_error(self, action: str, e: Exception) -> BackendError:
        if isinstance(e, self._errors.APIError):
            return BackendError(f"the Docker daemon at {self.base_url} failed to {action}: {_explanation(e)}")
        return BackendError(f"lost the Docker daemon at {self.base_url} while trying to {action} ({_short(e)}); "
                            f"{START_HINT}")

    # --- images ----------------------------------------------------------------------------------------

    def ensure_image(self, image: str, pull: str) -> None:
        """`pull`: missing (pull only when the daemon lacks it), never, always."""
        if pull != "always":
            try:
                self.api.inspect_image(image)
                return
            except self._errors.ImageNotFound:
                if pull == "never":
                    raise InvalidRequest(f"image {image!r} is not on the Docker daemon at {self.base_url} and "
                                         f"pulling is off (pull='never'); {_get_image_hint(image)}") from None
            except self._unreachable as e:
                raise self._daemon_error(f"look up image {image!r}", e) from e
        repository, tag = _split_reference(image)
        try:
            log.info("pulling image %s", image)
            progress = self.api.pull(repository, tag=tag)
        except self._errors.APIError as e:
            raise InvalidRequest(f"image {image!r} is not on the Docker daemon at {self.base_url} and pulling "
                                 f"it failed: {_explanation(e)}; {_get_image_hint(image)}") from e
        except self._unreachable as e:
            raise self._daemon_error(f"pull image {image!r}", e) from e
        # A failed pull may still answer 200, with the error inside its progress stream (Podman does).
        try:
            self.api.inspect_image(image)
        except self._errors.ImageNotFound:
            raise InvalidRequest(f"image {image!r} is not on the Docker daemon at {self.base_url} and pulling "
                                 f"it failed: {_pull_error(progress)}; {_get_image_hint(image)}") from None
        except self._unreachable as e:
            raise self._daemon_error(f"look up image {image!r}", e) from e

    # --- containers ------------------------------------------------------------------------------------

    def create_and_start(self, name: str, options: dict, host_options: dict) -> str:
        """The container's id. A spec the daemon refuses (400) is the caller's: InvalidRequest."""
        try:
            host_config = self.api.create_host_config(**host_options)
            container = self.api.create_container(name=name, host_config=host_config, **options)
        except self._errors.ImageNotFound as e:  # removed since ensure_image looked
            raise InvalidRequest(f"image {options['image']!r} is not on the Docker daemon at {self.base_url}: "
                                 f"{_get_image_hint(options['image'])}") from e
        except self._errors.APIError as e:
            if e.status_code == 409:
                raise InvalidRequest(f"a container named {name} already exists on the Docker daemon: "
                                     "delete that sandbox first or use another id") from e
            if e.status_code == 400:
                raise InvalidRequest(f"the Docker daemon refused the sandbox: {_explanation(e)}") from e
            raise self._daemon_error(f"create container {name}", e) from e
        except self._unreachable as e:
            raise self._daemon_error(f"create container {name}", e) from e
        container_id = container["Id"]
        try:
            self.api.start(container_id)
        except (self._errors.APIError, *self._unreachable) as e:
            with contextlib.suppress(Exception):
                self.remove(container_id)
            if isinstance(e, self._errors.APIError) and e.status_code == 400:
                raise InvalidRequest(f"the Docker daemon cannot start the sandbox: {_explanation(e)}") from e
            raise self._daemon_error(f"start container {name}", e) from e
        return container_id

    def inspect(self, container: str) -> dict | None:
        try:
            return self.api.inspect_container(container)
        except self._errors.NotFound:
            return None
        except self._unreachable as e:
            raise self._daemon_error(f"inspect container {container}", e) from e

    def state(self, container: str) -> dict | None:
        """The container's State (Running, ExitCode, ...), None when there is no such container."""
        info = self.inspect(container)
        return info.get("State") if info else None

    def logs_tail(self, container: str) -> str:
        try:
            data = self.api.logs(container, stdout=True, stderr=True, tail=20)
        except Exception:  # noqa: BLE001 - only for an error message
            return ""
        return data[-LOG_TAIL_BYTES:].decode(errors="replace").strip()

    def remove(self, container: str) -> None:
        """Kill and remove; a container already gone (or going) is fine."""
        try:
            self.api.remove_container(container, force=True, v=True)
        except self._errors.NotFound:
            pass
        except self._errors.APIError as e:
            if e.status_code == 409 and "already in progress" in _explanation(e):
                return
            raise self._daemon_error(f"remove container {container}", e) from e
        except self._unreachable as e:
            raise self._daemon_error(f"remove container {container}", e) from e

    def list(self, filters: dict) -> list[dict]:
        try:
            return self.api.containers(all=True, filters=filters)
        except self._unreachable as e:
            raise self._daemon_error("list containers", e) from e

    def close(self) -> None:
        self.api.close()


def _split_reference(image: str) -> tuple[str, str | None]:
    """`repo[:tag][@digest]` → (repository, tag or digest): the SDK pulls every tag when given none."""
    if "@" in image:
        repository, _, digest = image.partition("@")
        return repository, digest
    name, _, tag = image.rpartition(":")
    if name and "/" not in tag:
        return name, tag
    return image, "latest"


def _get_image_hint(image: str) -> str:
    return (f"get it onto the daemon first (`docker pull {image}`, `docker load -i <archive>`, or for Orchard's "
            "Debian image `scripts/docker/daemon.sh image`), or set the backend's pull option")


def _pull_error(progress: str) -> str:
    """The error a pull's progress stream (JSON lines) reports, else its last line."""
    lines = [line for line in str(progress or "").splitlines() if line.strip()]
    for line in lines:
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if isinstance(message, dict) and message.get("error"):
                return str(message["error"])
    return lines[-1][:300] if lines else "the daemon reported nothing"


def _explanation(e: Exception) -> str:
    return str(getattr(e, "explanation", None) or e)


def _short(e: Exception) -> str:
    text = str(e)
    return text if len(text) < 300 else text[:300] + "..."
