from .intervals import free_slots, merge_busy

__all__ = ["free_slots", "merge_busy"]
