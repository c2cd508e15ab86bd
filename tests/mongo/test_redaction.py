"""redact_uri: no form of URI gets a secret past it, and the hosts stay readable; redact_uris does
the same for the URIs inside a message."""

from __future__ import annotations

import itertools
from urllib.parse import quote_plus

import pytest

from flowwarden.mongo.redaction import HIDDEN, UNPARSEABLE, quotes_secret, redact_uri, redact_uris
from flowwarden.runtime import connector

SECRET = "Hunter2xyz"

# (uri, the text that must not appear, the text that must stay readable)
FORMS = [
    ("mongodb://app:Hunter2xyz@db1:27017,db2/?replicaSet=rs0", SECRET, "db1:27017,db2"),
    ("mongodb+srv://app:Hunter2xyz@cluster0.ab1cd.mongodb.net/shop", SECRET, "cluster0.ab1cd.mongodb.net"),
    ("mongodb://app:Hunter2xyz@[::1]:27017/", SECRET, "[::1]:27017"),
    ("mongodb://app:Hunter2xyz@%2Ftmp%2Fmongodb-27017.sock/", SECRET, "%2Ftmp%2Fmongodb-27017.sock"),
    # Unescaped delimiters in the password, which urllib.parse.urlsplit misreads.
    ("mongodb://app:Hun#ter2xyz@db1/", "ter2xyz", "db1"),
    ("mongodb://app:Hun/ter2xyz@db1/shop", "ter2xyz", "db1"),
    ("mongodb://app:Hun?ter2xyz@db1/?replicaSet=rs0", "ter2xyz", "db1"),
    ("mongodb://app:27/ter2xyz@db1:27017/shop", "ter2xyz", "db1:27017"),
    ("mongodb://app:Hun@ter2xyz@db1,db2/?w=majority", "ter2xyz", "db1,db2"),
    ("mongodb://app:Hun:ter2xyz@db1/", "ter2xyz", "db1"),
    # PyMongo refuses this one; the readings that would find a password hide the hosts with it.
    ("mongodb://app:Hun/?#@ter2xyz@db1:27017/", "ter2xyz", "mongodb://app:"),
    (f"mongodb://app:{quote_plus('Hunter2xyz/?#@')}@db1/", SECRET, "db1"),
    # Hosts no reading accepts: the user information may end at any '@'.
    ("mongodb://db 1/?tlsCertificateKeyFilePassword=Hunter2xyz@laptop", SECRET, "db 1/?tls"),
    ("mongodb://app:a@b/Hunter2xyz@db 1/", SECRET, "mongodb://app:"),
    # Options that hold a secret.
    ("mongodb://db1/?tls=true&tlsCertificateKeyFilePassword=Hunter2xyz", SECRET, "db1"),
    ("mongodb://db1/?TLSCERTIFICATEKEYFILEPASSWORD=Hunter2xyz&replicaSet=rs0", SECRET, "replicaSet=rs0"),
    ("mongodb://db1/?tlsCertificateKeyFilePassword=Hun&ter2xyz&replicaSet=rs0", "ter2xyz", "replicaSet=rs0"),
    ("mongodb://db1/?tlsCertificateKeyFilePassword=Hun;ter2xyz=x", "ter2xyz", "db1"),
    ("mongodb://db1/?tlsCertificateKeyFilePassword=Hunter2xyz==", SECRET, "db1"),
    ("mongodb://db1/?proxyPassword=Hunter2xyz", SECRET, "db1"),
    ("mongodb://db1/?sslPEMKeyPassword=Hunter2xyz", SECRET, "db1"),
    ("mongodb://db1/?clientSecret=Hunter2xyz", SECRET, "db1"),
    ("mongodb://db1/?oidcAccessToken=Hunter2xyz", SECRET, "db1"),
    ("mongodb://db1/?tlsCertificateKeyFile%50assword=Hunter2xyz", SECRET, "db1"),
    # A misspelt option PyMongo does not know, and a bare value: either may be a password.
    ("mongodb://db1/?tlsCertificateKeyFilePasword=Hunter2xyz", SECRET, "db1"),
    ("mongodb://db1/?replicaSet=rs0&Hunter2xyz", SECRET, "replicaSet=rs0"),
    # Credentials inside authMechanismProperties.
    (
        "mongodb://AKIDEXAMPLE:Hunter2xyz@db1/?authMechanism=MONGODB-AWS"
        "&authMechanismProperties=AWS_SESSION_TOKEN:Sess1onTok3n",
        "Sess1onTok3n",
        "authMechanism=MONGODB-AWS",
    ),
    (
        "mongodb://db1/?authMechanismProperties=AWS_SESSION_TOKEN%3ASess1onTok3n%2Cmore",
        "Sess1onTok3n",
        "db1",
    ),
    (
        "mongodb://db1/?authMechanismProperties=SERVICE_NAME:mongodb,AWS_SESSION_TOKEN:Sess1onTok3n,x",
        "Sess1onTok3n",
        "SERVICE_NAME:mongodb",
    ),
    (
        "mongodb://db1/?authMechanismProperties=AWS_SESSION_TOKEN:Sess1on,Tok3n:part",
        "Tok3n",
        "db1",
    ),
]


