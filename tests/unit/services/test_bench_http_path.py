"""The in-process HTTP append path benchmark (loadtests.bench_http_path) answers every append
it sends, through the real edge, front end and sequencer runtime."""

from __future__ import annotations

import argparse

from loadtests.bench_http_path import bench


async def test_every_append_is_answered_once() -> None:
    result = await bench(argparse.Namespace(connections=4, rounds=3, size=100, logs=1))
    assert (result["appends"], result["answered"]) == (12, 12)


async def test_every_append_to_many_logs_is_answered_once() -> None:
    result = await bench(argparse.Namespace(connections=8, rounds=3, size=100, logs=20))
    assert (result["appends"], result["answered"]) == (24, 24)
