"""Agents the tests register with ``c.AgentRuns.agents``."""

import asyncio
import os
import time

import rawdb

from jupyter_agentruns import agent

finally_ran: list[str] = []
thread_emits: dict[str, int] = {}
# run_id -> what a paced_writer run waits for between its batches of words (set by the test).
gates: dict[str, asyncio.Event] = {}


@agent(input_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
def counter(run, input):
    """A plain function: runs in a worker thread, emits through the same ordered path."""
    for index in range(input.get("n", 10)):
        run.text(f"{index} ")
        thread_emits[run.run_id] = index + 1
        time.sleep(input.get("sleep", 0))
    return {"count": input.get("n", 10)}


async def crashes(run, input):
    await run.progress(0.5, "about to fail")
    raise FileNotFoundError("/home/someone/secret/project/data.csv is missing")


async def huge_event(run, input):
    await run.text("x" * 5000)
    return {}


async def oversized_step(run, input):
    async with run.tool("fetch", {"url": "https://example.org/big"}) as call:
        call.result = "x" * 5000
    return {}


async def bad_output(run, input):
    return {"not json": object()}


async def nan_output(run, input):
    await run.progress(0.5, "almost")
    return {"mean": float("nan")}


async def reserved_type(run, input):
    await run.emit("run.succeeded", {"output": "forged"})


async def sleeper(run, input):
    try:
        async with run.tool("wait", {"seconds": 60}) as call:
            await asyncio.sleep(60)
            call.result = "woke"
    finally:
        finally_ran.append(run.run_id)


async def durable_count(run, input):
    """Emits, waits for durability, then counts its own events in the database file."""
    for index in range(input["n"]):
        await run.text(f"{index} ")
    await run.durable()
    db = rawdb.connect(os.environ["AGENTRUNS_TEST_DB"])
    try:
        stored = db.execute(
            "SELECT count(*) FROM events WHERE run_id = ?", [run.run_id]
        ).fetchone()[0]
    finally:
        db.close()
    return {"stored": stored, "emitted": input["n"] + 2}


async def tool_user(run, input):
    async with run.tool("lookup", {"q": "x"}) as call:
        call.result = {"found": True}
    try:
        async with run.tool("broken", {}):
            raise KeyError("missing")
    except KeyError:
        pass
    await run.custom("chart", {"kind": "bar"})
    return "ok"


async def stubborn(run, input):
    """Ignores cancellation: the executor must end the run anyway."""
    await run.text("working")
    while True:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            continue


async def slow_to_stop(run, input):
    """Cancelled, its ``finally`` block takes ``seconds``: a stopping server waits that long.

    With ``until`` (a path), it ends as soon as that file exists: the test ends the stop.
    """
    await run.text("working")
    try:
        await asyncio.sleep(3600)
    finally:
        deadline = time.monotonic() + input.get("seconds", 1)
        until = input.get("until")
        while time.monotonic() < deadline and not (until and os.path.exists(until)):
            await asyncio.sleep(0.01)


async def big_text(run, input):
    """``n`` text deltas of ``size`` characters each, as fast as the store takes them."""
    piece = "y" * input.get("size", 1000)
    for _ in range(input["n"]):
        await run.text(piece)
    return {}


async def paced_writer(run, input):
    """Numbered words ("0 1 2 ..."), ``batches`` of them, waiting for its gate after each batch."""
    gate = gates.setdefault(run.run_id, asyncio.Event())
    words = 0
    for batch in input["batches"]:
        for _ in range(batch):
            await run.text(f"{words} ")
            words += 1
        await gate.wait()
        gate.clear()
    return {"words": words}


def sleepy(run, input):
    """A plain function that blocks before its first event."""
    time.sleep(input.get("seconds", 30))
    run.text("woke up")
    return "late"


MARKDOWN_ANSWER = """## Weather in Shanghai

Three sources agree on a **mild, wet** week:

- Monday: showers, 18–22 °C
- Tuesday: cloudy
- Wednesday: sun, at last

| day | low | high |
|-----|-----|------|
| Mon | 18 | 22 |
| Tue | 17 | 21 |

```python
forecast = {"mon": (18, 22), "tue": (17, 21), "wed": (19, 25)}  # a line long enough \
to scroll sideways rather than wrap
```

Source: [the open data portal](https://example.org/weather).
"""


async def markdown_writer(run, input):
    """A run with a bit of everything the view shows.

    A tool, progress, a custom event, Markdown and usage.
    """
    delay = input.get("delay", 0.02)
    await run.progress(0.0, "looking up")
    async with run.tool("forecast", {"city": "Shanghai", "days": 3}) as call:
        await asyncio.sleep(delay)
        call.result = {"days": 3, "source": "open data"}
    message = await run.message_started()
    for start in range(0, len(MARKDOWN_ANSWER), 24):
        await run.text(MARKDOWN_ANSWER[start : start + 24], message)
        await asyncio.sleep(delay)
        if start == 240:
            await run.custom("chart", {"kind": "bar", "title": "Rain by day", "values": [12, 3, 0]})
    await run.message_completed(message)
    await run.progress(1.0, "done")
    await run.usage(input_tokens=12, output_tokens=180)
    return {"ok": True}


HOSTILE_ANSWER = (
    "Fine text, then <img src=x onerror=\"window.agentrunsPwned = 'img'\">"
    "<script>window.agentrunsPwned = 'script'</script>"
    " and [a link](javascript:window.agentrunsPwned='link')"
    " and <style>body { display: none }</style>."
)


async def hostile_writer(run, input):
    """Model output that tries to run script in the page and restyle it."""
    await run.text(HOSTILE_ANSWER)
    return {}


async def writer(run, input):
    """Writes the text it is given, as a model would (a prompt-injected one, say)."""
    await run.text(input["text"])
    return {}


async def asker(run, input):
    """Asks the questions it is given (title, choices, timeout) one after another; says the answers."""
    answers = []
    for question in input.get("questions", [{"title": "Go on?"}]):
        try:
            choice = await run.ask(
                question["title"],
                details=question.get("details"),
                choices=question.get("choices", ["approve", "deny"]),
                kind=question.get("kind", "approval"),
                timeout=question.get("timeout"),
            )
        except TimeoutError as exc:
            choice = f"timeout: {exc}"
        answers.append(choice)
        await run.text(f"{question['title']} {choice}. ")
    return {"answers": answers}


def thread_asker(run, input):
    """A plain function asking from its worker thread."""
    choice = run.ask("From a thread?", choices=["yes", "no"], kind="choice")
    run.text(f"the thread heard {choice}")
    return {"choice": choice}


async def spender(run, input):
    """Reports the usage totals it is given, a word of text between each; ``swallow`` catches what that raises.

    ``in_step``: all of it inside a tool step it never ends itself."""
    if input.get("in_step"):
        await run.tool_started("spend", {})
    for input_tokens, output_tokens in input.get("steps", []):
        await run.text("word ")
        try:
            await run.usage(input_tokens=input_tokens, output_tokens=output_tokens)
        except Exception:
            if not input.get("swallow"):
                raise
            await run.text("went on regardless ")
    return {"spent": input.get("steps", [])[-1:]}


@agent(resumable=True)
async def forged_demo(run, input):
    """Another server's agent of the built-in's name, with its own keys and tools: never for your runs."""
    await run.text("forged")
    return {"forged": True}


async def echo(run, input):
    """Writes its input's ``text`` everywhere a run shows text: progress, a tool, the answer, a question, a failure."""
    text = input["text"]
    await run.progress(0.5, text)
    async with run.tool(text, {"about": text}) as call:
        call.result = text
    await run.text(text)
    if input.get("ask"):
        await run.ask(text, choices=[text, "no"])
    raise RuntimeError(text)


async def stepper(run, input):
    """Thinks, plans, reads and edits, as a coding agent's turn is recorded; or hands over ``bad``."""
    if input.get("bad") == "plan":
        await run.plan([{"content": "x", "status": "maybe"}])
    if input.get("bad") == "content":
        call = await run.tool_started("edit", {}, kind="edit", title="Edit a.py")
        await run.tool_completed(call, content=[{"type": "diff", "path": "a.py"}])
    await run.reasoning("Look at the file, ")
    await run.plan([{"content": "Read a.py", "status": "in_progress", "priority": "high"}])
    await run.reasoning("then change it.")
    call = await run.tool_started("read", {"path": "a.py"}, kind="read", title="Read a.py")
    await run.tool_completed(call, content=[{"type": "text", "text": "x = 1"}])
    call = await run.tool_started("edit", {"path": "a.py"}, kind="edit", title="Edit a.py")
    diff = {"type": "diff", "path": "a.py", "old_text": "x = 1\n", "new_text": "x = 2\n"}
    await run.tool_completed(call, content=[diff])
    await run.plan([{"content": "Read a.py", "status": "completed", "priority": "high"}])
    await run.text("Done.")
    return {"changed": "a.py"}


PERMISSION_OPTIONS = [
    {"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"},
    {"optionId": "proceed_always", "name": "Always allow edits", "kind": "allow_always"},
    {"optionId": "cancel", "name": "Reject", "kind": "reject_once"},
]
PLOT_BEFORE = 'import pandas as pd\n\ndata = pd.read_csv("data.csv")\nprint(data.mean())\n'
PLOT_AFTER = (
    "import matplotlib.pyplot as plt\nimport pandas as pd\n\n"
    'data = pd.read_csv("data.csv")\ndata.mean().plot.bar()\nplt.savefig("mean.png")\n'
)


async def permission_asker(run, input):
    """Asks before an edit as an ACP agent asks for permission: the agent's option ids as the
    choices, their names (``options``, else PERMISSION_OPTIONS) and the tool step in
    ``details``; edits only if allowed."""
    options = input.get("options", PERMISSION_OPTIONS)
    await run.reasoning("The user wants a chart of the means. plot.py only prints them; ")
    await run.reasoning("it should draw them as a bar chart.")
    plan = [
        {"content": "Read plot.py", "status": "completed"},
        {"content": "Draw the means as a bar chart", "status": "in_progress", "priority": "high"},
        {"content": "Run plot.py", "status": "pending", "priority": "low"},
    ]
    await run.plan(plan)
    diff = {"type": "diff", "path": "plot.py", "old_text": PLOT_BEFORE, "new_text": PLOT_AFTER}
    call = await run.tool_started("edit", {"path": "plot.py"}, kind="edit", title="Edit plot.py")
    choice = await run.ask(
        "Allow editing plot.py?",
        details={
            "options": options,
            "tool": {"title": "Edit plot.py", "kind": "edit", "content": [diff]},
        },
        choices=[option["optionId"] for option in options],
        kind="permission",
    )
    if choice == "cancel":
        await run.tool_completed(
            call, ok=False, error={"type": "rejected", "message": "not allowed"}
        )
        await run.text("I left plot.py as it was.")
        return {"choice": choice}
    await run.tool_completed(call, content=[diff])
    await run.plan([plan[0], {**plan[1], "status": "completed"}, plan[2]])
    await run.text("`plot.py` now draws the means as a bar chart.")
    return {"choice": choice}


@agent(
    input_schema={
        "type": "object",
        "properties": {
            "prompt": {"type": "string"},
            "to": {"type": "integer"},
            "start": {"type": "integer"},
        },
        "required": ["prompt", "to"],
    }
)
async def forking_counter(run, input):
    """Counts from ``start`` (0) to ``to``, a step each, then says the prompt: it forks after
    the steps that had ended."""
    for n in range(input.get("start", 0), input["to"]):
        async with run.tool("count", {"n": n}) as call:
            call.result = n
    await run.text(f"counted to {input['to']}: {input['prompt']}")
    return {"counted_to": input["to"]}


def _fork_counter(point):
    done = sum(step["status"] == "completed" for step in point.snapshot["tools"])
    return {**point.input, "start": point.input.get("start", 0) + done}


forking_counter.fork = _fork_counter


TEST_AGENTS = {
    name: f"agents_for_tests:{name}"
    for name in (
        "asker",
        "thread_asker",
        "spender",
        "counter",
        "crashes",
        "huge_event",
        "oversized_step",
        "bad_output",
        "reserved_type",
        "sleeper",
        "durable_count",
        "tool_user",
        "stubborn",
        "slow_to_stop",
        "sleepy",
        "big_text",
        "paced_writer",
        "nan_output",
        "markdown_writer",
        "notebook_mcp_client",
        "hostile_writer",
        "echo",
        "stepper",
        "permission_asker",
        "writer",
        "forking_counter",
    )
}


async def notebook_mcp_client(run, input):
    """Calls the notebook tools over MCP (the SDK's client) with its run's token, as an agent
    of its own process would: ``input["calls"]`` is ``[[name, arguments], ...]``."""
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    server = run.notebook_tools.mcp_server()
    answers = []
    client = create_mcp_http_client(headers=server["headers"])
    async with client, streamable_http_client(server["url"], http_client=client) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            listed = await session.list_tools()
            for name, arguments in input["calls"]:
                result = await session.call_tool(name, arguments)
                answers.append({"error": result.is_error, "text": result.content[0].text})
    # The token goes out so that a test can try it once the run has ended.
    token = server["headers"]["Authorization"]
    return {"tools": sorted(t.name for t in listed.tools), "answers": answers, "token": token}


@agent(resumable=True)
async def notebook_editor(run, input):
    """Makes ``input["calls"]`` (``[[name, arguments], ...]``) with ``run.notebook_tools``, as a
    Python agent would; ``["wait", {}]`` asks a person first (a test changes the notebook
    meanwhile), ``["sleep", {"seconds": s}]`` pauses. Taken over, it settles the edits an
    earlier attempt left pending, and stops."""
    tools = run.notebook_tools
    if run.attempt > 1:
        settled = await tools.settle()
        return {"settled": [{"ok": o.ok, "text": o.text} for o in settled]}
    answers = []
    for name, arguments in input["calls"]:
        if name == "wait":
            await run.ask("Go on?")
            continue
        if name == "sleep":
            await asyncio.sleep(arguments["seconds"])
            continue
        outcome = await tools.call(name, arguments)
        answers.append({"ok": outcome.ok, "text": outcome.text, "result": outcome.result})
    return {"answers": answers}
