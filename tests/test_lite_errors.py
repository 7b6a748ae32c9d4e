"""The fast SQLite reader (zoo.registry.lite) raises zoo's typed error on a database error, as the SQLAlchemy path
does, instead of falling through to that path (which imported SQLAlchemy only to fail the same way)."""

import json
import os
import sqlite3
import subprocess
import sys

from tests.conftest import ROOT

READ = """import json, sys
import zoo
try:
    zoo.connect(sys.argv[1]).search("params<1e9", limit=3)
    out = "no error"
except zoo.ZooError as e:
    out = type(e).__name__ + ": " + str(e)
print(json.dumps({"error": out, "sqlalchemy": "sqlalchemy" in sys.modules}))
"""


def test_a_locked_registry_is_registry_locked_from_the_fast_reader(small_registry, tmp_path):
    path = str(tmp_path / "r.db")
    source, target = sqlite3.connect(small_registry.removeprefix("sqlite:///")), sqlite3.connect(path)
    source.backup(target)
    source.close()
    target.execute("PRAGMA journal_mode=DELETE")  # a rollback journal: an exclusive lock keeps readers out
    target.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", READ, path],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env={**os.environ, "ZOO_LOCK_TIMEOUT": "0.2"},
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    out = json.loads(proc.stdout)
    assert out["error"].startswith("RegistryLocked: ") and "ZOO_LOCK_TIMEOUT" in out["error"], out
    assert out["sqlalchemy"] is False
