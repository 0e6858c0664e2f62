"""Bounds on what one landed file or pushed request may bring, so no input can take the daemon's memory
or a core for minutes, or store what readers cannot read back."""

from __future__ import annotations

from pydantic import Field

from lakefeed.config.base import Frozen


class Limits(Frozen):
    max_columns: int = Field(default=2000, ge=1, description="Columns a file or request may have.")
    max_nesting: int = Field(default=16, ge=1, le=64,
                             description="How deep lists and structs may nest (Delta and Parquet readers "
                                         "fail on deep nesting: deltalake at 60).")
    max_line_bytes: int = Field(default=8 << 20, ge=1024,
                                description="The longest line of a CSV or NDJSON file (the header included).")
    max_file_bytes: int = Field(default=8 << 30, ge=1,
                                description="Files larger than this are quarantined unread.")
