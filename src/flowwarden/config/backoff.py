"""Backoff arithmetic shared by handler retries and stream restarts."""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_delay(
    attempt: int,
    *,
    initial: float,
    multiplier: float,
    maximum: float,
    jitter: float,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after the ``attempt``-th failure (1-based) before trying again.

    ``initial * multiplier ** (attempt - 1)``, capped at ``maximum``, then spread by up to
    ``±jitter`` of itself with ``rng()`` (a float in [0, 1)). The result is never negative and
    never above ``maximum``, however large ``attempt`` grows.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    try:
        base = initial * multiplier ** (attempt - 1)
    except OverflowError:
        base = maximum
    delay = min(base, maximum)
    if jitter:
        delay *= 1.0 - jitter + 2.0 * jitter * rng()
    return min(max(delay, 0.0), maximum)
