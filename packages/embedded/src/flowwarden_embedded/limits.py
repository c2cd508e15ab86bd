"""The size limits of the embedded replica set: MongoDB's, in the one place every layer reads them.

The wire layer holds messages and the objects in them to :data:`MAX_MESSAGE_SIZE` and
:data:`MAX_REQUEST_OBJECT_SIZE`; writes hold stored documents to :data:`MAX_BSON_OBJECT_SIZE`;
change streams hold events to :data:`MAX_INTERNAL_OBJECT_SIZE`, or split those over
:data:`MAX_CHANGE_EVENT_SIZE`; ``hello`` advertises the message and document limits. A limit
changed here changes what is enforced and what is advertised together, so the two never disagree.
"""

from __future__ import annotations

# The largest document a collection may hold, in bytes of BSON (``maxBsonObjectSize``).
MAX_BSON_OBJECT_SIZE = 16 * 1024 * 1024
# The largest object the server builds (mongod's BSONObjMaxInternalSize): 16 KiB more than a
# document, room for what surrounds a largest document. A bigger one fails with
# BSONObjectTooLarge (10334), whether a request carries it or a change stream produces it.
MAX_INTERNAL_OBJECT_SIZE = MAX_BSON_OBJECT_SIZE + 16 * 1024
# The largest object a request may carry.
MAX_REQUEST_OBJECT_SIZE = MAX_INTERNAL_OBJECT_SIZE
# The largest change event ``$changeStreamSplitLargeEvent`` lets through whole; 8 KiB under the
# internal limit leaves room for the cursor reply around an event or a fragment.
MAX_CHANGE_EVENT_SIZE = MAX_INTERNAL_OBJECT_SIZE - 8 * 1024
# The largest message, header included (``maxMessageSizeBytes``); an OP_COMPRESSED message is held
# to it once inflated, too.
MAX_MESSAGE_SIZE = 48_000_000


def object_too_large_message(size: int, first_element: str) -> str:
    """mongod's BSONObjectTooLarge text for an object of ``size`` bytes, down to the "(16MB)" it
    prints for the 16 MiB + 16 KiB limit; ``first_element`` is the object's first element as mongod
    prints it (``name: value``)."""
    return (
        f"BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and "
        f"{MAX_INTERNAL_OBJECT_SIZE}({MAX_INTERNAL_OBJECT_SIZE >> 20}MB) First element: {first_element}"
    )
