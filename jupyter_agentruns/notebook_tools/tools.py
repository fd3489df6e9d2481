"""The notebook tools: what each does, and each call recorded in its run as a tool step.

A call acts on one kernel: the run's (the kernel that submitted it, its
``metadata.kernel_id``), or, for a person calling with their own token, the
kernel of the notebook they name. A call made for a run is a durable tool
step of that run (``tool.started``, ``tool.completed``); ``run_code`` asks the
person first (an ``input.requested`` of kind ``approval`` showing the code)
unless ``notebook_tools_approval`` is ``"never"``. ``insert_cell``,
``edit_cell`` and ``delete_cell`` change the notebook's cells: each call a
notebook edit (see :mod:`.edits`), asked first when ``notebook_edits`` is
``"ask"``. ``execute_cell`` runs a cell's source and puts its outputs into
the cell (an ``outputs`` edit); it asks first exactly like ``run_code``.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from ..agents.steps import Approval, Ended, error_text, tool_step
from ..errors import error_object
from . import snippets
from .edits import (
    CELL_TOOLS,
    EDIT_TOOLS,
    EXECUTE_CELL,
    CellNotFound,
    InvalidEdit,
    NotebookEdits,
    StepRun,
    find_cell,
    source_of,
)
from .kernels import (
    PART_BYTES,
    Kernels,
    KernelUnavailable,
    NotebookNotFound,
    Output,
    cut_to,
    encoded_size,
)
from .places import FilePlace, Places

RUN_CODE = "run_code"
NOTEBOOK_ARGUMENT = {
    "type": "string",
    "description": "The notebook's path, relative to the server's root (as JupyterLab's file "
    "browser shows it); its kernel must be running.",
}
TOOLS: dict[str, dict[str, Any]] = {
    RUN_CODE: {
        "description": "Run Python code in the notebook's kernel, where the notebook's variables "
        "live; returns its stdout, stderr, result and displayed output. Variables it defines stay "
        "in the kernel. A person may be asked to approve the code first.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to run."}},
            "required": ["code"],
        },
        "kind": "execute",
    },
    "list_variables": {
        "description": "The variables of the notebook's kernel: name, type, and shape or length.",
        "parameters": {"type": "object", "properties": {}},
        "kind": "read",
    },
    "describe": {
        "description": "One variable of the notebook's kernel: a DataFrame's dtypes, head and "
        "summary; an array's dtype, shape and first values; else a short repr.",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "The variable's name."}},
            "required": ["name"],
        },
        "kind": "read",
    },
    "read_notebook": {
        "description": "The notebook's cells as the person sees them now (as last saved when "
        "no page has it open): each cell's id, source and text outputs; cells an agent wrote "
        "say so.",
        "parameters": {"type": "object", "properties": {}},
        "kind": "read",
    },
    "insert_cell": {
        "description": "Insert a new cell into the notebook, after the cell whose id is 'after' "
        "(or at the 'start' or the 'end'); returns the new cell's id.",
        "parameters": {
            "type": "object",
            "properties": {
                "source": {"type": "string", "description": "The new cell's source."},
                "cell_type": {
                    "type": "string",
                    "enum": ["code", "markdown", "raw"],
                    "description": "The cell's type (default code).",
                },
                "after": {
                    "type": "string",
                    "description": "The id of the cell it goes after, or 'start' or 'end' "
                    "(the default).",
                },
            },
            "required": ["source"],
        },
        "kind": "edit",
    },
    "edit_cell": {
        "description": "Replace the source of the cell 'cell_id' (ids as read_notebook shows "
        "them). If the cell changed since you read it, nothing is changed and you are told to "
        "read the notebook again.",
        "parameters": {
            "type": "object",
            "properties": {
                "cell_id": {"type": "string", "description": "The cell's id."},
                "source": {"type": "string", "description": "The cell's new source."},
            },
            "required": ["cell_id", "source"],
        },
        "kind": "edit",
    },
    "delete_cell": {
        "description": "Delete the cell 'cell_id' from the notebook (not if it changed since you "
        "read it).",
        "parameters": {
            "type": "object",
            "properties": {"cell_id": {"type": "string", "description": "The cell's id."}},
            "required": ["cell_id"],
        },
        "kind": "edit",
    },
    EXECUTE_CELL: {
        "description": "Run the code cell 'cell_id' (its source as the notebook holds it now) in "
        "the notebook's kernel and put its outputs into the cell, as if the person ran it; "
        "returns its stdout, stderr, result and displayed output. A person may be asked to "
        "approve it first.",
        "parameters": {
            "type": "object",
            "properties": {"cell_id": {"type": "string", "description": "The code cell's id."}},
            "required": ["cell_id"],
        },
        "kind": "execute",
    },
}
# What read_notebook says of the copy it read, by the place that held it.
WHERE = {"file": "as last saved", "document": "as open now", "page": "as open now"}
IMAGE_REFERENCE = "[{mime} image {index}, {size} bytes: kept with this tool step]"


class InvalidArguments(ValueError):
    """A call whose arguments are not what the tool takes."""

    error_type = "invalid_arguments"


def definitions(with_notebook: bool = False) -> list[dict[str, Any]]:
    """``[{name, description, parameters}]``; ``with_notebook``: each takes the ``notebook`` path."""
    found = []
    for name, spec in TOOLS.items():
        parameters = json.loads(json.dumps(spec["parameters"]))
        if with_notebook:
            parameters["properties"] = {"notebook": NOTEBOOK_ARGUMENT, **parameters["properties"]}
            parameters["required"] = ["notebook", *parameters.get("required", [])]
        found.append({"name": name, "description": spec["description"], "parameters": parameters})
    return found


@dataclass
class Outcome(Ended):
    """A call's answer: ``text`` for the caller (a model), ``result`` what its step keeps beside it."""

    images: list[dict[str, str]] = field(default_factory=list)

    def content(self) -> list[dict[str, Any]] | None:
        """What the caller read, kept once as the step's text."""
        return [{"type": "text", "text": self.text}]


