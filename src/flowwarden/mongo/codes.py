"""The MongoDB server error codes flowwarden acts on, each named once.

The rule this module keeps: no other module compares an error with a bare code number; it names
the code from here (``error.code == CHANGE_STREAM_HISTORY_LOST``), so a reader sees which error is
meant and a grep finds every place that acts on it. What each code means for a retry is
:mod:`flowwarden.mongo.failures`' decision, not this table's. Names follow the server's
``codeName`` where it has one.
"""

from __future__ import annotations

# -- the deployment was briefly out of reach ------------------------------------------------------
HOST_UNREACHABLE = 6  # HostUnreachable
HOST_NOT_FOUND = 7  # HostNotFound
CURSOR_NOT_FOUND = 43  # CursorNotFound: the cursor timed out on the server (or was killed)
NETWORK_TIMEOUT = 89  # NetworkTimeout
SHUTDOWN_IN_PROGRESS = 91  # ShutdownInProgress: the member is shutting down
READ_CONCERN_MAJORITY_NOT_AVAILABLE_YET = 134  # ReadConcernMajorityNotAvailableYet: a fresh member
PRIMARY_STEPPED_DOWN = 189  # PrimarySteppedDown: an election is under way
EXCEEDED_TIME_LIMIT = 262  # ExceededTimeLimit: an operation ran out of its server-side time
SOCKET_EXCEPTION = 9001  # SocketException
LEGACY_NOT_PRIMARY = 10058  # LegacyNotPrimary: the pre-4.2 form of NotWritablePrimary
NOT_WRITABLE_PRIMARY = 10107  # NotWritablePrimary: the member is no longer the primary
INTERRUPTED_AT_SHUTDOWN = 11600  # InterruptedAtShutdown
INTERRUPTED_DUE_TO_REPL_STATE_CHANGE = 11602  # InterruptedDueToReplStateChange: a step-down
NOT_PRIMARY_NO_SECONDARY_OK = 13435  # NotPrimaryNoSecondaryOk: a read sent to a secondary
NOT_PRIMARY_OR_SECONDARY = 13436  # NotPrimaryOrSecondary: the member is starting up or recovering

# -- only an operator can fix it ------------------------------------------------------------------
FAILED_TO_PARSE = 9  # FailedToParse: e.g. a resume token whose _data is not hex
USER_NOT_FOUND = 11  # UserNotFound
UNAUTHORIZED = 13  # Unauthorized: the user lacks a privilege the command needs
AUTHENTICATION_FAILED = 18  # AuthenticationFailed: the credentials were refused
ILLEGAL_OPERATION = 20  # IllegalOperation: e.g. change streams on a deployment that has none
COMMAND_NOT_FOUND = 59  # CommandNotFound
INVALID_OPTIONS = 72  # InvalidOptions: e.g. a read concern change streams refuse
INVALID_NAMESPACE = 73  # InvalidNamespace
INVALID_PIPELINE_OPERATOR = 168  # InvalidPipelineOperator
INVALID_RESUME_TOKEN = 260  # InvalidResumeToken: e.g. resumeAfter an invalidate event's token
CHANGE_STREAM_FATAL_ERROR = 280  # ChangeStreamFatalError: e.g. the resume token was not found
CHANGE_STREAM_HISTORY_LOST = 286  # ChangeStreamHistoryLost: the resume point left the oplog
ATLAS_ERROR = 8000  # AtlasError: Atlas refused the credentials or the operation
BSON_OBJECT_TOO_LARGE = 10334  # BSONObjectTooLarge: e.g. a change event over 16 MB, not split
SPLIT_EVENT_FIELD_TOO_LARGE = 7182500  # one field of an event too large for any split fragment
UNRECOGNIZED_PIPELINE_STAGE = 40324  # a pipeline stage name the server does not know
UNKNOWN_FIELD = 40415  # an unknown field in a command or a stage
CHANGE_STREAM_NEEDS_REPLICATION = 40573  # $changeStream needs a replica set or a sharded cluster
CHANGE_STREAM_NOT_FIRST_STAGE = 40602  # $changeStream must be a pipeline's first stage
MALFORMED_RESUME_TOKEN = 40649  # a resume token that is too short or of no known format

__all__ = [
    "ATLAS_ERROR",
    "AUTHENTICATION_FAILED",
    "BSON_OBJECT_TOO_LARGE",
    "CHANGE_STREAM_FATAL_ERROR",
    "CHANGE_STREAM_HISTORY_LOST",
    "CHANGE_STREAM_NEEDS_REPLICATION",
    "CHANGE_STREAM_NOT_FIRST_STAGE",
    "COMMAND_NOT_FOUND",
    "CURSOR_NOT_FOUND",
    "EXCEEDED_TIME_LIMIT",
    "FAILED_TO_PARSE",
    "HOST_NOT_FOUND",
    "HOST_UNREACHABLE",
    "ILLEGAL_OPERATION",
    "INTERRUPTED_AT_SHUTDOWN",
    "INTERRUPTED_DUE_TO_REPL_STATE_CHANGE",
    "INVALID_NAMESPACE",
    "INVALID_OPTIONS",
    "INVALID_PIPELINE_OPERATOR",
    "INVALID_RESUME_TOKEN",
    "LEGACY_NOT_PRIMARY",
    "MALFORMED_RESUME_TOKEN",
    "NETWORK_TIMEOUT",
    "NOT_PRIMARY_NO_SECONDARY_OK",
    "NOT_PRIMARY_OR_SECONDARY",
    "NOT_WRITABLE_PRIMARY",
    "PRIMARY_STEPPED_DOWN",
    "READ_CONCERN_MAJORITY_NOT_AVAILABLE_YET",
    "SHUTDOWN_IN_PROGRESS",
    "SOCKET_EXCEPTION",
    "SPLIT_EVENT_FIELD_TOO_LARGE",
    "UNAUTHORIZED",
    "UNKNOWN_FIELD",
    "UNRECOGNIZED_PIPELINE_STAGE",
    "USER_NOT_FOUND",
]
