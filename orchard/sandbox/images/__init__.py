"""Task images from OCI archives: `orchard image import FILE` unpacks an OCI image layout (a directory or
a tar of one), an oci-archive or a `docker save` / `podman save` archive into a root file system that the
local backend runs as `image="oci:NAME"`.

- `blobs.py`: reading an archive's files (a directory or a tar), digest checks, layer decompression;
- `archive.py`: which image an archive holds (OCI index and manifest, or docker's manifest.json);
- `unpack.py`: applying layers in order onto a root (whiteouts, opaque dirs, ownership, links, xattrs),
  never writing outside it;
- `refs.py`: `oci:NAME` and names;
- `store.py`: the store under `$ORCHARD_HOME/images`, keyed by digest, with the names that point there.
See docs/images.md."""

from orchard.sandbox.images.models import IdMap, ImageRecord
from orchard.sandbox.images.refs import OCI_PREFIX, strip_oci_prefix
from orchard.sandbox.images.store import ImageStore

__all__ = ["IdMap", "ImageRecord", "ImageStore", "OCI_PREFIX", "strip_oci_prefix"]
