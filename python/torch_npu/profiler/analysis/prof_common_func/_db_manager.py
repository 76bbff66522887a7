"""``DbManager``: the SQLite access of torch_npu's profiler databases, as torch_npu's.

Used by ``torch_npu/profiler/_db.py`` to write ``ascend_pytorch_profiler*.db``. A failure is
reported (a warning naming SQLite's error) and answered with a falsy result, never raised
into the program being profiled, except where a table cannot be created or filled (a
RuntimeError: the database would be incomplete).
"""
import os
import sqlite3
import warnings

from ._singleton import Singleton

__all__ = []


def _report(msg: str) -> None:
    warnings.warn(f"[torch_npu.profiler] {msg}", stacklevel=3)


class EmptyClass:
    """What create_connect_db returns instead of a connection and cursor that failed: falsy."""

    def __init__(self, info: str = "") -> None:
        self._info = info

    @classmethod
    def __bool__(cls) -> bool:
        return False

    def __str__(self) -> str:
        return self._info

    @property
    def info(self) -> str:
        return self._info


class DbManager:
    FETCH_SIZE = 10000
    INSERT_SIZE = 10000
    MAX_ROW_COUNT = 100000000

    @classmethod
    def create_connect_db(cls, db_path: str) -> tuple:
        """``(connection, cursor)`` of the database at db_path (created owner-only, 0o640), or
        two EmptyClass when it cannot be opened."""
        try:
            if not os.path.exists(db_path):
                os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT, 0o640))
            conn = sqlite3.connect(db_path)
        except (OSError, sqlite3.Error) as err:
            _report(f"cannot open the profiler database {db_path!r}: {err}")
            return EmptyClass("empty conn"), EmptyClass("empty curs")
        try:
            return conn, conn.cursor()
        except sqlite3.Error as err:
            _report(f"cannot open the profiler database {db_path!r}: {err}")
            conn.close()
            return EmptyClass("empty conn"), EmptyClass("empty curs")

    @classmethod
    def destroy_db_connect(cls, conn, cur) -> None:
        """Closes the cursor, then the connection (either may be None)."""
        for handle in (cur, conn):
            if handle:
                try:
                    handle.close()
                except sqlite3.Error as err:
                    _report(f"SQLite Error: {' '.join(map(str, err.args))}")

    @staticmethod
    def _commit(conn, run) -> bool:
        """Run ``run(cursor)`` and commit; a SQLite error is reported and gives False."""
        try:
            run(conn.cursor())
            conn.commit()
            return True
        except sqlite3.Error as err:
            _report(f"SQLite Error: {' '.join(map(str, err.args))}")
            return False

    @classmethod
    def execute_sql(cls, conn, sql: str) -> bool:
        return cls._commit(conn, lambda cur: cur.execute(sql))

    @classmethod
    def executemany_sql(cls, conn, sql: str, params) -> bool:
        return cls._commit(conn, lambda cur: cur.executemany(sql, params))

    @classmethod
    def judge_table_exist(cls, cur, table_name: str) -> bool:
        try:
            cur.execute("SELECT count(*) FROM sqlite_master WHERE type='table' AND name=?", (table_name,))
            return bool(cur.fetchone()[0])
        except sqlite3.Error as err:
            raise RuntimeError(f"Failed to judge table {table_name} in db file") from err

    @classmethod
    def create_table_with_headers(cls, conn, cur, table_name: str, headers: list) -> None:
        """headers: [(column, SQLite type), ...]; an existing table is kept."""
        if cls.judge_table_exist(cur, table_name):
            return
        columns = ", ".join(f"{name} {kind}" for name, kind in headers)
        if not cls.execute_sql(conn, f"CREATE TABLE IF NOT EXISTS {table_name} ({columns})"):
            raise RuntimeError(f"Failed to create table {table_name} in profiler db file")

    @classmethod
    def insert_data_into_table(cls, conn, table_name: str, data: list) -> None:
        """Inserts the rows (tuples of one width), INSERT_SIZE at a time; no rows, no access."""
        if not data:
            return
        sql = f"INSERT INTO {table_name} VALUES ({', '.join('?' * len(data[0]))})"
        for start in range(0, len(data), cls.INSERT_SIZE):
            if not cls.executemany_sql(conn, sql, data[start:start + cls.INSERT_SIZE]):
                raise RuntimeError(f"Failed to insert data into table {table_name} of profiler db file")

    @classmethod
    def clear_table_data(cls, conn, cur, table_name: str) -> None:
        """Deletes the rows of an existing table, keeping the table."""
        if table_name and cls.judge_table_exist(cur, table_name):
            if not cls.execute_sql(conn, f"DELETE FROM {table_name}"):
                raise RuntimeError(f"Failed to clear data from table {table_name}")

    @classmethod
    def fetch_all_data(cls, cur, sql: str) -> list:
        """Every row of the query, FETCH_SIZE at a time; stops (with a warning) past
        MAX_ROW_COUNT rows; [] on an error."""
        rows = []
        try:
            cur.execute(sql)
            while True:
                batch = cur.fetchmany(cls.FETCH_SIZE)
                rows += batch
                if len(rows) > cls.MAX_ROW_COUNT:
                    _report("The record counts in table exceed the limit!")
                    break
                if len(batch) < cls.FETCH_SIZE:
                    break
            return rows
        except sqlite3.Error as err:
            _report(f"SQLite Error: {' '.join(map(str, err.args))}")
            return []

    @classmethod
    def fetch_one_data(cls, cur, sql: str):
        """The query's first row, or [] on an error."""
        try:
            cur.execute(sql)
            return cur.fetchone()
        except sqlite3.Error as err:
            _report(f"SQLite Error: {' '.join(map(str, err.args))}")
            return []


class BasicDb:
    """One database of a parse: ``init(db_path)`` names it (the first name given stays),
    ``create_connect_db()`` opens it (True when open), and the DbManager operations on its
    connection. ``close()`` closes it and forgets the name."""

    def __init__(self) -> None:
        self.db_path = None
        self.conn = None
        self.curs = None

    def init(self, db_path: str) -> None:
        if self.db_path is None:
            self.db_path = db_path

    def create_connect_db(self) -> bool:
        if not (self.conn and self.curs):
            if self.db_path is None:
                return False
            self.conn, self.curs = DbManager.create_connect_db(self.db_path)
        return bool(self.conn and self.curs)

    def get_db_path(self) -> str:
        return self.db_path

    def close(self) -> None:
        DbManager.destroy_db_connect(self.conn, self.curs)
        self.db_path = self.conn = self.curs = None

    def judge_table_exist(self, table_name: str) -> bool:
        return DbManager.judge_table_exist(self.curs, table_name)

    def create_table_with_headers(self, table_name: str, headers: list) -> None:
        DbManager.create_table_with_headers(self.conn, self.curs, table_name, headers)

    def insert_data_into_table(self, table_name: str, data: list) -> None:
        DbManager.insert_data_into_table(self.conn, table_name, data)

    def clear_table_data(self, table_name: str) -> None:
        DbManager.clear_table_data(self.conn, self.curs, table_name)

    def fetch_all_data(self, sql: str) -> list:
        return DbManager.fetch_all_data(self.curs, sql)

    def fetch_one_data(self, sql: str):
        return DbManager.fetch_one_data(self.curs, sql)


@Singleton
class TorchDb(BasicDb):
    """``ascend_pytorch_profiler[_{rank}].db``, the db export of a run."""


@Singleton
class AnalysisDb(BasicDb):
    """``analysis.db``, the communication analysis of a run."""
