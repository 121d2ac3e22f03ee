from .dotenv import dumps, loads

__all__ = ["dumps", "loads"]
