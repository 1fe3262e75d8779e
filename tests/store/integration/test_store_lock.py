"""One weed per data directory, and paths that do not depend on weed's working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hapi.store import EmbeddedStore, StoreError, StoreSettings, free_port


def _settings(data_dir: Path) -> StoreSettings:
    return StoreSettings(
        data_dir=data_dir, port=free_port(), access_key_id="KEY", secret_access_key="secret"
    )


def test_relative_data_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = _settings(Path(".state/store"))
    assert settings.data_dir == tmp_path / ".state" / "store"
    with EmbeddedStore(settings) as store:  # weed runs inside data_dir: it must find its files
        assert store.pid is not None


def test_a_second_store_on_the_same_dir_is_refused_and_changes_nothing(tmp_path):
    with EmbeddedStore(_settings(tmp_path / "data")) as first:
        log = first.log_path.stat().st_ino
        with pytest.raises(StoreError) as refused:
            EmbeddedStore(_settings(tmp_path / "data")).start()
        assert str(refused.value) == (
            f"a store is already running on {tmp_path / 'data'} (weed pid {first.pid})"
        )
        assert first.log_path.stat().st_ino == log  # its log was not renamed away
        assert not first.log_path.with_suffix(".log.1").exists()
        os.kill(first.pid, 0)  # still running
    again = EmbeddedStore(_settings(tmp_path / "data"))  # the lock went with the first
    again.start()
    again.stop()
