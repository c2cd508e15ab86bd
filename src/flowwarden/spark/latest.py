"""The last change of each document in a batch: what a MERGE into a table needs.

A batch of change events may change one document several times; a table keyed by the document
wants one row per document, its state after the batch. :func:`latest_per_key` (a Spark
DataFrame) and :func:`latest_per_key_arrow` (a pyarrow Table) keep, for each ``document_key``,
the row of its last change in change-stream order, which is the order of the ``_id`` column
(the resume token's ``_data``: hexadecimal KeyStrings compare as the stream orders them). A
delete stays a row, with ``operation_type == "delete"`` and a null ``full_document``, so one
MERGE applies the batch::

    MERGE INTO target t USING latest s ON t._id = s.key
    WHEN MATCHED AND s.operation_type = 'delete' THEN DELETE
    WHEN MATCHED THEN UPDATE SET ...
    WHEN NOT MATCHED AND s.operation_type <> 'delete' THEN INSERT ...

(docs/spark.md shows it for Delta, Iceberg and Hudi tables). Rows without a document key
(drop, rename, invalidate events) are left out. Initial-snapshot rows (no ``_id``) count as
older than any change of the same batch.

Hard rule: the result keeps the input's columns and types; only rows are left out. Importing
this module imports neither pyspark nor pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowwarden.spark._extra import require

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["latest_per_key", "latest_per_key_arrow"]

KEY_COLUMN = "document_key"
ORDER_COLUMN = "_id"


def latest_per_key(df: DataFrame) -> DataFrame:
    """One row per ``document_key``: the last change of the batch by ``_id`` order, deletes
    kept as rows (``operation_type == "delete"``); rows without a document key left out."""
    require("pyspark.sql", "latest_per_key")
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rank = "__flowwarden_rank"
    order = Window.partitionBy(KEY_COLUMN).orderBy(F.col(ORDER_COLUMN).desc_nulls_last())
    return (
        df.where(F.col(KEY_COLUMN).isNotNull())
        .withColumn(rank, F.row_number().over(order))
        .where(F.col(rank) == 1)
        .drop(rank)
    )


def latest_per_key_arrow(table: Any) -> Any:
    """:func:`latest_per_key` for a pyarrow Table (what ``events_to_arrow`` returns): the rows
    kept stay in their order in ``table``."""
    pa = require("pyarrow", "latest_per_key_arrow")
    import pyarrow.compute as pc

    keys = table[KEY_COLUMN].combine_chunks()
    if len(keys) == 0:
        return table
    positions = pa.array(range(table.num_rows), type=pa.int64())
    # A null token (a snapshot row) as "": older than any change of the same document.
    order = pc.fill_null(table[ORDER_COLUMN], "")
    sortable = pa.table({"key": keys, "order": order, "position": positions})
    ordered = pc.sort_indices(
        sortable, sort_keys=[("key", "ascending"), ("order", "ascending"), ("position", "ascending")]
    )
    sorted_keys = keys.take(ordered)
    # The last row of each run of equal keys; rows with a null key are no document's.
    count = len(sorted_keys)
    changes = pc.fill_null(pc.not_equal(sorted_keys.slice(0, count - 1), sorted_keys.slice(1)), True)
    last = pa.concat_arrays([changes, pa.array([True])])
    chosen = pc.filter(ordered, pc.and_(last, pc.is_valid(sorted_keys)))
    return table.take(pc.take(chosen, pc.sort_indices(chosen)))