@pytest.mark.parametrize(("uri", "secret", "readable"), FORMS)
def test_the_secret_is_hidden_and_the_hosts_stay_readable(uri, secret, readable):
    redacted = redact_uri(uri)
    assert secret not in redacted
    assert readable in redacted
    assert HIDDEN in redacted


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "mongodb://app:s3cr3t@db1:27017,db2/?replicaSet=rs0",
            "mongodb://app:***@db1:27017,db2/?replicaSet=rs0",
        ),
        ("mongodb://app:p#ss@db1/", "mongodb://app:***@db1/"),
        ("mongodb://app:p/ss@db1/shop?w=1", "mongodb://app:***@db1/shop?w=1"),
        (
            "mongodb://db1/?tlsCertificateKeyFilePassword=a&b&replicaSet=rs0",
            "mongodb://db1/?tlsCertificateKeyFilePassword=***&replicaSet=rs0",
        ),
        (
            "mongodb://db1/?authMechanismProperties=SERVICE_NAME:db,AWS_SESSION_TOKEN:t0k",
            "mongodb://db1/?authMechanismProperties=SERVICE_NAME:db,AWS_SESSION_TOKEN:***",
        ),
    ],
)
def test_only_the_secrets_change(uri, expected):
    assert redact_uri(uri) == expected


@pytest.mark.parametrize(
    "uri",
    [
        "mongodb://db1/?replicaSet=rs0",
        "mongodb://x509user@db1/?authMechanism=MONGODB-X509&tls=true",
        "mongodb+srv://cluster0.ab1cd.mongodb.net/shop?retryWrites=true&w=majority",
        "mongodb://127.0.0.1:27017/?replicaSet=rs0&directConnection=true&readPreferenceTags=dc:ny",
    ],
)
def test_a_uri_without_secrets_is_unchanged(uri):
    assert redact_uri(uri) == uri


def test_an_at_sign_in_an_option_hides_the_hosts_rather_than_guess():
    # "app:pw?appName=me" may be a password with an unescaped '?': the host cannot be told apart.
    for uri in ("mongodb://app:pw@db1/?appName=me@laptop", "mongodb://db1:27017/?appName=me@laptop"):
        redacted = redact_uri(uri)
        assert "pw" not in redacted and "27017" not in redacted and "appName=me" not in redacted


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "Hunter2xyz",
        "mongodb://",
        "mongodb://app:Hunter2xyz",
        "mongodb://app:Hunter2xyz@",
        "mongodb://app:Hunter2xyz@/tmp/mongodb.sock",
        "mongodb://app:Hunter2xyz@db 1/",
        "postgres://app:Hunter2xyz@db1/",
        "http://app:Hunter2xyz@[db1/",
        "mongodb://app:Hunter2xyz@\n",
        None,
        b"mongodb://app:Hunter2xyz@db1/",
        12,
    ],
)
def test_garbage_never_raises_and_never_returns_the_secret(garbage):
    redacted = redact_uri(garbage)
    assert isinstance(redacted, str)
    assert SECRET not in redacted
    assert redacted == UNPARSEABLE


