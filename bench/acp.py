"""The ACP scenarios: the scripted agent (tests/acp_agent.py) as a run, against a bare SDK client.

The baseline runs the same agent program with nothing but the ACP SDK's
client side in this process: what any ACP client pays to read it. Through
the server, each chunk is also a durable event served to an SSE client.
``acp-bridge`` reads runs the other way, as an editor does through
``jupyter agentruns acp``, against runs of the same agent and prompt read over SSE.
"""

from __future__ import annotations

import asyncio
import sys
import time
from array import array
from pathlib import Path

from . import clients
from .scenarios import Bench, Row, median, ms_percentiles, percentile, say, wait_terminal
from .servers import REPO, EngineServer

SCRIPTED = [sys.executable, str(REPO / "tests" / "acp_agent.py")]
CHUNKS = 20_000
CHUNKS_QUICK = 5_000
LATENCY_CHUNKS = 3_000
LATENCY_CHUNKS_QUICK = 1_000
RATE = 1_000
CONVERSATIONS = 20
CONVERSATIONS_QUICK = 5


def quick(bench: Bench) -> bool:
    return bench.sizes.big_events < 1_000_000


def acp_server(bench: Bench) -> EngineServer:
    state = bench.root / "acp-state"
    state.mkdir(exist_ok=True)
    return bench.server(
        "acp",
        sqlite_synchronous="NORMAL",
        max_agent_processes=100,
        acp_agents={
            "scripted": {"command": SCRIPTED, "env": {"ACP_TEST_STATE": str(state)}},
        },
    )


def run_in(bench: Bench, server: EngineServer, prompt: str, session: str) -> str:
    response = server.http.post(
        "runs", json={"agent": "scripted", "input": {"prompt": prompt}, "session": session}
    )
    if response.status_code != 201:
        raise RuntimeError(f"submit answered {response.status_code}: {response.text}")
    return response.json()["run_id"]


def warm(bench: Bench, server: EngineServer, session: str) -> None:
    """A conversation whose agent has started: what a measurement then reads is the agent's text."""
    run_id = run_in(bench, server, "echo warm", session)
    wait_terminal(server, [run_id], timeout=120)


async def served(server: EngineServer, run_id: str, go: Path) -> tuple[int, float]:
    """(text deltas, seconds from ``go`` to the run's end) read by an SSE client."""
    stream = await clients.open_stream(
        server.port, f"/api/agentruns/runs/{run_id}/events", server.headers
    )
    start = time.perf_counter()
    go.touch()
    count, _ = await clients.count_deltas(stream)
    return count, time.perf_counter() - start


async def bare(prompt: str, go: Path, state: Path, on_chunk=None) -> tuple[int, float]:
    """(chunks, seconds from ``go`` to the answer) of the agent read by the SDK's client alone."""
    import acp

    class Reader:
        count = 0

        async def session_update(self, session_id, update, **kwargs):
            Reader.count += 1
            if on_chunk is not None:
                on_chunk(update)

        async def request_permission(self, **kwargs):
            raise RuntimeError("not asked in the bench")

    env = {"ACP_TEST_STATE": str(state)}
    async with acp.spawn_agent_process(Reader(), *SCRIPTED, env=env) as (conn, _):
        await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        session = await conn.new_session(cwd=str(state), mcp_servers=[])
        answer = asyncio.ensure_future(
            conn.prompt(session_id=session.session_id, prompt=[acp.text_block(prompt)])
        )
        await asyncio.sleep(0.2)
        start = time.perf_counter()
        go.touch()
        await answer
        return Reader.count, time.perf_counter() - start


def throughput(bench: Bench) -> None:
    """The scripted agent's message chunks as fast as it sends them: durable and served, vs read bare."""
    chunks = CHUNKS_QUICK if quick(bench) else CHUNKS
    server = acp_server(bench)
    warm(bench, server, "throughput")
    samples, baseline = [], []
    for rep in range(bench.repeat):
        go = bench.path("go")
        count, seconds = asyncio.run(bare(f"flood {chunks} {go}", go, bench.root / "acp-state"))
        if count != chunks:
            raise RuntimeError(f"the bare client read {count} chunks of {chunks}")
        baseline.append(chunks / seconds)
        go = bench.path("go")
        run_id = run_in(bench, server, f"flood {chunks} {go}", "throughput")
        count, seconds = asyncio.run(served(server, run_id, go))
        if count != chunks:
            raise RuntimeError(f"the SSE client read {count} deltas of {chunks}")
        wait_terminal(server, [run_id])
        samples.append(chunks / seconds)
        say(
            f"  rep {rep + 1}/{bench.repeat}: bare {baseline[-1]:,.0f}, served {samples[-1]:,.0f} chunks/s"
        )
    value, base = median(samples), median(baseline)
    bench.add(Row(
        "acp-throughput", "ACP agent, chunks durable and served", value, "ev/s", base, value / base,
        target="≥ 0.7× bare SDK client", ok=value / base >= 0.7,
        note=f"{chunks:,} agent_message_chunk updates as fast as the agent sends them, read by an "
             "SSE client; baseline: the same agent read by the SDK's client alone",
        samples=samples, baseline_samples=baseline,
    ))  # fmt: skip


