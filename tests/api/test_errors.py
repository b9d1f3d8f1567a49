"""How PostgreSQL's errors become pylease's: the parameter a 22023 names."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pylease import InvalidArgument
from pylease.postgres import wrap_errors

Conn = psycopg.Connection[Any]


def raise_22023(conn: Conn, message: str, column: str | None) -> None:
    using = f"ERRCODE = '22023', MESSAGE = '{message}'"
    if column is not None:
        using += f", COLUMN = '{column}'"
    with wrap_errors("job"):
        conn.execute(f"DO $$ BEGIN RAISE EXCEPTION USING {using}; END $$")  # type: ignore[arg-type]


def test_the_parameter_comes_from_the_errors_column_field(conn: Conn) -> None:
    # The message starts with another word: only the COLUMN field can name ttl.
    with pytest.raises(InvalidArgument) as raised:
        raise_22023(conn, "pylease: a ttl must be positive", "ttl")
    assert raised.value.parameter == "ttl"
    assert raised.value.name == "job"
    assert str(raised.value) == "pylease: a ttl must be positive"


def test_without_a_column_field_the_message_names_it(conn: Conn) -> None:
    # SQL functions from before RAISE ... USING COLUMN: the message's first word.
    with pytest.raises(InvalidArgument) as raised:
        raise_22023(conn, "pylease: holder must not be empty", None)
    assert raised.value.parameter == "holder"
