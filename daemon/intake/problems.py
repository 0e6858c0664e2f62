"""What a push request is answered with when it cannot be stored: a status and the problems, row by row.

Shared by the decoders of the request body (`records`, `json_body`), so that every format reports its
problems in one shape: the record's number (1-based, as sent), the field at fault and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_PROBLEMS = 100  # listed in an answer; `problems_total` counts them all


@dataclass(frozen=True)
class Problem:
    row: int | None
    field: str | None
    message: str

    def as_json(self) -> dict[str, Any]:
        return {"row": self.row, "field": self.field, "message": self.message}


class Rejected(Exception):
    """The request cannot be stored; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str, problems: list[Problem] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.problems = problems or []

    def as_json(self) -> dict[str, Any]:
        shown = self.problems[:MAX_PROBLEMS]
        return {"error": self.message, "problems": [p.as_json() for p in shown],
                "problems_total": len(self.problems)}
