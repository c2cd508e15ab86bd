"""redact_uri character for character at the edges of its reading rules: where the password ends,
where the host list and the options begin, how option and property values are cut, and the
at-sign limit. Each line is what redact_uri must show of that URI, no more and no less."""

from __future__ import annotations

import pytest

from flowwarden.mongo.redaction import UNPARSEABLE, quotes_secret, redact_uri

EXACT = [
    # The password ends at the last '@' and starts after the FIRST ':' of the user information.
    ("mongodb://app:Hun:ter2xyz@db1/", "mongodb://app:***@db1/"),
    # A '?' inside the password does not start the options of the reading that ends it at '@'.
    ("mongodb://a:b?w=1@db1/?Hunter2xyz&x=1", "mongodb://a:***@db1/?***"),
    # The options start at the first '?' after the hosts, not the last one.
    ("mongodb://db1/?proxyPassword=Hunter2xyz&appName=a?b", "mongodb://db1/?proxyPassword=***&appName=a?b"),
    # With no '/', the host list ends at the first '?'.
    ("mongodb://db1?replicaSet=rs0?x", "mongodb://db1?replicaSet=rs0?x"),
    # An option value is hidden from right after its '='; an empty one hides nothing.
    ("mongodb://db1/?tlsCertificateKeyFilePasword=Hunter2xyz", "mongodb://db1/?tlsCertificateKeyFilePasword=***"),
    ("mongodb://db1/?replicaSet=rs0&foo=", "mongodb://db1/?replicaSet=rs0&foo="),
    # A bare value is hidden whatever follows it; its '&' stays when a known option follows.
    ("mongodb://db1/?Hunter2xyz&w=1", "mongodb://db1/?***&w=1"),
    ("mongodb://db1/?w=1&Hunter2xyz", "mongodb://db1/?w=1&***"),
    # After a hidden value, pieces that are no known option are more of it, up to a known one.
    ("mongodb://db1/?foo=a&b&w=1", "mongodb://db1/?foo=***&w=1"),
    # An empty piece is no value: it does not start hiding.
    ("mongodb://db1/?w=1&&foo=bar", "mongodb://db1/?w=1&&foo=***"),
    # authMechanismProperties: each property's value, within the option only.
    (
        "mongodb://db1/?authMechanismProperties=AWS_SESSION_TOKEN:t0k",
        "mongodb://db1/?authMechanismProperties=AWS_SESSION_TOKEN:***",
    ),
    (
        "mongodb://db1/?authMechanismProperties=foo,SERVICE_NAME:db",
        "mongodb://db1/?authMechanismProperties=***,SERVICE_NAME:db",
    ),
    (
        "mongodb://db1/?authMechanismProperties=AWS_SESSION_TOKEN:t0k&appName=a,b",
        "mongodb://db1/?authMechanismProperties=AWS_SESSION_TOKEN:***&appName=a,b",
    ),
    (
        "mongodb://db1/?authMechanismProperties=SERVICE_NAME:db&x",
        "mongodb://db1/?authMechanismProperties=SERVICE_NAME:db&***",
    ),
]


@pytest.mark.parametrize(("uri", "shown"), EXACT)
def test_exactly_what_is_shown(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


def test_a_password_with_up_to_64_at_signs_in_the_uri_is_still_read() -> None:
    assert redact_uri("mongodb://app:" + "p@" * 64 + "db1/?w=1") == "mongodb://app:***@db1/?w=1"
    assert redact_uri("mongodb://app:" + "p@" * 65 + "db1/?w=1") == UNPARSEABLE


def test_a_message_quoting_three_characters_of_a_secret_may_hold_it() -> None:
    uri = "mongodb://app:Hunter2xyz@db1/"
    assert quotes_secret("bad password: 'Hun'", uri) is True
    assert quotes_secret("bad port: 'db1'", uri) is False


def test_a_message_that_is_not_text_may_hold_a_secret() -> None:
    assert quotes_secret(b"Hunter2xyz", "mongodb://app:Hunter2xyz@db1/") is True  # type: ignore[arg-type]
