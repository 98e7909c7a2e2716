"""docs/SETTINGS.md is generated from the config dataclasses and must match them."""

from __future__ import annotations

from pathlib import Path

from services.settings_doc import render

DOC = Path(__file__).resolve().parents[3] / "docs" / "SETTINGS.md"


def test_settings_doc_is_in_sync() -> None:
    assert DOC.read_text() == render(), (
        "docs/SETTINGS.md is stale: run python -m services.settings_doc > docs/SETTINGS.md")


def test_every_setting_is_documented() -> None:
    missing = [line for line in render().splitlines()
               if line.startswith("| `") and line.endswith("|  |")]
    assert not missing, missing
