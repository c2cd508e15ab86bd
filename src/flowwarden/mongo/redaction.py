"""Redaction of MongoDB URIs: the one place that decides what of a URI may be shown.

:func:`redact_uri` is what flowwarden prints or logs whenever a URI has to appear. It reads the URI
the way PyMongo's parser does (``pymongo/uri_parser_shared.py``): the scheme, then the host list,
which ends at the first ``/`` or ``?``; the user information before it ends at its LAST ``@``; the
options follow the first ``?``. From that reading it hides the password, the value of every option
whose name speaks of a password, secret, token or credential, the value of every option PyMongo
does not know (it may be a misspelt password option), and the credentials inside
``authMechanismProperties``.

It fails closed and never raises. A password with an unescaped ``/``, ``?`` or ``@`` makes PyMongo's
reading wrong, and an ``@`` inside an option value looks just like the end of such a password, so
the URI is read once for every place the user information could end, and a character is shown only
if no reading puts it in a secret. A URI no reading can make sense of becomes a placeholder. Hiding
too much is allowed here; showing a secret is not.

:func:`redact_uris` does the same to every URI inside a message (an error's text, say). Where such
a URI ends is one more guess: at any whitespace or closing quote, or at the end of the message, and
a character is shown only if no choice of end puts it in a secret.

:func:`quotes_secret` answers, from the same readings, whether a message (PyMongo's complaint about
a URI it cannot parse quotes pieces of it) may hold one of the URI's secrets.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import unquote_plus

from pymongo.common import URI_OPTIONS_VALIDATOR_MAP

__all__ = ["HIDDEN", "UNPARSEABLE", "quotes_secret", "redact_uri", "redact_uris"]

HIDDEN = "***"
"""What stands in place of each hidden stretch of a URI."""

UNPARSEABLE = "<unparseable MongoDB URI>"
"""What stands in place of a URI whose secrets cannot be located."""

_SCHEMES = ("mongodb://", "mongodb+srv://")

# Any option whose name holds one of these words carries a secret, whether or not PyMongo knows it.
_SECRET_WORDS = ("pass", "pwd", "secret", "token", "credential")

# Names as PyMongo compares them: lower case. Their values are shown unless they hold a secret.
_KNOWN_OPTIONS = frozenset(name.lower() for name in URI_OPTIONS_VALIDATOR_MAP)

_MECHANISM_PROPERTIES = "authmechanismproperties"

# The properties PyMongo itself shows in a client's repr (its _SAFE_AUTH_MECHANISM_PROPS_FOR_REPR):
# names of services, hosts and audiences. Every other property (AWS_SESSION_TOKEN, ...) is hidden.
_PUBLIC_MECHANISM_PROPERTIES = frozenset(
    {
        "ALLOWED_HOSTS",
        "CANONICALIZE_HOST_NAME",
        "ENVIRONMENT",
        "SERVICE_HOST",
        "SERVICE_NAME",
        "SERVICE_REALM",
        "TOKEN_RESOURCE",
    }
)

# One entry of a host list: a name, an address, a percent-encoded Unix socket path or a bracketed
# IPv6 literal, with an optional numeric port. A URI in which no reading finds such a list (a
# password without its host, a space in a name) is not shown at all.
_HOST = r"(?:\[[^\s\[\]/?@]+\]|[^\s\[\]/?@:,]+)(?::[0-9]{1,5})?"
_HOST_LIST = re.compile(rf"{_HOST}(?:,{_HOST})*")

# PyMongo splits the options on '&' or ';', and authMechanismProperties (after decoding them) on
# ',' and ':'; the escaped forms are matched too so that the raw text splits exactly where the
# decoded text does.
_OPTION_SEPARATOR = re.compile(r"[&;]")
_PROPERTY_SEPARATOR = re.compile(r",|%2[cC]")
_PROPERTY_COLON = re.compile(r":|%3[aA]")

# Where PyMongo may cut a URI, quoting only the piece between two of them in a message.
_URI_DELIMITERS = re.compile(r"[/?#@:,&;=]")

# Where a URI inside a message begins, and where it may end.
_URI_START = re.compile(r"mongodb(?:\+srv)?://", re.IGNORECASE)
_URI_END = re.compile(r"[\s'\"`<>()\[\]{}]")

# Each '@' is one more reading of the URI; past this many the work grows quadratically, and a URI
# with so many is not one anybody needs to read in a log.
_MAX_AT_SIGNS = 64


def redact_uri(uri: str) -> str:
    """``uri`` with its password and secret option values replaced by ``***``, for logs and errors.

    Never raises and never returns a secret: a URI it cannot read becomes ``<unparseable MongoDB
    URI>``. The hosts, the database and the other options stay readable unless the URI is
    ambiguous (an unescaped ``@`` after the hosts), in which case more is hidden.
    """
    try:
        return _redact(uri)
    except Exception:
        # This runs while reporting another problem (a failed start, a log line): whatever the
        # input, it must neither raise in its turn nor fall back to printing the URI as given.
        return UNPARSEABLE


def redact_uris(text: str) -> str:
    """``text`` with every MongoDB URI in it redacted as :func:`redact_uri` does; never raises.

    A URI runs from its scheme up to some whitespace, quote or bracket, or up to the next URI or
    the end of the text: every one of these ends is read, and what any reading hides is hidden.
    A URI that no reading makes sense of becomes ``<unparseable MongoDB URI>`` up to the next URI.
    """
    try:
        starts = [match.start() for match in _URI_START.finditer(text)]
        if not starts:
            return text
        out = [text[: starts[0]]]
        for start, end in zip(starts, [*starts[1:], len(text)], strict=True):
            out.append(_redact_in_text(text[start:end]))
        return "".join(out)
    except Exception:
        return UNPARSEABLE  # as in redact_uri: reporting must neither raise nor leak


def _redact_in_text(piece: str) -> str:
    """A URI and the text after it, up to the next URI."""
    hidden = bytearray(len(piece))
    readable = False
    for end in [*(match.start() for match in _URI_END.finditer(piece)), len(piece)]:
        found = _mark(piece[:end], hidden)
        if found is None:
            return UNPARSEABLE
        readable |= found
    return _render(piece, hidden) if readable else UNPARSEABLE


def quotes_secret(text: str, uri: str) -> bool:
    """Whether ``text`` (an error message about ``uri``, say) may quote a secret of ``uri``.

    True when ``uri`` cannot be read, or when any three characters in a row of a hidden part of
    ``uri`` appear in ``text``. PyMongo cuts a URI at its delimiters, so each stretch of a secret
    between delimiters is looked for too, however short (all of it if shorter than three).
    Never raises.
    """
    try:
        hidden = _hidden(uri)
        if hidden is None:
            return True
        for run in re.finditer(rb"\x01+", hidden):
            for fragment in _URI_DELIMITERS.split(uri[run.start() : run.end()]):
                width = min(3, len(fragment))
                if width and any(fragment[i : i + width] in text for i in range(len(fragment) - width + 1)):
                    return True
        return False
    except Exception:
        return True  # as in redact_uri: when in doubt, the text may hold a secret


def _redact(uri: str) -> str:
    hidden = _hidden(uri)
    return UNPARSEABLE if hidden is None else _render(uri, hidden)


def _hidden(uri: str) -> bytearray | None:
    """One byte per character of ``uri``, 1 where a secret may be; None if the URI cannot be read."""
    if not isinstance(uri, str):
        return None
    hidden = bytearray(len(uri))
    return hidden if _mark(uri, hidden) else None


def _mark(uri: str, hidden: bytearray) -> bool | None:
    """Set to 1 in ``hidden`` (as long as ``uri`` at least) each character that any reading of
    ``uri`` puts in a secret; True if a reading finds a host list, None if none can be tried."""
    start = next((len(s) for s in _SCHEMES if uri[: len(s)].lower() == s), None)
    if start is None:
        return None
    at_signs = [i for i in range(start, len(uri)) if uri[i] == "@"]
    if len(at_signs) > _MAX_AT_SIGNS:
        return None
    readable = False
    # PyMongo's reading is among these: without user information, or with it ending at the last
    # '@' before the host list. The others are what a password with '/', '?' or '@' would mean.
    for userinfo_end in [None, *at_signs]:
        readable |= _read(uri, start, userinfo_end, hidden)
    return readable


def _read(uri: str, start: int, userinfo_end: int | None, hidden: bytearray) -> bool:
    """Mark in ``hidden`` the secrets of one reading; True if its host list looks like one."""
    if userinfo_end is None:
        hosts_start = start
    else:
        colon = uri.find(":", start, userinfo_end)
        if colon >= 0:
            _hide(hidden, colon + 1, userinfo_end)
        hosts_start = userinfo_end + 1
    ends = [i for i in (uri.find("/", hosts_start), uri.find("?", hosts_start)) if i >= 0]
    hosts_end = min(ends, default=len(uri))
    question = uri.find("?", hosts_start)
    if question >= 0:
        _hide_options(uri, question + 1, hidden)
    return _HOST_LIST.fullmatch(uri, hosts_start, hosts_end) is not None


def _hide_options(uri: str, start: int, hidden: bytearray) -> None:
    """Hide secret option values, and anything that may be part of one.

    An unescaped '&' or ';' inside a secret value splits it like an option separator, so after a
    hidden value every following piece that is not a known option is taken as more of that value.
    """
    hiding = False
    for begin, end, separator in _pieces(_OPTION_SEPARATOR, uri, start, len(uri)):
        equals = uri.find("=", begin, end)
        key = unquote_plus(uri[begin : equals if equals >= 0 else end]).strip().lower()
        if equals >= 0 and any(word in key for word in _SECRET_WORDS):
            _hide(hidden, equals + 1, end)
            hiding = True
        elif equals < 0 or key not in _KNOWN_OPTIONS:
            if hiding:
                _hide(hidden, separator, end)  # more of the hidden value
            elif begin < end:
                _hide(hidden, equals + 1 if equals >= 0 else begin, end)
                hiding = True
        elif key == _MECHANISM_PROPERTIES:
            _hide_mechanism_credentials(uri, equals + 1, end, hidden)
            hiding = False
        else:
            hiding = False


def _hide_mechanism_credentials(uri: str, start: int, end: int, hidden: bytearray) -> None:
    """In ``KEY:value,...``, hide the value of every property PyMongo would not show itself.

    After a hidden value, pieces that are not a public property are taken as more of it.
    """
    hiding = False
    for begin, stop, separator in _pieces(_PROPERTY_SEPARATOR, uri, start, end):
        colon = _PROPERTY_COLON.search(uri, begin, stop)
        name = unquote_plus(uri[begin : colon.start() if colon else stop]).strip().upper()
        if colon and name in _PUBLIC_MECHANISM_PROPERTIES:
            hiding = False
        elif hiding:
            _hide(hidden, separator, stop)
        else:
            _hide(hidden, colon.end() if colon else begin, stop)
            hiding = True


def _pieces(separator: re.Pattern[str], text: str, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """``(begin, end, separator_begin)`` of each piece of ``text[start:end]`` between separators."""
    begin = separator_begin = start
    for match in separator.finditer(text, start, end):
        yield begin, match.start(), separator_begin
        begin, separator_begin = match.end(), match.start()
    yield begin, end, separator_begin


def _hide(hidden: bytearray, start: int, end: int) -> None:
    hidden[start:end] = b"\x01" * max(0, end - start)


def _render(uri: str, hidden: bytearray) -> str:
    """The URI with each run of hidden characters replaced by one ``***``."""
    out: list[str] = []
    shown_from = 0
    for run in re.finditer(rb"\x01+", hidden):
        out.append(uri[shown_from : run.start()])
        out.append(HIDDEN)
        shown_from = run.end()
    out.append(uri[shown_from:])
    return "".join(out)
