"""``%%agent`` and ``%agent``: a cell that talks to an agent, its output the run's view.

``%load_ext jupyter_agentruns`` registers them; in a kernel started by a
server with the extension they are there already (the server's kernels run
:mod:`.startup` first). The cell's body is the prompt::

    %%agent opencode --mode plan
    Which columns of df have missing values?

and ``%agent demo what is the weather in Shanghai`` is the one-line form. A
cell magic is a ``submit()``: re-running the cell re-attaches to its run
unless its body (or its options) changed, and the run's view with its
record is what the notebook keeps.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .client import AgentRunsError
from .widget import _client, submit

# When no agent is named and the server configures none (c.AgentRuns.default_agent).
FALLBACK_AGENT = "demo"


class MagicUsageError(ValueError):
    """A ``%%agent`` line that cannot be a run: said in one line, nothing submitted."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


@magics_class
class AgentMagics(Magics):
    """The ``%%agent`` cell magic and the ``%agent`` line magic."""

    @magic_arguments()
    @argument(
        "agent", nargs="?", help="The agent (default: the server's default_agent, else demo)."
    )
    @argument("--session", "-s", help="The conversation to continue (default: the notebook's).")
    @argument("--new", action="store_true", help="Start a new run even if this cell has one.")
    @argument("--model", help="The model the agent should use (its input's 'model').")
    @argument("--mode", help="The agent's mode, as it names them (its input's 'mode').")
    @cell_magic
    def agent(self, line: str, cell: str) -> None:
        """Run an agent with the cell's body as its prompt; the output is the run's view.

        ``%%agent [AGENT] [--session S] [--new] [--model M] [--mode M]``
        """
        try:
            args = parse_argstring(AgentMagics.agent, line)
        except Exception as exc:  # argparse's usage error, or a quote left open
            raise MagicUsageError(f"%%agent {line.strip()}: {exc}") from None
        prompt = cell.strip("\n")
        if not prompt.strip():
            raise MagicUsageError(
                "%%agent takes the prompt as the cell's body, under the %%agent line"
            )
        start(
            args.agent,
            prompt,
            session=args.session,
            new=args.new,
            model=args.model,
            mode=args.mode,
        )

    # A line magic of the cell magic's name, as %time and %%time (IPython's stubs take no name).
    @line_magic("agent")  # type: ignore[arg-type]
    def agent_line(self, line: str) -> None:
        """``%agent AGENT prompt``: the one-line form (the agent is named first)."""
        try:
            words = shlex.split(line, posix=True)
        except ValueError as exc:
            raise MagicUsageError(f"%agent {line.strip()}: {exc}") from None
        if len(words) < 2:
            raise MagicUsageError(
                "%agent takes the agent's name and a prompt: %agent demo what is in df? "
                "(for a longer prompt, %%agent with the prompt in the cell's body)"
            )
        name, _, prompt = line.strip().partition(" ")
        start(name, prompt.strip())


def start(
    agent: str | None,
    prompt: str,
    *,
    session: str | None = None,
    new: bool = False,
    model: str | None = None,
    mode: str | None = None,
) -> Any:
    """Submit (or find again) the cell's run and show its view; returns the ``Run``."""
    payload: dict[str, Any] = {"prompt": prompt}
    if model:
        payload["model"] = model
    if mode:
        payload["mode"] = mode
    return submit(agent or default_agent(), payload, session=session, new=new)


def default_agent() -> str:
    """The server's ``default_agent`` (``GET agents``), else ``demo``."""
    try:
        described = _client().request("GET", "agents")[2]
    except AgentRunsError:
        return FALLBACK_AGENT
    name = described.get("default_agent") if isinstance(described, dict) else None
    return name if isinstance(name, str) and name else FALLBACK_AGENT


_QUESTION_LINE = re.compile(r"^([ \t]*)%agent[ \t]+(.*\?)[ \t]*(\r?\n)?$")


def questions_are_prompts(lines: list[str]) -> list[str]:
    """An input transformer: ``%agent demo what is in df?`` asks the agent, not for help.

    IPython reads a line ending in ``?`` as a request for help on what it
    names; a ``%agent`` line ending in one becomes the magic's call with the
    line's text, before IPython looks. A ``%%`` cell is left alone (its
    body is the prompt, untouched).
    """
    if not lines or lines[0].lstrip().startswith("%%"):
        return lines
    changed = []
    for line in lines:
        found = _QUESTION_LINE.match(line)
        if found is None:
            changed.append(line)
            continue
        indent, text, end = found.group(1), found.group(2), found.group(3) or ""
        changed.append(f"{indent}get_ipython().run_line_magic('agent', {text!r}){end}")
    return changed


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_agentruns``."""
    ipython.register_magics(AgentMagics)
    if questions_are_prompts not in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.append(questions_are_prompts)