@pytest.mark.parametrize(
    "delimiters", ["".join(p) for n in (1, 2, 3) for p in itertools.permutations("/?#@:&;=,%", n)]
)
def test_no_mix_of_delimiters_in_a_password_or_option_lets_it_through(delimiters):
    password = f"Hun{delimiters}ter2xyz"
    for uri in (
        f"mongodb://app:{password}@db1:27017/shop?replicaSet=rs0",
        f"mongodb://db1:27017/?tlsCertificateKeyFilePassword={password}&replicaSet=rs0",
        f"mongodb://db1:27017/?authMechanismProperties=AWS_SESSION_TOKEN:{password}",
    ):
        redacted = redact_uri(uri)
        assert "ter2xyz" not in redacted, uri


def test_the_connector_logs_through_this_redaction():
    assert connector.redact_uri is redact_uri


@pytest.mark.parametrize(
    ("message", "uri", "quotes"),
    [
        # PyMongo's own complaints: the database name it quotes holds the end of the password.
        ('Bad database name "45@db1/"', "mongodb://app:123/45@db1/", True),
        ("Port must be an integer between 0 and 65535: 'Hun'", "mongodb://app:Hun/ter2xyz@db1/", True),
        ("Username and password must be escaped", "mongodb://app:Hun@ter2xyz@db1/", False),
        ("Port contains non-digit characters", "mongodb://app:p/w@db1/", False),
        ("value 'Hunter2xyz' is invalid", "mongodb://db1/?tlsCertificateKeyFilePassword=Hunter2xyz", True),
        ("any message at all", "mongodb://db1/?replicaSet=rs0", False),
        ("any message at all", "not a URI", True),
        ("any message at all", None, True),
    ],
)
def test_quotes_secret_finds_any_piece_of_a_secret_in_a_message(message, uri, quotes):
    assert quotes_secret(message, uri) is quotes


# How a URI sits in an error message: bare, quoted, in brackets, at the end, before a newline.
AROUND = [
    "cannot write to {} now",
    "cannot write to '{}': connection refused",
    'MongoClient("{}") timed out',
    "store ({}), retried",
    "the store is at {}",
    "cannot write to {}\nTraceback (most recent call last):",
]


@pytest.mark.parametrize("message", AROUND)
@pytest.mark.parametrize(("uri", "secret", "readable"), FORMS)
def test_a_uri_inside_a_message_loses_its_secret_wherever_it_ends(message, uri, secret, readable):
    redacted = redact_uris(message.format(uri))
    assert secret not in redacted
    assert message.split("{}")[0] in redacted  # the text before the URI is kept


def test_the_text_around_a_plain_uri_stays_readable():
    message = "cannot write to 'mongodb://app:s3cr3t@db1:27017,db2/?replicaSet=rs0': timed out"
    assert redact_uris(message) == (
        "cannot write to 'mongodb://app:***@db1:27017,db2/?replicaSet=rs0': timed out"
    )
    assert redact_uris("two: mongodb://a:s3cr3t@db1 and MONGODB+SRV://b:t0ps3cr3t@c.example.net/x") == (
        "two: mongodb://a:***@db1 and MONGODB+SRV://b:***@c.example.net/x"
    )
    assert redact_uris("no URI in this message") == "no URI in this message"


@pytest.mark.parametrize(
    "message", ["mongodb://", "see mongodb://app:Hunter2xyz", "x mongodb://a:Hunter2xyz@" + "@" * 70]
)
def test_a_uri_no_reading_understands_is_replaced_up_to_the_next_one(message):
    redacted = redact_uris(message)
    assert SECRET not in redacted and UNPARSEABLE in redacted