def latency(bench: Bench) -> None:
    """Agent chunk → SSE client latency at 1,000 chunks/s, vs the same chunk read bare."""
    chunks = LATENCY_CHUNKS_QUICK if quick(bench) else LATENCY_CHUNKS
    server = acp_server(bench)
    warm(bench, server, "latency")
    results, baseline = [], []
    with bench.profile(server, "acp-latency"):
        for rep in range(bench.repeat):
            go = bench.path("go")
            late = array("q")

            def stamp(update, late=late) -> None:
                late.append(time.time_ns() - int(update.content.text[:19]))

            prompt = f"stamped {chunks} {RATE} {go}"
            asyncio.run(bare(prompt, go, bench.root / "acp-state", stamp))
            baseline.append(ms_percentiles(late))
            go = bench.path("go")
            run_id = run_in(bench, server, f"stamped {chunks} {RATE} {go}", "latency")

            async def measure(run_id=run_id, go=go) -> array:
                stream = await clients.open_stream(
                    server.port, f"/api/agentruns/runs/{run_id}/events", server.headers
                )
                out = array("q")
                go.touch()
                await clients.latencies(stream, out)
                return out

            served_late = asyncio.run(measure())
            if len(served_late) != chunks:
                raise RuntimeError(f"the SSE client read {len(served_late)} deltas of {chunks}")
            wait_terminal(server, [run_id])
            results.append(ms_percentiles(served_late))
            say(f"  rep {rep + 1}/{bench.repeat}: bare p50/p99 {baseline[-1][0]:.2f}/"
                f"{baseline[-1][1]:.2f} ms, served {results[-1][0]:.2f}/{results[-1][1]:.2f} ms")  # fmt: skip
    for index, (label, limit) in enumerate((("p50", None), ("p99", 10.0))):
        value = median(r[index] for r in results)
        base = median(b[index] for b in baseline)
        bench.add(Row(
            "acp-latency", f"ACP agent chunk → SSE client, {label}", value, "ms", base, value / base,
            target=f"≤ {limit:g} ms" if limit else "", ok=value <= limit if limit else None,
            note=f"{chunks:,} chunks at {RATE:,}/s; baseline: read by the SDK's client alone; "
                 f"worst {max(r[2] for r in results):.1f} ms",
            samples=[r[index] for r in results], baseline_samples=[b[index] for b in baseline],
        ))  # fmt: skip


def conversations(bench: Bench) -> None:
    """The server's memory per idle ACP conversation (its agent process kept for the next run)."""
    count = CONVERSATIONS_QUICK if quick(bench) else CONVERSATIONS
    server = acp_server(bench)
    warm(bench, server, "memory-warm")  # the SDK's modules are loaded once for all
    time.sleep(1)
    before = server.rss()
    run_ids = [run_in(bench, server, "echo hi", f"memory-{n}") for n in range(count)]
    wait_terminal(server, run_ids, timeout=600)
    time.sleep(1)
    after = server.rss()
    per = (after - before) / count / 1024
    bench.add(Row(
        "acp-conversations", "server memory per idle ACP conversation", per, "KB",
        note=f"{count} conversations, each with its agent process kept (acp_idle_seconds); "
             f"server VmRSS {before / 2**20:.0f} → {after / 2**20:.0f} MB; the agents' own "
             "processes are not counted",
    ))  # fmt: skip


BRIDGE_PROMPTS = 20
BRIDGE_PROMPTS_QUICK = 8


