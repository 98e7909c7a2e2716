"""Permissions: what a principal may do, as grants of an action on a range of log ids.

A grant is written ``ACTION[:RANGE]``: ``append:1-100``, ``read:7``, ``trim:*``, ``admin``
(no range means every log). Actions are ``append``, ``read``, ``trim`` and ``admin``;
``admin`` implies the other three on its range, and cluster operations (the routes that name
no log) need ``admin`` on every log. This module only parses and answers; who holds which
grants is ``shared.security.auth``'s business.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from shared.types import LOG_ID_MAX

GRANTS_PER_PRINCIPAL_MAX = 1024
"""Most grants one principal (or one token) may carry: checks scan them."""
GRANT_TEXT_BYTES_MAX = 64


class Action(Enum):
    APPEND = "append"
    READ = "read"
    TRIM = "trim"
    ADMIN = "admin"


class GrantError(ValueError):
    """A grant that does not parse."""


@dataclass(frozen=True, slots=True)
class Grant:
    action: Action
    first_log_id: int
    last_log_id: int

    def __str__(self) -> str:
        if self.first_log_id == 1 and self.last_log_id == LOG_ID_MAX:
            return f"{self.action.value}:*"
        if self.first_log_id == self.last_log_id:
            return f"{self.action.value}:{self.first_log_id}"
        return f"{self.action.value}:{self.first_log_id}-{self.last_log_id}"


def _log_id(text: str, grant: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or not (
            1 <= int(text) <= LOG_ID_MAX):
        raise GrantError(f"grant {grant!r}: {text!r} is not a log id in 1..{LOG_ID_MAX}")
    return int(text)


def parse_grant(text: str) -> Grant:
    """``append:1-100`` -> ``Grant(APPEND, 1, 100)``; GrantError on anything else."""
    if not isinstance(text, str) or len(text) > GRANT_TEXT_BYTES_MAX:
        raise GrantError(f"a grant is a string of at most {GRANT_TEXT_BYTES_MAX} characters")
    name, sep, span = text.strip().partition(":")
    try:
        action = Action(name.lower())
    except ValueError:
        raise GrantError(f"grant {text!r}: action must be one of "
                         f"{', '.join(a.value for a in Action)}") from None
    if not sep or span == "*":
        return Grant(action, 1, LOG_ID_MAX)
    first, dash, last = span.partition("-")
    lo = _log_id(first, text)
    hi = _log_id(last, text) if dash else lo
    if hi < lo:
        raise GrantError(f"grant {text!r}: range ends before it starts")
    return Grant(action, lo, hi)


@dataclass(frozen=True, slots=True)
class Grants:
    """A set of grants, checked by scanning (a principal holds a handful)."""

    grants: tuple[Grant, ...]

    @classmethod
    def parse(cls, texts: Iterable[object]) -> Grants:
        items = list(texts)
        if len(items) > GRANTS_PER_PRINCIPAL_MAX:
            raise GrantError(f"more than {GRANTS_PER_PRINCIPAL_MAX} grants")
        return cls(tuple(parse_grant(t) for t in items))  # type: ignore[arg-type]

    def allows(self, action: Action, log_id: int) -> bool:
        for grant in self.grants:
            if (grant.action is action or grant.action is Action.ADMIN) and (
                    grant.first_log_id <= log_id <= grant.last_log_id):
                return True
        return False

    def allows_cluster(self) -> bool:
        """Cluster operations: ``admin`` on every log."""
        return any(g.action is Action.ADMIN and g.first_log_id == 1
                   and g.last_log_id == LOG_ID_MAX for g in self.grants)

    def texts(self) -> list[str]:
        return [str(g) for g in self.grants]
