"""A notebook's kernel, reached from the server: code run with a client of its own, and the saved cells.

Every call opens its own kernel client on the kernel's connection (never the
notebook's channels): what it runs shows in no cell, and the notebook's
frontend ignores its messages (their parent is not one of its requests).
The kernel runs requests in turn, so code sent while the person's cell runs
waits for it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import queue
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_core.utils import ensure_async

# How often a waiting call looks whether its kernel is still the one it sent to.
POLL_SECONDS = 0.5
MAX_STREAM_CHARS = 20_000
MAX_TEXT_CHARS = 20_000
MAX_INTROSPECTION_CHARS = 100_000
# What one execution's output may take, as JSON encodes it (images included).
MAX_OUTPUT_BYTES = 131_072
# How long one of our own snippets may run before the kernel is interrupted.
INTROSPECTION_SECONDS = 20.0
MAX_CELL_CHARS = 4_000
MAX_NOTEBOOK_CHARS = 40_000
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# What a display or an image costs in the answer beside its own text or data.
PART_BYTES = 64
NOTE_BYTES = 64  # "… (N more characters not shown)"
CELL_NOTE_BYTES = 200  # the stream that says what a cell's outputs left out
IMAGE_MIMES = ("image/png", "image/jpeg")
_quote = json.encoder.encode_basestring_ascii  # as the store encodes an event's text


class KernelUnavailable(Exception):
    """The kernel died, restarted or was shut down: what was sent to it is lost."""

    error_type = "kernel_unavailable"


class KernelTimeout(Exception):
    """Our own snippet took too long: the kernel was interrupted (the person's cells go on)."""

    error_type = "kernel_timeout"


class NotebookNotFound(LookupError):
    """No open notebook of that path (no kernel runs for it), or no such file."""

    error_type = "notebook_not_found"


@dataclass
class Output:
    """What one execution in the kernel showed, kept as it comes within ``room`` bytes.

    The bytes are counted as JSON encodes the text in an event (a control
    character takes six), and whatever does not fit is counted, never kept:
    a kernel that prints or displays without end costs no more than ``room``.
    """

    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    displays: list[str] = field(default_factory=list)
    images: list[dict[str, str]] = field(default_factory=list)
    error: dict[str, Any] | None = None

    room: int = MAX_OUTPUT_BYTES
    stream_limit: int = MAX_STREAM_CHARS
    # The same output as nbformat outputs, for a cell, when asked (``Kernels.execute``'s
    # ``cell_room``), and the execution count the kernel gave the code.
    cell: CellOutputs | None = None
    execution_count: int | None = None
    # A quarter of the room is kept for what comes last and says most: the
    # result, or the error (what ran before cannot crowd them out).
    reserve: int = 0
    # What was left out: characters of each stream, whole displays and images.
    stdout_left_out: int = 0
    stderr_left_out: int = 0
    displays_left_out: int = 0
    images_left_out: int = 0
    image_bytes_left_out: int = 0

    def __post_init__(self) -> None:
        self.reserve = self.room // 4
        self.room -= self.reserve

    def add_stream(self, name: str, text: str) -> None:
        stream = "stderr" if name == "stderr" else "stdout"
        shown = getattr(self, stream)
        kept = self._keep(text[: max(0, self.stream_limit - len(shown))])
        setattr(self, stream, shown + kept)
        left_out = f"{stream}_left_out"
        setattr(self, left_out, getattr(self, left_out) + len(text) - len(kept))

    def add_data(self, data: dict[str, Any], result: bool) -> None:
        for mime in IMAGE_MIMES:
            image = data.get(mime)
            if isinstance(image, str):
                # (Measured only when it may fit: encoding a huge one would copy it.)
                fits = len(image) + PART_BYTES <= self.room
                size = encoded_size(image) + PART_BYTES if fits else self.room + 1
                if size <= self.room:
                    self.room -= size
                    self.images.append({"mime": mime, "data": image.strip()})
                else:
                    self.images_left_out += 1
                    self.image_bytes_left_out += len(image) * 3 // 4
        text = data.get("text/plain")
        if not isinstance(text, str):
            return
        if result:
            self._take_reserve()
            self.result = self._keep_whole(text)
        elif not any(mime.startswith("image/") for mime in data):
            if self.room < PART_BYTES:
                self.displays_left_out += 1
            else:
                self.room -= PART_BYTES
                self.displays.append(self._keep_whole(text))

    def add_error(self, content: dict[str, Any]) -> None:
        self._take_reserve()
        traceback = ANSI.sub("", "\n".join(str(line) for line in content.get("traceback") or []))
        self.error = {
            "ename": self._keep_whole(str(content.get("ename")), 200),
            "evalue": self._keep_whole(str(content.get("evalue")), 2000),
            "traceback": self._keep_whole(traceback),
        }

    def left_out(self) -> str | None:
        """What was not kept, in words, or None when everything was."""
        parts = []
        if self.displays_left_out:
            parts.append(f"{self.displays_left_out} more displays")
        if self.images_left_out:
            parts.append(f"{self.images_left_out} more images ({self.image_bytes_left_out} bytes)")
        if not parts:
            return None
        return f"… ({' and '.join(parts)} not shown: the output is larger than a tool call keeps)"

    def _take_reserve(self) -> None:
        self.room += self.reserve
        self.reserve = 0

    def _keep(self, text: str) -> str:
        kept = fitting(text, self.room)
        self.room -= encoded_size(kept)
        return kept

    def _keep_whole(self, text: str, limit: int = MAX_TEXT_CHARS) -> str:
        """One piece of text, cut to what fits, saying how much was left out."""
        if len(text) <= limit and encoded_size(text) <= self.room:
            return self._keep(text)
        kept = fitting(text[:limit], self.room - NOTE_BYTES)
        kept += left_out_note(len(text) - len(kept))
        self.room = max(0, self.room - encoded_size(kept))
        return kept


class CellOutputs:
    """nbformat outputs (stream, display_data, execute_result, error), kept within ``room`` bytes.

    Counted as JSON encodes them; what does not fit is left out, never a
    failure: a stream's text is cut, any other output that does not fit whole
    is dropped, and one last ``stderr`` stream says what was left out.
    """

    def __init__(self, room: int):
        # (The note saying what was left out always has its room, and so do the list's brackets.)
        self.full_room = self.room = max(0, room - CELL_NOTE_BYTES - 2)
        self.outputs: list[dict[str, Any]] = []
        self.outputs_left_out = 0
        self.characters_left_out = 0
        self.clear_waits = False  # a clear_output(wait=True): cleared by the next output

    def clear(self, wait: bool = False) -> None:
        """``clear_output``: what was shown goes (with ``wait``, when the next output comes)."""
        if wait:
            self.clear_waits = True
            return
        self.clear_waits = False
        self.room = self.full_room
        self.outputs = []
        self.outputs_left_out = self.characters_left_out = 0

    def add(self, output: dict[str, Any]) -> None:
        """Keep one nbformat output (a stream goes on the previous one of the same name)."""
        if self.clear_waits:
            self.clear()
        kind = output.get("output_type")
        if kind == "stream":
            self._add_stream(str(output.get("name") or "stdout"), _joined(output.get("text")))
            return
        if kind not in ("display_data", "execute_result", "error"):
            return
        kept = {key: value for key, value in output.items() if key != "transient"}
        # A rough size first: a huge image is not encoded just to learn it does not fit.
        if _rough_size(kept) <= self.room:
            size = json_size(kept) + 1  # (and its comma)
            if size <= self.room:
                self.room -= size
                self.outputs.append(kept)
                return
        if kind == "error":
            # The error's name and value say most: the traceback goes first.
            kept["traceback"] = []
            size = json_size(kept) + 1
            if size <= self.room:
                self.room -= size
                self.outputs.append(kept)
                self.characters_left_out += sum(
                    len(str(line)) for line in output.get("traceback") or []
                )
                return
        self.outputs_left_out += 1

    def _add_stream(self, name: str, text: str) -> None:
        last = self.outputs[-1] if self.outputs else None
        if last is not None and last.get("output_type") == "stream" and last.get("name") == name:
            kept = fitting(text, self.room)
            last["text"] += kept
        else:
            opened = {"output_type": "stream", "name": name, "text": ""}
            overhead = json_size(opened) + 1
            if overhead >= self.room:
                self.outputs_left_out += 1
                self.characters_left_out += len(text)
                return
            self.room -= overhead
            kept = fitting(text, self.room)
            opened["text"] = kept
            self.outputs.append(opened)
        self.room -= encoded_size(kept)
        self.characters_left_out += len(text) - len(kept)

    def kept(self) -> list[dict[str, Any]]:
        """The outputs kept, and a note of what was not, if anything was not."""
        outputs = [dict(output) for output in self.outputs]
        parts = []
        if self.characters_left_out:
            parts.append(f"{self.characters_left_out} characters")
        if self.outputs_left_out:
            plural = "s" if self.outputs_left_out != 1 else ""
            parts.append(f"{self.outputs_left_out} output{plural}")
        if parts:
            note = f"… ({' and '.join(parts)} not kept: more output than a notebook edit keeps)"
            outputs.append({"output_type": "stream", "name": "stderr", "text": note + "\n"})
        return outputs


def fit_outputs(outputs: list[dict[str, Any]], room: int) -> list[dict[str, Any]]:
    """``outputs`` (nbformat) within ``room`` bytes of JSON, saying what was left out (:class:`CellOutputs`).

    Outputs that fit are kept as they are (so outputs fitted once are not cut again).
    """
    if _rough_size(outputs) <= room and json_size(outputs) <= room:
        return copy.deepcopy(outputs)
    cell = CellOutputs(room)
    for output in outputs:
        if isinstance(output, dict):
            cell.add(output)
    return cell.kept()


def json_size(value: Any) -> int:
    """The bytes ``value`` takes as JSON (ASCII, as the store encodes an event)."""
    return len(json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str))