async def through_bridge(server: EngineServer, prompts: list[str], go: Path | None):
    """An editor's turns through ``jupyter agentruns acp``: for each prompt, the seconds from
    ``session/prompt`` to the first update, and the characters of text the editor got with the
    seconds from ``go`` (touched once the turn started) to the turn's end."""
    import acp

    class Editor:
        text = 0
        first: float | None = None

        async def session_update(self, session_id, update, **kwargs):
            if Editor.first is None:
                Editor.first = time.perf_counter()
            if update.session_update == "agent_message_chunk":
                Editor.text += len(update.content.text)

        async def request_permission(self, **kwargs):
            raise RuntimeError("not asked in the bench")

    command = [
        sys.executable, "-m", "jupyter_agentruns.cli", "acp",
        "--url", f"http://127.0.0.1:{server.port}/", "--token", server.token, "--agent", "scripted",
    ]  # fmt: skip
    firsts, reads = [], []
    async with acp.spawn_agent_process(Editor(), *command, env=server.env) as (conn, _):
        await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        session = await conn.new_session(cwd=str(server.home), mcp_servers=[])
        for prompt in prompts:
            Editor.text, Editor.first = 0, None
            start = time.perf_counter()
            turn = asyncio.ensure_future(
                conn.prompt(session_id=session.session_id, prompt=[acp.text_block(prompt)])
            )
            if go is not None:  # once the run is under way (its agent waits for go)
                while not turn.done() and not any(
                    run["status"] == "running"
                    for run in server.http.get(
                        "runs", params={"session": session.session_id}
                    ).json()["runs"]
                ):
                    await asyncio.sleep(0.005)
                start = time.perf_counter()
                go.touch()
            await turn
            assert Editor.first is not None
            firsts.append(Editor.first - start)
            reads.append((Editor.text, time.perf_counter() - start))
    return firsts, reads


def bridge(bench: Bench) -> None:
    """An editor through the ACP bridge: its first update after a prompt, and text per second vs SSE."""
    chunks = CHUNKS_QUICK if quick(bench) else CHUNKS
    prompts = BRIDGE_PROMPTS_QUICK if quick(bench) else BRIDGE_PROMPTS
    characters = sum(len(f"chunk {index} ") for index in range(chunks))
    server = acp_server(bench)
    warm(bench, server, "bridge")
    # The first prompt of the session starts its agent's process: not what a turn costs.
    firsts = asyncio.run(through_bridge(server, ["echo hi"] * (prompts + 1), None))[0][1:]
    samples, baseline = [], []
    for rep in range(bench.repeat):
        go = bench.path("go")
        # The run starts streaming once go exists: the editor's first update is its start.
        [(text, seconds)] = asyncio.run(through_bridge(server, [f"flood {chunks} {go}"], go))[1]
        if text != characters:
            raise RuntimeError(f"the editor read {text} characters of {characters}")
        samples.append(text / seconds)
        go = bench.path("go")
        run_id = run_in(bench, server, f"flood {chunks} {go}", "bridge-sse")
        count, seconds = asyncio.run(served(server, run_id, go))
        if count != chunks:
            raise RuntimeError(f"the SSE client read {count} deltas of {chunks}")
        wait_terminal(server, [run_id])
        baseline.append(characters / seconds)
        say(
            f"  rep {rep + 1}/{bench.repeat}: bridge {samples[-1]:,.0f}, "
            f"SSE {baseline[-1]:,.0f} characters/s"
        )
    ordered = sorted(firsts)
    for label, fraction in (("p50", 0.5), ("p99", 0.99)):
        bench.add(Row(
            "acp-bridge", f"editor's first update after session/prompt, {label}",
            percentile(ordered, fraction) * 1000, "ms",
            note=f"{prompts} prompts (echo) through jupyter agentruns acp to the scripted ACP "
                 "agent on the server: submit, the agent's turn, the event, the bridge",
        ))  # fmt: skip
    value, base = median(samples), median(baseline)
    bench.add(Row(
        "acp-bridge", "editor's text through the bridge", value, "chars/s", base, value / base,
        target="≥ 0.7× SSE", ok=value / base >= 0.7,
        note=f"{chunks:,} chunks as fast as the agent sends them, read by an editor through "
             "jupyter agentruns acp; baseline: a run of the same agent and prompt read by an SSE client",
        samples=samples, baseline_samples=baseline,
    ))  # fmt: skip


SCENARIOS = {
    "acp-bridge": bridge,
    "acp-throughput": throughput,
    "acp-latency": latency,
    "acp-conversations": conversations,
}
