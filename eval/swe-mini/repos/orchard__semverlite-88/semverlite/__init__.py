from .version import Version

__all__ = ["Version"]