class NotebookTools:
    """The tools over the server's kernels and notebooks.

    ``approval``: ``"ask"`` or ``"never"`` (``run_code``); ``edits``:
    ``"apply"`` or ``"ask"`` (the edit tools).
    """

    def __init__(
        self,
        kernels: Kernels,
        approval: str = "ask",
        max_event_bytes: int = 262144,
        edits: str = "apply",
    ):
        self.kernels = kernels
        self.approval = approval
        self.max_event_bytes = max_event_bytes
        # What one call answers and its step keeps, images included, as JSON
        # encodes it: half an event's limit, so that an agent's answer quoting
        # it has room too.
        self.budget = max_event_bytes // 2
        # Where edits are made: the file, and before it what the server adds (places.add).
        self.places = Places(FilePlace(kernels.contents_manager))
        self.edits = NotebookEdits(self.places, mode=edits, room=self.budget)

    def asks(self, name: str) -> bool:
        """Whether a call of ``name`` made for a run asks the person first."""
        if name in EDIT_TOOLS:
            return self.edits.mode == "ask"
        return name in (RUN_CODE, EXECUTE_CELL) and self.approval != "never"

    async def notebook_of(self, run: Any, kernel_id: str | None) -> str | None:
        """The path of the run's notebook: its kernel's, else the one it was submitted from."""
        if kernel_id is not None:
            path = await self.kernels.notebook_of(kernel_id)
            if path:
                return path
        named = (run.metadata or {}).get("notebook") or run.session
        return named if isinstance(named, str) and named.endswith(".ipynb") else None

    async def resume(self, run: Any, step: dict[str, Any], kernel_id: str | None = None) -> Outcome:
        """What the caller reads of a step an earlier attempt of ``run`` started (``step``: its tool).

        An edit is settled by the notebook's file (applied once, never lost);
        a read is made again; any other call that started without a recorded
        end (``run_code``, an ``execute_cell`` whose outputs were not recorded)
        is not repeated, unless a person says so (``in_doubt = "ask"``): then on
        ``kernel_id``, the run's kernel, or if it is gone the notebook's kernel now.
        """
        name, args = step.get("name"), step.get("args") or {}
        recorded = any(
            edit.get("call_id") == step.get("call_id") for edit in run.snapshot.get("edits") or ()
        )
        if name == EXECUTE_CELL and not recorded and getattr(run, "in_doubt", None) == "ask":
            # The cell may have run, its outputs are not in the notebook: a person decides.
            ended = await tool_step(
                run,
                name,
                args,
                lambda: self._run_cell_again(args, kernel_id, run, step["call_id"]),
                earlier=step,
            )
        elif name in CELL_TOOLS:
            ended = await self.edits.resume(run, step)
        elif name not in TOOLS:
            ended = await tool_step(run, str(name), args, _never, earlier=step)
        else:
            ended = await tool_step(
                run,
                name,
                args,
                lambda: self._call_again(name, args, kernel_id, run),
                earlier=step,
                idempotent=TOOLS[name]["kind"] == "read",
            )
        return (
            ended
            if isinstance(ended, Outcome)
            else Outcome(ended.ok, ended.text, ended.result, ended.error)
        )

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        *,
        kernel_id: str | None = None,
        notebook: str | None = None,
        run: Any = None,
        asked: dict[str, Any] | None = None,
    ) -> Outcome:
        """Make one call on ``kernel_id`` (or the kernel of ``notebook``).

        ``run``: the run it is made for (the agent API's ``run``): the call is
        then a tool step of that run, and ``run_code`` is approved first.
        ``asked``: that approval, asked already by an earlier attempt of the run.
        """
        if name not in TOOLS:
            error = {"type": "unknown_tool", "message": f"there is no notebook tool {name!r}"}
            return Outcome(False, error_text(error), error=error)
        if name in EDIT_TOOLS:
            ended = await self._edit(name, args, kernel_id, notebook, run, asked)
            return Outcome(ended.ok, ended.text, ended.result, ended.error)
        if name == EXECUTE_CELL:
            return await self._execute_cell(args, kernel_id, notebook, run, asked)
        if run is None:
            return await self._call(name, args, kernel_id, notebook, run)
        approval = None
        if self.asks(name) and isinstance(args.get("code"), str):
            approval = Approval(
                "Run this code in the notebook's kernel?",
                details={"tool": RUN_CODE, "code": args["code"], "language": "python"},
                refused="running this code",
            )
        ended = await tool_step(
            run,
            name,
            dict(args),
            lambda: self._call(name, args, kernel_id, notebook, run),
            approval=approval,
            asked=asked,
            kind=TOOLS[name]["kind"],
            title=_title(name, args),
        )
        # A refused call's end is no Outcome of the tool's own.
        return (
            ended if isinstance(ended, Outcome) else Outcome(False, ended.text, error=ended.error)
        )

    async def _edit(
        self,
        name: str,
        args: dict[str, Any],
        kernel_id: str | None,
        notebook: str | None,
        run: Any,
        asked: dict[str, Any] | None,
    ) -> Ended:
        if run is not None:
            path = notebook or await self.notebook_of(run, kernel_id)
            return await self.edits.step(run, name, args, path, asked=asked)
        try:
            if notebook is None:
                raise NotebookNotFound("an edit names the notebook it changes")
            return await self.edits.direct(name, args, notebook)
        except Exception as exc:  # the caller reads why; nothing was changed
            return Ended(False, error_text(error_object(exc)), error=error_object(exc))

    async def _execute_cell(
        self,
        args: dict[str, Any],
        kernel_id: str | None,
        notebook: str | None,
        run: Any,
        asked: dict[str, Any] | None,
    ) -> Outcome:
        """``execute_cell``: the cell's source now, asked first, run, its outputs an ``outputs`` edit."""
        cell_id = args.get("cell_id")
        path: str | None = None
        source = ""
        problem: Exception | None = None
        try:
            path, source = await self._cell_to_run(cell_id, kernel_id, notebook, run)
        except Exception as exc:  # the call fails with it: nothing ran, nothing changed
            problem = exc
        if run is None:
            if problem is not None:
                return _failed(problem)
            assert path is not None and isinstance(cell_id, str)  # (no problem: both known)
            try:
                return await self._run_cell(path, cell_id, source, kernel_id, None, None)
            except Exception as exc:  # the caller reads why (no kernel, the file unwritable)
                return _failed(exc)
        approval = None
        if problem is None and self.asks(EXECUTE_CELL):
            approval = Approval(
                f"Run the cell {cell_id} in the notebook's kernel?",
                details={"tool": EXECUTE_CELL, "code": cut_to(source, self.budget // 2),
                         "language": "python", "notebook": path, "cell_id": cell_id},
                refused="running this cell",
            )  # fmt: skip
        started = StepRun(run)

        async def act() -> Outcome:
            if problem is not None:
                raise problem
            assert path is not None and isinstance(cell_id, str)  # (no problem: both known)
            return await self._run_cell(path, cell_id, source, kernel_id, run, started.call_id)

        ended = await tool_step(
            started,
            EXECUTE_CELL,
            dict(args),
            act,
            approval=approval,
            asked=asked,
            kind=TOOLS[EXECUTE_CELL]["kind"],
            title=f"Run the cell {cell_id}",
        )
        return (
            ended if isinstance(ended, Outcome) else Outcome(False, ended.text, error=ended.error)
        )

    async def _call_again(
        self, name: str, args: dict[str, Any], kernel_id: str | None, run: Any
    ) -> Outcome:
        """A call cut by a take-over, made again (a read, or as a person chose): on the run's
        kernel if it still runs, else (it went with its server) on its notebook's kernel now."""
        if self.kernels.running(kernel_id):
            return await self._call(name, args, kernel_id, None, run)
        return await self._call(name, args, None, await self.notebook_of(run, None), run)

    async def _cell_to_run(
        self, cell_id: Any, kernel_id: str | None, notebook: str | None, run: Any
    ) -> tuple[str, str]:
        """The notebook and the source of the code cell ``cell_id`` that execute_cell runs."""
        if not isinstance(cell_id, str) or not cell_id:
            raise InvalidEdit("execute_cell takes the cell's id ('cell_id'; read_notebook "
                              "shows each)")  # fmt: skip
        path = notebook or (await self.notebook_of(run, kernel_id) if run is not None else None)
        if path is None:
            raise NotebookNotFound("the run has no notebook (it was not submitted from one)")
        _, content = await self.places.open(path)
        found = find_cell(content, cell_id)
        if found is None:
            raise CellNotFound(
                f"the notebook has no cell {cell_id!r} (read_notebook shows each cell's id)"
            )
        if found[1].get("cell_type") != "code":
            raise InvalidEdit(f"the cell {cell_id!r} is a {found[1].get('cell_type')} cell: "
                              "only a code cell runs")  # fmt: skip
        return path, source_of(found[1])

    async def _run_cell_again(
        self, args: dict[str, Any], kernel_id: str | None, run: Any, call_id: str
    ) -> Outcome:
        """An execute_cell cut by a take-over, run again as a person chose (in_doubt = "ask"):
        the cell's source now, its outputs the step's edit. The run's kernel went with its
        server: the cell then runs in the kernel its notebook has now."""
        path, source = await self._cell_to_run(args.get("cell_id"), kernel_id, None, run)
        kernel = kernel_id if self.kernels.running(kernel_id) else None
        return await self._run_cell(path, args["cell_id"], source, kernel, run, call_id)

    async def _run_cell(
        self,
        path: str,
        cell_id: str,
        source: str,
        kernel_id: str | None,
        run: Any,
        call_id: str | None,
    ) -> Outcome:
        """Run the cell's ``source`` and write its outputs (the edit made once, or a conflict)."""
        if kernel_id is None:
            kernel_id = await self.kernels.kernel_of(path)

        async def waiting(started: bool) -> None:
            if run is not None:
                await run.progress(
                    None, "waiting for the kernel" if started else "running the cell in the kernel"
                )

        output = await self.kernels.execute(
            kernel_id,
            source,
            on_waiting=waiting,
            room=self.budget - 2 * PART_BYTES,
            store_history=True,
            cell_room=self.edits.room // 2,
        )
        assert output.cell is not None  # (asked for with cell_room)
        edit = await self.edits.outputs(
            run, path, cell_id, source, output.cell.kept(), output.execution_count, call_id
        )
        outcome = _run_code_outcome(output)
        if edit["status"] == "applied":
            head = (
                f"Ran the cell {cell_id} (execution count {output.execution_count}); its outputs "
                "are in the notebook."
            )
        else:
            why = edit.get("reason") or f"the edit was {edit['status']}"
            head = (
                f"Ran the cell {cell_id}, but its outputs were NOT written into the notebook: "
                f"{why}. Read the notebook again (read_notebook) before running it again."
            )
        images = sum(encoded_size(image["data"]) + PART_BYTES for image in outcome.images)
        outcome.text = cut_to(head + "\n" + outcome.text, self.budget - images - PART_BYTES)
        outcome.result = {
            "status": edit["status"], "edit_id": edit["edit_id"], "cell_id": cell_id,
            "execution_count": output.execution_count, "images": output.images,
        }  # fmt: skip
        return outcome

    async def _call(
        self, name: str, args: dict[str, Any], kernel_id: str | None, notebook: str | None, run: Any
    ) -> Outcome:
        try:
            outcome = await self._act(name, args, kernel_id, notebook, run)
        except Exception as exc:  # whatever it was, the caller reads it and the step records it
            error = error_object(exc)
            error["message"] = cut_to(str(error.get("message")), 4000)
            return Outcome(False, error_text(error), error=error)
        images = sum(encoded_size(image["data"]) + PART_BYTES for image in outcome.images)
        outcome.text = cut_to(outcome.text, self.budget - images - PART_BYTES)
        return outcome

    async def _act(
        self, name: str, args: dict[str, Any], kernel_id: str | None, notebook: str | None, run: Any
    ) -> Outcome:
        if notebook is not None and kernel_id is None:
            kernel_id = await self.kernels.kernel_of(notebook)
        if kernel_id is None:
            raise KernelUnavailable(
                "this run was not submitted from a notebook's kernel, so it has none to work in"
            )
        if name == "read_notebook":
            path = notebook or (
                await self.notebook_of(run, kernel_id)
                if run is not None
                else await self.kernels.notebook_of(kernel_id)
            )
            if path is None:
                raise NotebookNotFound("the run's kernel has no notebook open with it")
            seen: dict[str, str] = {}
            place, content = await self.places.open(path)
            text = self.kernels.read_notebook(
                path, content, seen, WHERE.get(place.name, "as open now")
            )
            if run is not None:
                # What the agent read is what its edits expect the cells to hold.
                self.edits.saw(run.run_id, seen)
            return Outcome(True, text)
        if name == "list_variables":
            found = await self.kernels.introspect(kernel_id, snippets.list_variables())
            return Outcome(True, json.dumps(found, ensure_ascii=False))
        if name == "describe":
            variable = args.get("name")
            if not isinstance(variable, str) or not variable.isidentifier():
                raise InvalidArguments("describe takes the name of a variable (an identifier)")
            about = await self.kernels.introspect(kernel_id, snippets.describe(variable))
            if "missing" in about:
                raise InvalidArguments(f"the kernel has no variable {variable!r}")
            return Outcome(True, json.dumps(about, ensure_ascii=False))
        code = args.get("code")
        if not isinstance(code, str) or not code.strip():
            raise InvalidArguments("run_code takes the code to run, as text")

        async def waiting(started: bool) -> None:
            if run is not None:
                await run.progress(
                    None, "waiting for the kernel" if started else "running code in the kernel"
                )

        output = await self.kernels.execute(
            kernel_id, code, on_waiting=waiting, room=self.budget - 2 * PART_BYTES
        )
        return _run_code_outcome(output)


def _run_code_outcome(output: Output) -> Outcome:
    """What ``run_code`` answers: the output as text; its step keeps the images beside it."""
    references = [
        IMAGE_REFERENCE.format(
            mime=image["mime"],
            index=index,
            size=len(base64.b64decode(image["data"], validate=False)),
        )
        for index, image in enumerate(output.images, 1)
    ]
    # Code that raised still ran: the step completed, its text says how.
    return Outcome(
        True,
        _output_text(output, references),
        result={"images": output.images},
        images=output.images,
    )


def _failed(exc: Exception) -> Outcome:
    error = error_object(exc)
    return Outcome(False, error_text(error), error=error)


async def _never() -> None:
    raise AssertionError("a step an earlier attempt started is never made again")


def _title(name: str, args: dict[str, Any]) -> str:
    if name == RUN_CODE:
        first = (args.get("code") or "").strip().splitlines()
        return f"Run code in the kernel: {first[0][:60]}" if first else "Run code in the kernel"
    if name == "describe":
        return f"Describe {args.get('name')}"
    return {"list_variables": "List the kernel's variables", "read_notebook": "Read the notebook"}[
        name
    ]


def _output_text(output: Output, references: list[str]) -> str:
    parts = []
    if output.stdout or output.stdout_left_out:
        parts.append("stdout:\n" + output.stdout + _more(output.stdout_left_out))
    if output.stderr or output.stderr_left_out:
        parts.append("stderr:\n" + output.stderr + _more(output.stderr_left_out))
    for shown in output.displays:
        parts.append("display:\n" + shown)
    if output.result is not None:
        parts.append("result:\n" + output.result)
    parts.extend(references)
    left_out = output.left_out()
    if left_out is not None:
        parts.append(left_out)
    if output.error is not None:
        parts.append(
            f"error: {output.error['ename']}: {output.error['evalue']}\n"
            + output.error["traceback"]
        )
    return "\n".join(parts) or "(no output)"


def _more(characters: int) -> str:
    return f"\n… ({characters} more characters not shown)" if characters else ""
