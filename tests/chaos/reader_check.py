"""After a chaos run settles: the client's direct reader (storage nodes over the node
protocol) and HTTP reads must show every log identically, records and gaps (HOLEs from
recovery, BRIDGEs, TRIMs), up to one release point."""

from __future__ import annotations

from typing import Any

from seqlog import Client, Gap, Record

Entry = tuple[str, int, int, bytes]
"""("RECORD", lsn, lsn, payload) or (gap type, lo, hi, b"")."""


def normalized(entries: list[Record | Gap], until: int) -> list[Entry]:
    """Entries up to ``until``, adjacent gaps of one type joined (pages and read rounds may
    split a gap differently)."""
    out: list[Entry] = []
    for entry in entries:
        if isinstance(entry, Record):
            if entry.lsn <= until:
                out.append(("RECORD", entry.lsn, entry.lsn, entry.payload))
            continue
        if entry.lo > until:
            continue
        gap: Entry = (entry.type, entry.lo, min(entry.hi, until), b"")
        if out and out[-1][0] == gap[0] and out[-1][2] + 1 == gap[1]:
            out[-1] = (gap[0], out[-1][1], gap[2], b"")
        else:
            out.append(gap)
    return out


async def _http_entries(client: Client, log_id: int, until: int) -> list[Record | Gap]:
    entries: list[Record | Gap] = []
    cursor = 1
    while cursor <= until:
        result = await client.read(log_id, cursor, limit=1000)
        entries.extend(result.entries())
        if result.next_lsn == cursor:
            break
        cursor = result.next_lsn
    return entries


async def compare_readers(urls: list[str], logs: tuple[int, ...], *, token: str | None = None
                          ) -> dict[str, Any]:
    """Figures: ``reader_mismatches`` (logs whose views differ; must be 0) and the gap types
    the direct reader delivered."""
    mismatches: list[int] = []
    gaps: dict[str, int] = {}
    async with Client(urls, timeout_ms=30_000, token=token) as client:
        for log_id in logs:
            until = (await client.tail(log_id)).release_lsn
            if until == 0:
                continue
            over_http = normalized(await _http_entries(client, log_id, until), until)
            async with await client.reader(log_id, until_lsn=until) as reader:
                direct = normalized([e async for e in reader], until)
            if direct != over_http:
                mismatches.append(log_id)
            for kind, _, _, _ in direct:
                if kind != "RECORD":
                    gaps[kind] = gaps.get(kind, 0) + 1
    return {"reader_mismatches": mismatches, "direct_reader_gaps": gaps}
