"""What every ``flowwarden`` command shares: exit codes, the one-line error report, the parser that
keeps usage errors to one line, and the MongoDB client of the commands that do one thing and exit.

A command ends a failure it knows of by raising :class:`CommandError`; :func:`report` turns the
errors a command did not catch (MongoDB out of reach, credentials refused, a URI PyMongo cannot
parse, a :class:`~flowwarden.errors.FlowWardenError`) into the same one line. No line ever quotes a
URI's password: URIs go through :func:`flowwarden.mongo.redaction.redact_uri` first.
"""

from __future__ import annotations

import argparse
import enum
import re
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from flowwarden.errors import FlowWardenError
from flowwarden.mongo import codes
from flowwarden.mongo.redaction import quotes_secret, redact_uri

if TYPE_CHECKING:
    import pymongo


class ExitCode(enum.IntEnum):
    """The ``flowwarden`` command's exit status; :data:`EXIT_CODE_MEANINGS` says what each means."""

    CLEAN_STOP = 0
    FAILED = 1
    USAGE = 2
    MONGODB_UNAVAILABLE = 3
    INTERRUPTED = 130


EXIT_CODE_MEANINGS: dict[ExitCode, str] = {
    ExitCode.CLEAN_STOP: "clean stop",
    ExitCode.FAILED: "a stream failed or ended with an error (run), or a document could not be read "
    "(checkpoints list, status, dlq)",
    ExitCode.USAGE: "usage or configuration error: bad arguments, settings or config file, a handler "
    "that cannot be imported or created, an extra or Java a handler needs, an invalid token, JSON or "
    "URI, a database that does not exist, a port that cannot be used, a start-up error, a command "
    "MongoDB refused for a reason other than the credentials; for status: a stream whose position has "
    "left the oplog",
    ExitCode.MONGODB_UNAVAILABLE: "MongoDB could not be reached within server_selection_timeout, or "
    "refused the credentials (run at start-up, checkpoints, status, dlq, snapshot)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C) before the command finished (embedded-mongo exits 0: "
    "Ctrl-C is how it stops), or run stopped at once by a second SIGINT/SIGTERM",
}

# The commands say at once that MongoDB is out of reach (the server_selection_timeout setting, 10 s
# by default) rather than wait PyMongo's default 30 s. A serverSelectionTimeoutMS in the URI wins.
_URI_SETS_SERVER_SELECTION_TIMEOUT = re.compile(r"[?&;]serverSelectionTimeoutMS=", re.IGNORECASE)

# OperationFailure codes meaning the credentials were refused.
_CREDENTIALS_REFUSED = frozenset({codes.UNAUTHORIZED, codes.AUTHENTICATION_FAILED})


class CommandError(Exception):
    """Ends the command: ``message`` goes to stderr as one line, ``code`` is the exit status."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def say(message: str) -> None:
    """One ``flowwarden:`` line on stderr, whatever line breaks the message carried."""
    print(f"flowwarden: {' '.join(message.split())}", file=sys.stderr)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``flowwarden:`` line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"flowwarden: {message} (see `{self.prog} --help`)\n")


def port(text: str) -> int:
    """A TCP port to listen on: 1 to 65535, or 0 for any free one."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a TCP port; give a number from 1 to 65535, or 0 for a free one"
        )
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def mongo_client(
    uri: str, *, connect: bool = True, server_selection_timeout: float = 10.0
) -> pymongo.MongoClient[dict[str, Any]]:
    """A client for the commands' own reads; a URI PyMongo refuses ends the command (exit 2).
    It waits ``server_selection_timeout`` seconds for the deployment, unless the URI says."""
    import pymongo
    from pymongo.errors import ConfigurationError

    options: dict[str, Any] = {"tz_aware": True, "connect": connect, "appname": "flowwarden-cli"}
    if not _URI_SETS_SERVER_SELECTION_TIMEOUT.search(uri):
        options["serverSelectionTimeoutMS"] = round(server_selection_timeout * 1000)
    try:
        return pymongo.MongoClient(uri, **options)
    except (ConfigurationError, ValueError, TypeError) as error:
        raise uri_refused(uri, error) from None