def _rough_size(value: Any) -> int:
    """At most a little more than ``json_size`` for plain text, at least the characters held."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(key)) + _rough_size(item) for key, item in value.items())
    if isinstance(value, list):
        return sum(_rough_size(item) for item in value)
    return 8


def _joined(text: Any) -> str:
    """An nbformat text (a string, or a list of lines) as one string."""
    if isinstance(text, list):
        return "".join(str(line) for line in text)
    return text if isinstance(text, str) else ""


def bounded(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + left_out_note(len(text) - limit)


def left_out_note(characters: int) -> str:
    return f"\n… ({characters} more characters not shown)"


def encoded_size(text: str) -> int:
    """The bytes ``text`` takes in an event's JSON (without its quotes)."""
    return len(_quote(text)) - 2


def fitting(text: str, room: int) -> str:
    """The longest start of ``text`` that takes at most ``room`` bytes in JSON."""
    if room <= 0:
        return ""
    text = text[:room]  # each character takes one byte or more
    if encoded_size(text) <= room:
        return text
    low, high = 0, len(text)  # low fits, high does not
    while high - low > 1:
        middle = (low + high) // 2
        if encoded_size(text[:middle]) <= room:
            low = middle
        else:
            high = middle
    return text[:low]


def cut_to(text: str, room: int) -> str:
    """``text`` within ``room`` bytes of JSON, saying how much was left out when it was cut."""
    if encoded_size(text) <= room:
        return text
    kept = fitting(text, room - NOTE_BYTES)
    return kept + left_out_note(len(text) - len(kept))


