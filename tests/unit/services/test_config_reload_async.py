"""A node's SIGHUP reload reads its config file off the event loop (aiofiles): with asyncio's
debug mode watching for slow callbacks, a reload whose file takes 300 ms to arrive (a FIFO
whose writer is slow, standing in for a slow disk or network file system) blocks no callback,
while the same read done on the loop is reported, which shows the check can fail. SIGHUPs
during a reload are folded into one more reload."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from test_membership import BASE, node

from services.membership import Membership
from services.node import ConfigReloads
from shared.config import ProcessConfig, to_dict
from shared.types import NodeId

SLOW_CALLBACK_S = 0.1
WRITER_DELAY_S = 0.3


def _config(tmp_path: Path) -> tuple[ProcessConfig, str]:
    config = ProcessConfig(node_id=NodeId("st1"), cluster=BASE, data_dir=str(tmp_path))
    grown = replace(BASE, nodes=(*BASE.nodes, node("st3", port=9006)))
    return config, json.dumps(to_dict(replace(config, cluster=grown)))


def _slow_fifo(tmp_path: Path, text: str) -> tuple[str, threading.Thread]:
    """A FIFO whose writer opens it only after WRITER_DELAY_S: reading it blocks that long."""
    path = tmp_path / "config.fifo"
    os.mkfifo(path)

    def write() -> None:
        time.sleep(WRITER_DELAY_S)
        with open(path, "w", encoding="utf-8") as fifo:
            fifo.write(text)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return str(path), writer


def _slow_callbacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "asyncio" and "took" in r.getMessage()]


def _debug_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = SLOW_CALLBACK_S
    return loop


def test_reload_never_blocks_the_loop(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="asyncio")
    config, text = _config(tmp_path)
    membership = Membership(config)
    path, writer = _slow_fifo(tmp_path, text)
    loop = _debug_loop()
    try:
        change = loop.run_until_complete(membership.reload_async(path))
    finally:
        loop.close()
    writer.join(5)
    assert change is not None and [n.node_id for n in change.added] == ["st3"]
    assert _slow_callbacks(caplog) == []


def test_the_check_sees_a_read_on_the_loop(tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="asyncio")
    config, text = _config(tmp_path)
    membership = Membership(config)
    path, writer = _slow_fifo(tmp_path, text)

    async def blocking() -> None:
        membership.reload(path)

    loop = _debug_loop()
    try:
        loop.run_until_complete(blocking())
    finally:
        loop.close()
    writer.join(5)
    assert _slow_callbacks(caplog), "a blocking read should have been reported"


async def test_sighups_during_a_reload_fold_into_one_more(tmp_path: Path) -> None:
    config, text = _config(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(text)
    membership = Membership(config)
    reads = 0
    original = membership.reload_async

    async def counted(file: str) -> object:
        nonlocal reads
        reads += 1
        await asyncio.sleep(0.05)
        return await original(file)

    membership.reload_async = counted  # type: ignore[method-assign,assignment]
    reloads = ConfigReloads(membership, str(path))
    for _ in range(5):
        reloads.request()
    assert reloads.task is not None
    await asyncio.wait_for(reloads.task, 5)
    assert reads == 2
    assert [n.node_id for n in membership.cluster.nodes][-1] == "st3"