def uri_refused(uri: str, error: Exception) -> CommandError:
    scheme, found, _ = uri.partition("://")
    if not found or scheme.lower() not in ("mongodb", "mongodb+srv"):
        # Nothing of the URI after its scheme is quoted: that is where a password would be.
        begins = f"it begins with {scheme + '://'!r}" if found and len(scheme) <= 20 else "it does not"
        return CommandError(
            ExitCode.USAGE,
            f"the MongoDB URI must begin with mongodb:// or mongodb+srv://; {begins}. Fix the URI",
        )
    # PyMongo quotes pieces of a URI it cannot parse, and a misplaced '@' or ':' can put a piece of
    # the password in them: such a message is withheld.
    message = str(error)
    if quotes_secret(message, uri):
        message = "its message is withheld because it may quote the password"
    return CommandError(
        ExitCode.USAGE,
        f"PyMongo refused the URI {redact_uri(uri)}: {type(error).__name__}: {message}. Fix the URI; "
        "a user name or password must be escaped with urllib.parse.quote_plus",
    )


def mongodb_unavailable(error: BaseException, uri: str) -> CommandError | None:
    """The exit-3 report if ``error`` (or what caused it) means MongoDB was out of reach or refused
    the credentials; None for any other error."""
    from pymongo.errors import ConnectionFailure, OperationFailure

    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ConnectionFailure):
            # A server selection timeout appends the whole topology description; the first part
            # (each host and why it could not be reached) is what the operator can act on.
            detail = str(cause).split(", Topology Description:")[0]
            detail = re.sub(r" \(configured timeouts: [^)]*\)", "", detail)
            return CommandError(
                ExitCode.MONGODB_UNAVAILABLE,
                f"cannot reach MongoDB at {redact_uri(uri)}: {type(cause).__name__}: {detail}. Check "
                "that the deployment is running and reachable from here, and that the URI names it",
            )
        if isinstance(cause, OperationFailure) and cause.code in _CREDENTIALS_REFUSED:
            return CommandError(
                ExitCode.MONGODB_UNAVAILABLE,
                f"MongoDB at {redact_uri(uri)} refused the credentials: {type(cause).__name__}: "
                f"{cause}. Check the user name, password and authSource in the URI, and that the "
                "user may read and write the collections the command uses",
            )
        cause = cause.__cause__
    return None


def report(error: Exception, uri: str | None) -> ExitCode:
    """Report an error a command did not handle itself, or raise it again if it is not one we know."""
    from pymongo.errors import ConfigurationError, PyMongoError

    unavailable = mongodb_unavailable(error, uri) if uri is not None else None
    if unavailable is not None:
        say(unavailable.message)
        return unavailable.code
    if isinstance(error, ConfigurationError) and uri is not None:
        refused = uri_refused(uri, error)
        say(refused.message)
        return refused.code
    if isinstance(error, FlowWardenError):
        say(str(error))
        return ExitCode.USAGE
    if isinstance(error, PyMongoError) and uri is not None:
        say(f"MongoDB at {redact_uri(uri)} refused the command: {type(error).__name__}: {error}")
        return ExitCode.USAGE
    raise error


def existing_database(client: pymongo.MongoClient[dict[str, Any]], name: str) -> Any:
    """``client[name]``, or a CommandError (exit 2) when the deployment has no such database: a
    misspelt ``--database`` would otherwise read as an empty one. Where the user may not list
    databases, the database is taken as given."""
    from pymongo.errors import OperationFailure

    try:
        reply = client.admin.command("listDatabases", nameOnly=True, authorizedDatabases=True)
        names = [str(database["name"]) for database in reply["databases"]]
    except OperationFailure:
        return client[name]
    if name not in names:
        near = [found for found in names if found not in ("admin", "config", "local")]
        listing = f"; it has: {', '.join(sorted(near))}" if near else "; it has none of its own yet"
        raise CommandError(
            ExitCode.USAGE,
            f"the deployment has no database {name!r}{listing}. Check --database (the database of "
            "the stream's collection, or the checkpoint database for cluster streams)",
        )
    return client[name]
