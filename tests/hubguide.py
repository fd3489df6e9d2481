"""The docs' JupyterHub guide as the tests read it: its blocks as written, with names of a test's own.

The hub tier (test_hub.py) and the privileges tests run the guide's
configuration and SQL themselves, so the guide cannot drift from what works.
"""

from __future__ import annotations

import re
from pathlib import Path

GUIDE = Path(__file__).parent.parent / "docs" / "how-to" / "jupyterhub.md"


def block(language: str, marker: str) -> str:
    """The guide's first ``language`` block that ``marker`` begins or follows."""
    text = GUIDE.read_text()
    start = text.index(marker)
    opening = text.rfind(f"```{language}\n", 0, start)
    if opening != -1 and text.rfind("```", 0, start) == opening:  # the marker is in it
        start = opening
    found = re.search(rf"```{language}\n(.*?)```", text[start:], re.S)
    assert found, f"no {language} block after {marker!r} in the guide"
    return found.group(1)


def our_names(text: str, suffix: str) -> str:
    """The guide's schema and roles (``team``, ``team_owner``, …) with ``suffix``: roles are the cluster's."""
    return re.sub(r"\bteam(_owner|_users|_admin)?\b", rf"team\1_{suffix}", text)


def drop(admin, schema: str, roles: list[str]) -> None:
    """Remove what a test made as the guide says: the schema and the roles, their sessions ended first."""
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s)",
        [roles],
    )
    admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    for role in roles:
        if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')
