"""SQL for MERGE's clauses, in both writers' dialects. Column names are the data's own (a CSV header, a JSON key):
any may hold a dot, a quote, a space, or be a keyword, and a name left bare is parsed (`price.usd` as column `usd`
of alias `price`), so every one is quoted whole, its quote character doubled inside. Only the quoting differs:
delta-rs's DataFusion takes "name", Spark `name`; the rest of the SQL is the same in both."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lakefeed.batch.cdc import KIND, MergePlan


@dataclass(frozen=True)
class Dialect:
    mark: str  # the character that quotes an identifier

    def name(self, column: str) -> str:
        """A column name as an identifier: the target of an update's or insert's assignment."""
        return self.mark + column.replace(self.mark, self.mark * 2) + self.mark

    def col(self, alias: str, column: str) -> str:
        """A column of the target (`t`) or the source (`s`)."""
        return f"{alias}.{self.name(column)}"

    def assign(self, columns: Iterable[str]) -> dict[str, str]:
        """Each column set to the source's."""
        return {self.name(c): self.col("s", c) for c in columns}

    def same_keys(self, keys: tuple[str, ...]) -> str:
        """The target row and the source row have the same key."""
        return " AND ".join(f"{self.col('t', k)} = {self.col('s', k)}" for k in keys)


DATAFUSION, SPARK = Dialect('"'), Dialect("`")


def within(scope: tuple[str, tuple[str, ...]] | None, sql: Dialect = DATAFUSION) -> str | None:
    """The table rows a scoped snapshot replaces: those whose scope column holds one of its values."""
    if scope is None:
        return None
    column, values = scope
    if not values:
        return "FALSE"
    return f"{sql.col('t', column)} IN ({', '.join(_text(v) for v in values)})"


def _text(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def newer_clause(seq: tuple[str, ...], sql: Dialect = DATAFUSION) -> str:
    """Source sequence >= target sequence, lexicographically; ties go to the later arrival (the source)."""
    if not seq:
        return "TRUE"
    col = sql.col
    *head, last = seq
    clauses, equal = [], []
    for c in head:
        clauses.append("(" + " AND ".join([*equal, f"{col('s', c)} > {col('t', c)}"]) + ")")
        equal.append(f"{col('s', c)} = {col('t', c)}")
    clauses.append("(" + " AND ".join([*equal, f"{col('s', last)} >= {col('t', last)}"]) + ")")
    return " OR ".join(clauses)


def changed_clause(columns: tuple[str, ...], new_columns: tuple[str, ...] = (), sql: Dialect = DATAFUSION) -> str:
    """A matched row changes if a compared column differs, or a column the table gains gets a value."""
    clauses = [f"({sql.col('t', c)} IS DISTINCT FROM {sql.col('s', c)})" for c in columns]
    clauses += [f"({sql.col('s', c)} IS NOT NULL)" for c in new_columns]
    return " OR ".join(clauses) or "FALSE"


def kind_in(kinds: tuple[str, ...], sql: Dialect = DATAFUSION) -> str:
    """The source row's change is of one of these kinds."""
    return f"{sql.col('s', KIND)} IN ({', '.join(map(_text, kinds))})"


def inserted_kinds(plan: MergePlan) -> tuple[str, ...]:
    """The kinds of change that insert a key the table lacks."""
    return ("upsert", "insert", "update") if plan.insert_updates_of_absent else ("upsert", "insert")


# SCD2 history (delta_rs.history_source's columns): an edit closes the key's current version, or opens one.
def history_match(keys: tuple[str, ...], sql: Dialect = DATAFUSION) -> str:
    """A closing edit against the key's current version."""
    return f"{sql.same_keys(keys)} AND {sql.col('t', 'is_current')} AND {sql.col('s', '__h')} = 'close'"


def history_close(sql: Dialect = DATAFUSION) -> dict[str, str]:
    return {sql.name("valid_to"): sql.col("s", "__at"), sql.name("is_current"): "false"}


def history_open(sql: Dialect = DATAFUSION) -> str:
    return f"{sql.col('s', '__h')} = 'open'"
