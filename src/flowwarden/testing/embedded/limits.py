"""The size limits of the embedded replica set: MongoDB's, in the one place every layer reads them.

The wire layer holds messages and the objects in them to :data:`MAX_MESSAGE_SIZE` and
:data:`MAX_REQUEST_OBJECT_SIZE`; writes hold stored documents to :data:`MAX_BSON_OBJECT_SIZE`;
``hello`` advertises the message and document limits. A limit changed here changes what is
enforced and what is advertised together, so the two never disagree.
"""

from __future__ import annotations

# The largest document a collection may hold, in bytes of BSON (``maxBsonObjectSize``).
MAX_BSON_OBJECT_SIZE = 16 * 1024 * 1024
# The largest object a request may carry: 16 KiB more than a document, room for the command
# around a largest document. MongoDB refuses a bigger one with BSONObjectTooLarge.
MAX_REQUEST_OBJECT_SIZE = MAX_BSON_OBJECT_SIZE + 16 * 1024
# The largest message, header included (``maxMessageSizeBytes``); an OP_COMPRESSED message is held
# to it once inflated, too.
MAX_MESSAGE_SIZE = 48_000_000
