"""The Structured Streaming source ``flowwarden``: :mod:`.reader` (the data source and its
reader), :mod:`.options` (what ``.option(...)`` accepts), :mod:`.offsets` (the offsets Spark keeps
in a query's checkpointLocation, typed and versioned), :mod:`.ranges` (planning a micro-batch as
token ranges) and :mod:`.snapshot` (the copy the ``snapshot`` option reads first)."""
