"""flowwarden.sinks: where batches go, exactly once.

- :class:`DeltaSink`: merges each batch's last change per document into a Delta table with
  delta-rs (no Spark jars), recording the batch in the same commit so a redelivered batch is
  skipped by the table itself. Needs the ``delta`` extra: ``pip install "flowwarden[delta]"``.

Importing this package imports neither deltalake nor pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowwarden._lazy import lazy_attributes

if TYPE_CHECKING:
    from flowwarden.sinks.delta import DeltaSink as DeltaSink

_LAZY = {"DeltaSink": "flowwarden.sinks.delta"}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
