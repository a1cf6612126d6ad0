"""Disposable stacks: PostgreSQL + Temporal, started and always torn down (R-Q-1)."""

from qualify.stack._embedded import EmbeddedStack, StackInfo, open_stack

__all__ = ["EmbeddedStack", "StackInfo", "open_stack"]
