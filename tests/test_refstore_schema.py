"""A new store file gets db_schema.SCHEMA in one transaction; it must be what the
numbered migrations make of an empty file, column for column and index for
index, with the same state rows and user_version."""

from __future__ import annotations

import sqlite3

from aspen_cgi.refstore import db, db_schema


def _shape(conn: sqlite3.Connection) -> dict:
    tables = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    out: dict = {"(user_version)": conn.execute("PRAGMA user_version").fetchone()[0],
                 "(state rows)": sorted(conn.execute("SELECT key, value FROM state"))}
    for t in tables:
        out[t] = {"columns": [tuple(r[1:]) for r in conn.execute(f"PRAGMA table_info({t})")],
                  "indexes": sorted((bool(r[2]), r[3], bool(r[4]),
                                     tuple(c[2] for c in conn.execute(f"PRAGMA index_info('{r[1]}')")))
                                    for r in conn.execute(f"PRAGMA index_list({t})"))}
    return out


def test_a_new_file_gets_what_the_migrations_make(tmp_path):
    fresh = db.connect(str(tmp_path / "fresh.sqlite3"))
    migrated = sqlite3.connect(str(tmp_path / "migrated.sqlite3"), isolation_level=None, factory=db._Connection)
    db._migrate(migrated, fresh=False)
    assert _shape(fresh) == _shape(migrated)
    assert _shape(fresh)["(user_version)"] == db.SCHEMA_VERSION
    assert fresh.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert len(_shape(fresh)) > 15


def test_a_file_with_a_schema_is_migrated_not_created_again(tmp_path):
    path = str(tmp_path / "old.sqlite3")
    old = sqlite3.connect(path, isolation_level=None, factory=db._Connection)
    db_schema.MIGRATIONS[0](db_schema.schema_tools().Database(old))
    old.execute("PRAGMA user_version=1")
    old.execute("INSERT INTO versions(id, kind, at, state) VALUES (1, 'import', 1.0, 'done')")
    old.close()
    conn = db.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    assert list(conn.execute("SELECT id, kind FROM versions")) == [(1, "import")]
    assert conn.execute("SELECT value FROM state WHERE key = 'chain_from'").fetchone() == ("2",)
