"""Change-stream mechanics that the runtime and the Spark source share.

- :mod:`~flowwarden.mongo.raw_events`: change events read as raw BSON, looked up lazily;
- :mod:`~flowwarden.mongo.large_events`: events over 16 MB, joined from their fragments;
- :mod:`~flowwarden.mongo.buckets`: one stream read as hash buckets of ``documentKey._id``;
- :mod:`~flowwarden.mongo.positions`: where a stream may start, the oplog's edges on every shard,
  and the client helpers that ask the deployment;
- :mod:`~flowwarden.mongo.calls`: MongoDB work written once, run on sync and asyncio clients;
- :mod:`~flowwarden.mongo.codes`: the server error codes flowwarden acts on, each named once;
- :mod:`~flowwarden.mongo.failures`: which server errors a re-open fixes, and which it never will;
- :mod:`~flowwarden.mongo.initial_copy`: what an initial snapshot copies and the rows it hands over;
- :mod:`~flowwarden.mongo.redaction`: URIs with their secrets replaced, for logs and messages.

Nothing here knows handlers, checkpoints or Spark: those build on it.
"""
