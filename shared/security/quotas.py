"""Per-principal rate limits: token buckets over appended records and bytes.

A bucket holds up to one second of its rate (``burst_s``) and refills continuously; an
append is admitted only if every bucket of its principal has room for all of it, so a refused
append takes nothing from any bucket and nothing is written. The answer to a refused append is
how long until it would fit (``Retry-After``). Checked once per append request or batch,
never per record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BURST_S = 1.0
"""A bucket's depth in seconds of its rate: a principal idle for a while may send this much
at once."""


@dataclass(slots=True)
class TokenBucket:
    rate_per_s: float
    capacity: float
    level: float
    updated_s: float

    @classmethod
    def full(cls, rate_per_s: float, now_s: float, burst_s: float = BURST_S) -> TokenBucket:
        capacity = max(rate_per_s * burst_s, 1.0)
        return cls(rate_per_s=rate_per_s, capacity=capacity, level=capacity, updated_s=now_s)

    def refill(self, now_s: float) -> None:
        if now_s > self.updated_s:
            self.level = min(self.capacity,
                             self.level + (now_s - self.updated_s) * self.rate_per_s)
            self.updated_s = now_s

    def wait_s(self, amount: float) -> float:
        """How long until ``amount`` fits (0: now); an amount over the capacity waits until
        the bucket is full (it is then admitted and drives the level negative)."""
        need = min(amount, self.capacity) - self.level
        return 0.0 if need <= 0 else need / self.rate_per_s


class AppendQuota:
    """The records/s and bytes/s buckets of one principal (a rate of 0: unlimited)."""

    __slots__ = ("bytes", "records")

    def __init__(self, records_per_s: float, bytes_per_s: float, now_s: float) -> None:
        self.records = TokenBucket.full(records_per_s, now_s) if records_per_s > 0 else None
        self.bytes = TokenBucket.full(bytes_per_s, now_s) if bytes_per_s > 0 else None

    def rates(self) -> tuple[float, float]:
        return (self.records.rate_per_s if self.records else 0.0,
                self.bytes.rate_per_s if self.bytes else 0.0)

    def admit(self, records: int, size_bytes: int, now_s: float) -> float:
        """0.0 and the append is charged, or the seconds to wait and nothing is charged."""
        wait_s = 0.0
        for bucket, amount in ((self.records, records), (self.bytes, size_bytes)):
            if bucket is not None:
                bucket.refill(now_s)
                wait_s = max(wait_s, bucket.wait_s(amount))
        if wait_s > 0:
            return wait_s
        if self.records is not None:
            self.records.level -= records
        if self.bytes is not None:
            self.bytes.level -= size_bytes
        return 0.0


def retry_after_header_s(wait_s: float) -> int:
    """``Retry-After`` is whole seconds: round up, at least 1."""
    return max(1, math.ceil(wait_s))
