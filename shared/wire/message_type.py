"""Permanent message-type ids. A retired id stays here as ``DEPRECATED_<n>`` and is never reused."""

from __future__ import annotations

from enum import IntEnum


class MessageType(IntEnum):
    HELLO = 1
    HELLO_REPLY = 2
    STORE = 3
    STORED = 4
    RELEASE = 5
    READ = 6
    READ_REPLY = 7
    GET_LOG_STATE = 8
    LOG_STATE = 9
    APPEND = 10
    APPENDED = 11
    GET_SEQUENCER_STATE = 12
    SEQUENCER_STATE = 13
    GOSSIP = 14
    SEAL = 15
    SEALED = 16
    GET_DIGEST = 17
    DIGEST = 18
    CLEAN = 19
    CLEANED = 20
    TRIM = 21
    TRIMMED = 22
    FIND_TIME = 23
    FOUND_TIME = 24
    GET_PRODUCER = 25
    PRODUCER_STATE = 26
    STORE_BATCH = 27
    STORED_BATCH = 28
    RELEASE_BATCH = 29
    AUTH = 30
    REBUILD_STORE = 31
    REBUILD_STORED = 32
    APPEND_MULTI = 33
    APPENDED_MULTI = 34


RETIRED: frozenset[MessageType] = frozenset()
