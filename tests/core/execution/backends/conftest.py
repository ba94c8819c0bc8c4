"""What the SSH backends' tests share: the environment of an `orbit` CLI that reaches the test's
sshd servers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.sshd import SshdFactory


@pytest.fixture
def env(orbit_home: Path, tmp_path: Path, sshd_factory: SshdFactory) -> dict[str, str]:
    """SQLite is enough here: the store is tested on both databases elsewhere; this is SSH."""
    return {
        **os.environ,
        "ORBIT_HOME": str(orbit_home),
        "ORBIT_DATABASE_URL": f"sqlite:///{tmp_path / 'orbit.db'}",
        "ORBIT_SSH_CONFIG": str(sshd_factory.config),
        "ORBIT_SSH_TIMEOUT": "2",
        "COLUMNS": "200",
    }
