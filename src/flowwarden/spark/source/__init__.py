"""The Structured Streaming source ``flowwarden``: :mod:`.reader` (the data source and its
reader), :mod:`.options` (what ``.option(...)`` accepts), :mod:`.ranges` (planning a micro-batch
as token ranges) and :mod:`.snapshot` (the copy the ``snapshot`` option reads first)."""
