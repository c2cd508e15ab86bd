"""What MongoDB accepts as database and collection names, checked when options are validated."""

from __future__ import annotations

from flowwarden.config.problems import OptionProblem

# The server refuses change streams on its internal databases.
_INTERNAL_DATABASES = frozenset({"admin", "local", "config"})
_DATABASE_FORBIDDEN_CHARS = '/\\. "$*<>:|?\x00'
_MAX_DATABASE_NAME_BYTES = 63


def check_database_name(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    allowed = (
        'a non-empty database name of at most 63 bytes without /\\. "$*<>:|? and not admin, local or config'
    )
    if not value:
        raise OptionProblem("the database name is empty", option=option, value=value, allowed=allowed)
    bad = sorted({char for char in value if char in _DATABASE_FORBIDDEN_CHARS})
    if bad:
        raise OptionProblem(
            f"the database name {value!r} contains {''.join(bad)!r}",
            option=option,
            value=value,
            allowed=allowed,
        )
    if len(value.encode()) > _MAX_DATABASE_NAME_BYTES:
        raise OptionProblem(
            f"the database name {value!r} is longer than 63 bytes",
            option=option,
            value=value,
            allowed=allowed,
        )
    if value in _INTERNAL_DATABASES:
        raise OptionProblem(
            f"MongoDB does not open change streams on its internal database {value!r}",
            option=option,
            value=value,
            allowed=allowed,
        )
    return value


def check_collection_name(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    allowed = "a non-empty collection name without '$' or NUL that does not start with 'system.'"
    if not value:
        raise OptionProblem("the collection name is empty", option=option, value=value, allowed=allowed)
    if "$" in value or "\x00" in value:
        raise OptionProblem(
            f"the collection name {value!r} contains '$' or NUL", option=option, value=value, allowed=allowed
        )
    if value.startswith("system."):
        raise OptionProblem(
            f"{value!r} is a system collection; MongoDB does not open change streams on those",
            option=option,
            value=value,
            allowed=allowed,
        )
    return value
