from .request import Request

__all__ = ["Request"]
