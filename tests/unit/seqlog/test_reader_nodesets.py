"""parse_nodesets: a member without an address still counts in the nodeset (the f-majority a
reader needs), and a malformed answer is BADMSG, never an exception from deep inside."""

from __future__ import annotations

from typing import Any

import pytest

from seqlog.reader import parse_nodesets
from shared.status import LogError, Status


def answer(nodes: list[dict[str, str]]) -> dict[str, Any]:
    return {"cluster_fingerprint": "fp", "protocol_version": 1,
            "nodesets": [{"first_epoch": 1, "last_epoch": 4294967294,
                          "replication_factor": 3, "nodes": nodes}]}


def test_member_without_an_address_counts_in_the_nodeset() -> None:
    spans, addresses, fingerprint = parse_nodesets(answer([
        {"node_id": f"st{i}", "data": f"127.0.0.1:{7000 + i}"} for i in range(1, 5)
    ] + [{"node_id": "st5", "data": ""}]))
    assert fingerprint == "fp"
    (span,) = spans
    assert len(span.nodeset) == 5 and "st5" in span.nodeset
    assert "st5" not in addresses and addresses["st1"] == ("127.0.0.1", 7001)


@pytest.mark.parametrize("bad", [
    {}, {"nodesets": [], "cluster_fingerprint": "fp"},
    answer([{"node_id": "st1", "data": "127.0.0.1:notaport"}]),
    answer([{"node_id": "st1"}]),
])
def test_malformed_answers_are_badmsg(bad: dict[str, Any]) -> None:
    with pytest.raises(LogError) as raised:
        parse_nodesets(bad)
    assert raised.value.status is Status.BADMSG
