"""The benchmarks' minimal HTTP client (loadtests.raw_append_client) against the real HTTP edge
over a fake service: appends land, a 307 leads to the owner, error answers become LogError."""

from __future__ import annotations

import asyncio

import pytest
from http_fakes import ApiClient, FakeLogService, serve

from loadtests.bench_append import bench, build_parser
from loadtests.raw_append_client import RawAppender
from shared.status import LogError, Status
from shared.types import LogId


def _url(client: ApiClient) -> str:
    return f"http://127.0.0.1:{client.server.port}"


async def test_appends_land_on_one_kept_alive_connection(
        client: ApiClient, fake: FakeLogService) -> None:
    appender = RawAppender([_url(client)])
    try:
        await appender.prepare(7, [b"one"])
        for _ in range(3):
            await appender.append(7)
    finally:
        await appender.close()
    assert [(a.log_id, a.payloads) for a in fake.appends] == [(LogId(7), (b"one",))] * 4


async def test_batches_use_append_batch(client: ApiClient, fake: FakeLogService) -> None:
    appender = RawAppender([_url(client)])
    try:
        await appender.prepare(3, [b"a", b"b"])
        await appender.append(3)
    finally:
        await appender.close()
    assert [a.payloads for a in fake.appends] == [(b"a", b"b")] * 2


async def test_a_redirect_leads_to_the_owner(client: ApiClient, fake: FakeLogService) -> None:
    owner = FakeLogService()
    async with serve(owner) as owner_client:
        fake.redirect_to = f"127.0.0.1:{owner_client.server.port}"
        appender = RawAppender([_url(client)])
        try:
            await appender.prepare(5, [b"x"])
            await appender.append(5)
        finally:
            await appender.close()
    assert fake.appends == []
    assert len(owner.appends) == 2


async def test_error_answers_raise_their_status(client: ApiClient, fake: FakeLogService) -> None:
    appender = RawAppender([_url(client)])
    try:
        await appender.prepare(9, [b"x"])
        fake.fail_with = Status.SEQNOBUFS
        with pytest.raises(LogError) as raised:
            await appender.append(9)
        assert raised.value.status is Status.SEQNOBUFS
        # The connection is still usable after an error answer.
        fake.fail_with = None
        await appender.append(9)
    finally:
        await appender.close()
    assert len(fake.appends) == 2


async def test_a_closed_loop_sends_every_request_once(
        client: ApiClient, fake: FakeLogService) -> None:
    appender = RawAppender([_url(client)])
    try:
        await appender.prepare(4, [b"p"])
        await appender.prepare(6, [b"q", b"r"])
        pool = await appender.loop_connections([4, 6], 3)
        try:
            result = await pool.run(10)
            again = await pool.run(5)  # the same connections, kept alive
        finally:
            pool.close()
    finally:
        await appender.close()
    assert len(result.latencies_s) == 10 and not result.errors
    assert len(again.latencies_s) == 5 and not again.errors
    assert all(latency > 0 for latency in result.latencies_s)
    # prepare appended once per log; connections 0 and 2 write log 4, connection 1 log 6.
    landed = [(a.log_id, a.payloads) for a in fake.appends]
    assert len(landed) == 2 + 15
    assert set(landed) == {(LogId(4), (b"p",)), (LogId(6), (b"q", b"r"))}


async def test_a_closed_loop_counts_error_answers_by_status(
        client: ApiClient, fake: FakeLogService) -> None:
    appender = RawAppender([_url(client)])
    try:
        await appender.prepare(9, [b"x"])
        pool = await appender.loop_connections([9], 2)
        try:
            fake.fail_with = Status.SEQNOBUFS
            failed = await pool.run(4)
            fake.fail_with = None
            ok = await pool.run(3)  # error answers leave the connections usable
        finally:
            pool.close()
    finally:
        await appender.close()
    assert failed.latencies_s == [] and failed.errors == {"SEQNOBUFS": 4}
    assert len(ok.latencies_s) == 3 and not ok.errors


async def test_a_closed_loop_ends_when_its_connections_are_gone(
        client: ApiClient, fake: FakeLogService) -> None:
    appender = RawAppender([_url(client)])
    try:
        await appender.prepare(2, [b"x"])
        pool = await appender.loop_connections([2], 2)
        pool.close()
        result = await asyncio.wait_for(pool.run(5), timeout=10)
    finally:
        await appender.close()
    assert result.latencies_s == [] and sum(result.errors.values()) >= 1


async def test_bench_append_raw_counts_every_request_once(
        client: ApiClient, fake: FakeLogService) -> None:
    args = build_parser().parse_args(["--url", _url(client), "--client", "raw", "--inflight",
                                      "3", "--records", "12", "--warmup", "3"])
    args.loadavg_start = "0"
    out = await bench(args)
    assert (out["records"], out["requests"], out["errors"]) == (12, 12, {})
    # One append finds the owner, 3 warm up, 12 are measured.
    assert len(fake.appends) == 1 + 3 + 12
