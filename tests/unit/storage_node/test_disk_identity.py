"""The disk identity marker: what a start finds, and a fuzzed parser."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from storage_node import disk_identity as di
from storage_node.disk_identity import DiskState


def test_states(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    assert di.inspect(data, cluster="c", node_id="st1").state is DiskState.NEW
    (tmp_path / "d" / "segments").mkdir(parents=True)
    assert di.inspect(data, cluster="c", node_id="st1").state is DiskState.NEW
    (tmp_path / "d" / "segments" / "000000001.seg").write_bytes(b"x")
    assert di.inspect(data, cluster="c", node_id="st1").state is DiskState.LEGACY
    di.write(data, di.new_marker(cluster="c", node_id="st1", generation=3))
    found = di.inspect(data, cluster="c", node_id="st1")
    assert found.state is DiskState.OK and found.marker is not None
    assert found.marker.generation == 3
    assert di.inspect(data, cluster="c", node_id="st2").state is DiskState.FOREIGN
    assert di.inspect(data, cluster="other", node_id="st1").state is DiskState.FOREIGN
    (tmp_path / "d" / di.FILE_NAME).write_bytes(b'{"format": 1, "clus')
    assert di.inspect(data, cluster="c", node_id="st1").state is DiskState.DAMAGED


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_parse_never_raises(raw: bytes) -> None:
    marker = di.parse(raw)
    if marker is not None:
        assert marker.generation > 0


@given(st.dictionaries(st.sampled_from(["format", "cluster", "node_id", "generation",
                                        "created_ms"]),
                       st.none() | st.integers() | st.text(max_size=5) | st.booleans()))
def test_parse_fields(document: dict[str, object]) -> None:
    import json
    di.parse(json.dumps(document).encode())
