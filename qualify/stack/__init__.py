"""Disposable stacks: PostgreSQL + Temporal, started and always torn down (R-Q-1)."""

from qualify.stack._embedded import TIMER_MODES, EmbeddedStack, StackInfo, make_stack, open_stack

__all__ = ["TIMER_MODES", "EmbeddedStack", "StackInfo", "make_stack", "open_stack"]
