"""Disposable stacks: PostgreSQL + Temporal, started and always torn down (R-Q-1)."""

from qualify.stack._embedded import EmbeddedStack, StackInfo, make_stack, open_stack

__all__ = ["EmbeddedStack", "StackInfo", "make_stack", "open_stack"]