class Kernels:
    """The server's kernels and notebooks, as the notebook tools use them.

    ``kernel_manager``, ``session_manager`` and ``contents_manager`` are the
    server's own (jupyter_server's managers; only their documented methods are used).
    """

    def __init__(self, kernel_manager: Any, session_manager: Any, contents_manager: Any):
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.contents_manager = contents_manager

    async def kernel_of(self, notebook: str) -> str:
        """The id of the kernel of the open notebook ``notebook`` (relative to the server's root)."""
        wanted = notebook.strip("/")
        for session in await ensure_async(self.session_manager.list_sessions()):
            if (session.get("path") or "").strip("/") == wanted and session.get("kernel"):
                return session["kernel"]["id"]
        raise NotebookNotFound(
            f"no kernel runs for the notebook {notebook!r}: open it (its path is relative to "
            "the server's root) and start its kernel"
        )

    async def notebook_of(self, kernel_id: str) -> str | None:
        """The path of the notebook whose kernel this is, when one is open with it."""
        for session in await ensure_async(self.session_manager.list_sessions()):
            if (session.get("kernel") or {}).get("id") == kernel_id:
                return session.get("path")
        return None

    def running(self, kernel_id: str | None) -> bool:
        """Whether ``kernel_id`` is one of this server's kernels now."""
        return kernel_id is not None and kernel_id in self.kernel_manager

    def _manager(self, kernel_id: str) -> Any:
        if kernel_id not in self.kernel_manager:
            raise KernelUnavailable(
                "the notebook's kernel is gone (shut down, or the server restarted): "
                "re-run the cell that started the run in a running kernel"
            )
        return self.kernel_manager.get_kernel(kernel_id)

    async def execute(
        self,
        kernel_id: str,
        code: str,
        *,
        silent: bool = False,
        on_waiting: Callable[[bool], Awaitable[None]] | None = None,
        stream_limit: int = MAX_STREAM_CHARS,
        room: int = MAX_OUTPUT_BYTES,
        timeout: float | None = None,
        store_history: bool = False,
        cell_room: int | None = None,
    ) -> Output:
        """Run ``code`` in the kernel and collect what it shows (at most ``room`` bytes of it).

        Cancelled (the run was cancelled, or the caller went away), the kernel
        is interrupted, not restarted, if it still runs our code. ``timeout``:
        seconds it may take, waiting included; past them the kernel is
        interrupted the same way and ``KernelTimeout`` raised. A kernel that
        dies or restarts meanwhile raises ``KernelUnavailable``.
        ``on_waiting(True)`` is awaited when the code has to wait for the
        kernel to finish something else, and ``on_waiting(False)`` when it goes.
        ``store_history``: the code counts as a cell the person ran (its
        execution count, ``Out``, ``_``). ``cell_room``: the output is also kept
        as nbformat outputs within that many bytes (``Output.cell``).
        """
        run = self._execute(
            kernel_id, code, silent, on_waiting, stream_limit, room, store_history, cell_room
        )
        if timeout is None:
            return await run
        try:
            return await asyncio.wait_for(run, timeout)
        except asyncio.TimeoutError:
            raise KernelTimeout(
                f"the kernel did not answer within {timeout:g} seconds (it was busy, or the "
                "variable is slow to look at): what we ran was interrupted, the notebook's "
                "variables are kept"
            ) from None

    async def _execute(
        self,
        kernel_id: str,
        code: str,
        silent: bool,
        on_waiting: Callable[[bool], Awaitable[None]] | None,
        stream_limit: int,
        room: int,
        store_history: bool = False,
        cell_room: int | None = None,
    ) -> Output:
        manager = self._manager(kernel_id)
        process = _process(manager)
        told = False
        # Sent only once the person's cell is done: a request queued behind it
        # could not be taken back if the run were cancelled meanwhile.
        while getattr(manager, "execution_state", "idle") == "busy":
            if not told and on_waiting is not None:
                told = True
                await on_waiting(True)
            await asyncio.sleep(POLL_SECONDS / 5)
            await self._check(kernel_id, manager, process)
        if told and on_waiting is not None:  # (told only when there is one)
            await on_waiting(False)
        client = manager.client()
        client.start_channels()
        msg_id = None
        ours = False  # the kernel began on our request (it said busy for it)
        try:
            msg_id = client.execute(
                code, silent=silent, store_history=store_history, allow_stdin=False
            )
            output = Output(room=room, stream_limit=stream_limit)
            if cell_room is not None:
                output.cell = CellOutputs(cell_room)
            reply = None  # the kernel's answer on the shell channel, once read
            while True:
                try:
                    msg = await client.get_iopub_msg(timeout=POLL_SECONDS)
                except queue.Empty:
                    await self._check(kernel_id, manager, process)
                    if reply is not None:
                        # The kernel answered and has said nothing since, a whole
                        # poll long: its "idle" was lost (ZeroMQ drops what a flood
                        # leaves unread). Its answer still says whether it failed.
                        if output.error is None and reply["content"].get("status") == "error":
                            output.add_error(reply["content"])
                            if output.cell is not None:
                                output.cell.add(_error_output(reply["content"]))
                        return output
                    # (The answer may come before the last outputs: they are read first.)
                    reply = await _reply(client, msg_id)
                    continue
                kind, content = msg["msg_type"], msg["content"]
                restarted = content.get("execution_state") in ("starting", "restarting")
                if ours and kind == "status" and restarted:
                    # (Before ours began, that is a new kernel's first word.)
                    raise KernelUnavailable("the kernel restarted while the code ran")
                if kind == "shutdown_reply":
                    # Asked to stop (a restart or a shutdown): what runs is lost,
                    # whether or not the kernel says so before it goes.
                    how = "restarted" if content.get("restart") else "was shut down"
                    raise KernelUnavailable(f"the kernel {how} while the code ran")
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if kind == "status":
                    if content["execution_state"] == "busy":
                        ours = True
                    elif content["execution_state"] == "idle":
                        ours = False
                        if getattr(manager, "shutting_down", False) or _process(manager) != process:
                            # Stopped by a restart or shutdown (it interrupts what
                            # runs, with or without an error to show for it).
                            raise KernelUnavailable("the kernel restarted while the code ran")
                        return output
                elif kind == "stream":
                    output.add_stream(content.get("name", "stdout"), content.get("text", ""))
                elif kind in ("execute_result", "display_data"):
                    output.add_data(content.get("data") or {}, result=kind == "execute_result")
                elif kind == "error":
                    output.add_error(content)
                elif kind == "execute_input" and isinstance(content.get("execution_count"), int):
                    output.execution_count = content["execution_count"]
                if output.cell is not None and kind in CELL_OUTPUT_TYPES:
                    output.cell.add(_cell_output(kind, content))
                elif output.cell is not None and kind == "clear_output":
                    output.cell.clear(bool(content.get("wait")))
        except asyncio.CancelledError:
            # Only what we sent, and only while it runs: a cell of the person's
            # that got in first, or came after ours ended, is theirs.
            if ours:
                await asyncio.shield(self._interrupt_ours(kernel_id, client, msg_id))
            raise
        finally:
            client.stop_channels()

    async def _interrupt_ours(self, kernel_id: str, client: Any, msg_id: str | None) -> None:
        if not await _ended(client, msg_id) and kernel_id in self.kernel_manager:
            await ensure_async(self.kernel_manager.interrupt_kernel(kernel_id))

    async def _check(self, kernel_id: str, manager: Any, process: Any) -> None:
        if (
            kernel_id not in self.kernel_manager
            or self.kernel_manager.get_kernel(kernel_id) is not manager
        ):
            raise KernelUnavailable("the kernel was shut down while the code ran")
        if _process(manager) != process:
            raise KernelUnavailable("the kernel restarted while the code ran")
        if not await ensure_async(manager.is_alive()):
            raise KernelUnavailable("the kernel died while the code ran")

    async def introspect(self, kernel_id: str, code: str) -> Any:
        """Run one of our own snippets silently; it prints one JSON value, which is returned."""
        output = await self.execute(
            kernel_id,
            code,
            silent=True,
            stream_limit=MAX_INTROSPECTION_CHARS,
            room=6 * MAX_INTROSPECTION_CHARS,
            timeout=INTROSPECTION_SECONDS,
        )
        if output.error is not None:
            raise RuntimeError(f"{output.error['ename']}: {output.error['evalue']}")
        try:
            return json.loads(output.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RuntimeError(
                "the kernel's answer could not be read (something else printed, or it was too long)"
            ) from None

    def read_notebook(
        self,
        path: str,
        notebook: dict[str, Any],
        seen: dict[str, str] | None = None,
        where: str = "as last saved",
    ) -> str:
        """The notebook's cells (its content ``notebook``): id, source and text outputs, bounded.

        ``seen`` gets the source of each cell shown whole, by cell id;
        ``where``: which copy of the notebook it is, for the reader.
        """
        parts: list[str] = [f"Notebook {path} ({where})"]
        total = 0
        cells = notebook.get("cells") or []
        for index, cell in enumerate(cells):
            text = _cell_text(index, cell)
            total += len(text)
            if total > MAX_NOTEBOOK_CHARS:
                parts.append(f"… ({len(cells) - index} more cells not shown)")
                break
            parts.append(text)
            source = cell.get("source") or ""
            source = "".join(source) if isinstance(source, list) else source
            if seen is not None and cell.get("id") and len(source) <= MAX_CELL_CHARS:
                seen[cell["id"]] = source
        return "\n\n".join(parts)


CELL_OUTPUT_TYPES = ("stream", "display_data", "execute_result", "error")


def _cell_output(kind: str, content: dict[str, Any]) -> dict[str, Any]:
    """An iopub message's content as the nbformat output a notebook keeps."""
    if kind == "stream":
        return {"output_type": "stream", "name": content.get("name", "stdout"),
                "text": content.get("text", "")}  # fmt: skip
    if kind == "error":
        return _error_output(content)
    output = {"output_type": kind, "data": content.get("data") or {},
              "metadata": content.get("metadata") or {}}  # fmt: skip
    if kind == "execute_result":
        output["execution_count"] = content.get("execution_count")
    return output


def _error_output(content: dict[str, Any]) -> dict[str, Any]:
    return {
        "output_type": "error",
        "ename": str(content.get("ename")),
        "evalue": str(content.get("evalue")),
        "traceback": [str(line) for line in content.get("traceback") or []],
    }


async def _reply(client: Any, msg_id: str | None) -> dict[str, Any] | None:
    """The kernel's answer to ``msg_id`` (on the shell channel), if it came."""
    while True:
        try:
            msg = await client.get_shell_msg(timeout=0)
        except queue.Empty:
            return None
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


async def _ended(client: Any, msg_id: str | None) -> bool:
    """Whether the kernel said it is done with ``msg_id`` in what its client holds unread."""
    while True:
        try:
            msg = await client.get_iopub_msg(timeout=0)
        except queue.Empty:
            return False
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"].get("execution_state") == "idle"
        ):
            return True


