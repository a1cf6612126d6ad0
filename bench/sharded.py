"""Section ``sharded``: the floor and qimpl again, on a second stack whose Temporal dev
server reads its one history shard at the rate a cluster of many shards has
(``qualify.stack.temporal.SHARD_RATE_DYNAMIC_CONFIG``).

Why: the dev server has one history shard, and a shard reads its transfer queue at most
20 times a second by default; from about the tenth workflow on, every workflow task then
waits for the shard's next read (about 30 ms each, two per bare workflow). That is the
"100 ms floor" of every earlier run (issue 21, item 4): the dev server's rate limit, not
Temporal's cost per workflow. A cluster spreads workflows over many shards with that
budget each. The default-server figures (sections ``floor`` and ``qimpl``) stay: they are
what a dev server gives; these say what the same code costs where the reader is not the
bottleneck.

Figures: every ``floor.*`` and ``qimpl.*`` figure of those sections, prefixed
``sharded.`` (resources are measured once, in ``qimpl``); ``sharded.dynamic_config``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.env import BenchEnv

__all__ = ["measure_sharded"]


def measure_sharded(env: BenchEnv) -> dict[str, Any]:
    """The floor's and qimpl's figures on a stack started with
    ``SHARD_RATE_DYNAMIC_CONFIG``, keys prefixed ``sharded.``; the stack is always torn
    down. Raises what the two sections raise (HarnessError)."""
    from bench.floor import measure_floor
    from bench.qimpl_runs import measure_qimpl
    from qualify.stack import EmbeddedStack
    from qualify.stack.temporal import SHARD_RATE_DYNAMIC_CONFIG

    stack = EmbeddedStack(temporal_config=SHARD_RATE_DYNAMIC_CONFIG)
    try:
        stack.start()
        sharded = dataclasses.replace(env, stack=stack, workdir=env.workdir / "sharded")
        out: dict[str, Any] = {"sharded.dynamic_config": dict(SHARD_RATE_DYNAMIC_CONFIG)}
        env.log("  sharded: the floor")
        out.update({f"sharded.{k}": v for k, v in measure_floor(sharded).items()})
        env.log("  sharded: qimpl")
        out.update({f"sharded.{k}": v for k, v in measure_qimpl(sharded).items()
                    if k.startswith("qimpl.")})
        return out
    finally:
        stack.stop()
