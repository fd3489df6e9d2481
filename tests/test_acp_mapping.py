"""What an ACP agent sends, as a run records it (pure), and the file system an agent sees."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest
from acp.schema import (
    ContentToolCallContent,
    FileEditToolCallContent,
    InitializeResponse,
    PermissionOption,
    TerminalToolCallContent,
    TextContentBlock,
    ToolCallUpdate,
)

from jupyter_agentruns.agents.acp import mapping
from jupyter_agentruns.agents.acp.client import Conversation
from jupyter_agentruns.agents.acp.files import Files, Refused

ROOT = "/srv/notebooks"


def text(value):
    return ContentToolCallContent(type="content", content=TextContentBlock(type="text", text=value))


def diff(path, old, new):
    return FileEditToolCallContent(type="diff", path=path, old_text=old, new_text=new)


def option(option_id, kind="allow_once", name=None):
    return PermissionOption(option_id=option_id, name=name or option_id, kind=kind)


def test_paths_under_the_root_are_named_as_jupyterlab_names_them():
    assert mapping.relative(f"{ROOT}/data/x.csv", ROOT) == "data/x.csv"
    assert mapping.relative(ROOT, ROOT) == "."
    assert mapping.relative("/srv/notebooks-other/x", ROOT) == "/srv/notebooks-other/x"
    assert mapping.relative("relative/x", ROOT) == "relative/x"


def test_tool_content_keeps_text_and_diffs_and_leaves_terminals_out():
    content = mapping.tool_content(
        [text("3 rows"), diff(f"{ROOT}/a.py", None, "x = 1\n"),
         TerminalToolCallContent(type="terminal", terminal_id="t1")],
        ROOT,
    )  # fmt: skip
    assert content == [
        {"type": "text", "text": "3 rows"},
        {"type": "diff", "path": "a.py", "old_text": None, "new_text": "x = 1\n"},
    ]


def test_tool_content_fits_its_budget_however_much_the_agent_sends():
    lines = [f"line {n}\n" for n in range(100_000)]
    changed = [*lines[:50_000], "changed\n", *lines[50_001:]]
    content = mapping.tool_content(
        [text("x" * 500_000), diff(f"{ROOT}/big.txt", "".join(lines), "".join(changed))],
        ROOT,
        limit=64 * 1024,
    )
    assert len(json.dumps(content)) <= 64 * 1024
    assert content[0]["text"].endswith("(500000 characters in all)")


def test_a_large_diff_keeps_the_lines_that_changed_with_their_context():
    lines = [f"line {n}\n" for n in range(10_000)]
    new = [*lines[:5000], "changed\n", *lines[5001:]]
    old_part, new_part = mapping.shrink_diff("".join(lines), "".join(new), 10_000)
    assert old_part.splitlines()[mapping.DIFF_CONTEXT_LINES] == "line 5000"
    assert new_part.splitlines()[mapping.DIFF_CONTEXT_LINES] == "changed"
    assert len(new_part.splitlines()) == 2 * mapping.DIFF_CONTEXT_LINES + 1
    assert mapping.shrink_diff(None, "y" * 20_000, 10_000) is None  # one huge line: too large
    assert mapping.diff_content("a.txt", None, "y" * 200_000)[0]["type"] == "text"


def test_text_is_cut_into_deltas_a_client_accepts():
    pieces = mapping.pieces("a" * 40_000)
    assert "".join(pieces) == "a" * 40_000
    assert max(map(len, pieces)) <= mapping.TEXT_PIECE < 64 * 1024


def test_an_agents_value_too_large_for_an_event_becomes_a_preview():
    assert mapping.bounded({"rows": 3}, 100) == {"rows": 3}
    big = mapping.bounded({"data": "x" * 100_000}, 1000)
    assert big["truncated"] is True and len(json.dumps(big)) < 1000


@pytest.mark.parametrize("value", [-1, 1.5, True, "3", None])
def test_a_token_count_that_cannot_be_one_is_left_out(value):
    assert mapping.token_count(value) is None
    assert mapping.token_count(2**53) == 2**53


@pytest.mark.parametrize("value", [2**53 + 1, 10**20])
def test_a_token_count_over_2_53_counts_as_2_53(value):
    assert mapping.token_count(value) == 2**53


def test_a_permission_request_is_a_question_whose_choices_are_the_option_ids():
    tool = ToolCallUpdate(
        tool_call_id="t1", title="Run make", kind="execute", content=[text("make clean")]
    )
    title, details, choices = mapping.permission_question(
        tool, [option("yes"), option("no", "reject_once", "No"), option("yes"), option(" ")], ROOT
    )
    assert title == "Run make" and choices == ["yes", "no"]
    assert details == {
        "options": [
            {"optionId": "yes", "name": "yes", "kind": "allow_once"},
            {"optionId": "no", "name": "No", "kind": "reject_once"},
        ],
        "tool": {
            "title": "Run make",
            "kind": "execute",
            "content": [{"type": "text", "text": "make clean"}],
        },
    }
    untitled = ToolCallUpdate(tool_call_id="t2")
    assert (
        mapping.permission_question(untitled, [option("a")], ROOT)[0] == "The agent asks to go on"
    )
    assert mapping.permission_question(untitled, [], ROOT) is None
    many = [option(f"o{n}") for n in range(30)]
    assert len(mapping.permission_question(untitled, many, ROOT)[2]) == 20


def test_an_earlier_answer_chooses_the_same_option_or_one_of_the_same_kind():
    earlier = {"details": {"options": [{"optionId": "allow-1", "kind": "allow_once"}]}}
    assert mapping.same_choice(earlier, "allow-1", [option("allow-1")]) == "allow-1"
    assert (
        mapping.same_choice(
            earlier, "allow-1", [option("reject", "reject_once"), option("allow-2")]
        )
        == "allow-2"
    )
    assert mapping.same_choice(earlier, "allow-1", [option("reject", "reject_once")]) is None


def test_a_plan_keeps_its_entries_with_a_status_the_run_knows():
    from acp import plan_entry

    assert mapping.plan_entries([plan_entry("Read", priority="low", status="completed")]) == [
        {"content": "Read", "status": "completed", "priority": "low"}
    ]


@pytest.fixture
def files(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "secret.txt").write_text("secret")
    (root / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (root / "outdir").symlink_to(tmp_path)
    (root / "inside.txt").symlink_to(root / "sub" / "a.txt")
    return Files(str(root))


def test_paths_outside_the_root_are_refused_symbolic_links_included(files, tmp_path):
    root = files.root
    assert files.resolve(f"{root}/sub/a.txt") == f"{root}/sub/a.txt"
    assert files.resolve(f"{root}/inside.txt") == f"{root}/sub/a.txt"
    for path in (f"{root}/leak.txt", f"{root}/outdir/secret.txt", f"{root}/../secret.txt",
                 str(tmp_path / "secret.txt"), "sub/a.txt", f"{root}/a\x00b"):  # fmt: skip
        with pytest.raises(Refused):
            files.resolve(path)


def test_reads_take_a_first_line_and_a_number_of_lines(files):
    path = f"{files.root}/sub/a.txt"
    assert asyncio.run(files.read(path)) == "one\ntwo\nthree\n"
    assert asyncio.run(files.read(path, line=2, limit=1)) == "two\n"
    with pytest.raises(Refused, match="does not exist"):
        asyncio.run(files.read(f"{files.root}/missing.txt"))


def test_a_write_without_a_contents_manager_makes_its_directories(files):
    name, old = asyncio.run(files.write(f"{files.root}/new/dir/b.txt", "hello"))
    assert (name, old) == ("new/dir/b.txt", None)
    assert open(os.path.join(files.root, "new/dir/b.txt")).read() == "hello"
    with pytest.raises(Refused):
        asyncio.run(files.write(f"{files.root}/leak.txt", "overwritten"))


def test_an_agent_whose_capabilities_are_null_offers_none_of_them(tmp_path):
    # The schema allows "agentCapabilities": null (the SDK leaves it out instead).
    conversation = Conversation("nulls", {}, Files(str(tmp_path)), logging.getLogger())
    conversation.info = InitializeResponse(protocol_version=1, agent_capabilities=None)
    assert not (conversation.can_load or conversation.can_resume or conversation.embeds_files)
