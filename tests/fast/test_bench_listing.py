"""``python -m bench.listing`` (bench/RESULTS.md, figure 24's reading): both serializers list the
same checkpoints of a real thread written through LangGraph's saver (a small one, SQLite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import listing


def test_the_listing_side_by_side_lists_the_same_checkpoints_with_each_serializer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [counts] = listing.sqlite(tmp_path, lengths=(6,))
    assert set(counts) == set(listing.SERIALIZERS)
    assert len(set(counts.values())) == 1 and next(iter(counts.values())) > 6
    assert "sqlite: 6 turns" in capsys.readouterr().out
