"""Column names of a Spark DDL schema, without a session: the notation every table is declared in."""

from __future__ import annotations

import re
from typing import cast


def column_names(ddl: str) -> list[str]:
    """`"a string NOT NULL, b decimal(12,2), c map<string,int>"` -> `["a", "b", "c"]`."""
    names, depth, start = [], 0, 0
    for i, ch in enumerate(ddl + ","):
        depth += (ch in "(<") - (ch in ")>")
        if ch == "," and depth == 0:
            # Each column starts with its name.
            names.append(cast(re.Match[str], re.match(r"\s*`?(\w+)", ddl[start:i])).group(1))
            start = i + 1
    return names
