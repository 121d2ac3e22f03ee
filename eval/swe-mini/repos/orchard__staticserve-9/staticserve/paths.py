"""Map request paths onto files under a document root without ever leaving it."""
import os


class Forbidden(Exception):
    """The request path points outside the document root."""


def resolve(root, request_path):
    root = os.path.abspath(root)
    candidate = os.path.abspath(os.path.join(root, request_path.lstrip("/")))
    if not candidate.startswith(root):
        raise Forbidden(request_path)
    return candidate


def file_for(root, request_path, index="index.html"):
    """The file to send for `request_path`; directories serve their index file."""
    path = resolve(root, request_path)
    if os.path.isdir(path):
        path = os.path.join(path, index)
    if not os.path.isfile(path):
        raise FileNotFoundError(request_path)
    return path