def _process(manager: Any) -> Any:
    """What identifies the kernel's process: a restart makes a new one."""
    provisioner = getattr(manager, "provisioner", None)
    return (id(provisioner), getattr(provisioner, "pid", None))


def _cell_text(index: int, cell: dict[str, Any]) -> str:
    source = cell.get("source") or ""
    if isinstance(source, list):
        source = "".join(source)
    lines = [f"[{index}] {cell.get('cell_type', 'code')} cell {cell.get('id', '')}".rstrip()]
    stamp = (cell.get("metadata") or {}).get("agentruns")
    if isinstance(stamp, dict):
        # A cell an agent wrote: the model knows which of the notebook's cells are whose.
        lines[0] += (
            f" (written by an agent: run {stamp.get('run_id')}, edit {stamp.get('edit_id')})"
        )
    lines.append(bounded(source, MAX_CELL_CHARS))
    for output in cell.get("outputs") or []:
        kind = output.get("output_type")
        if kind == "stream":
            text = output.get("text") or ""
            text = "".join(text) if isinstance(text, list) else text
        elif kind in ("execute_result", "display_data"):
            data = output.get("data") or {}
            text = data.get("text/plain") or ""
            text = "".join(text) if isinstance(text, list) else text
            images = [mime for mime in data if mime.startswith("image/")]
            if images:
                text = f"{text}\n[{', '.join(images)}]".strip()
        elif kind == "error":
            text = f"{output.get('ename')}: {output.get('evalue')}"
        else:
            continue
        lines.append("Output: " + bounded(ANSI.sub("", text), MAX_CELL_CHARS // 2))
    return "\n".join(lines)
