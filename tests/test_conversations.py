"""``GET conversations``: the caller's runs of one session and agent, the newest conversation first."""

import pytest
import rawdb

from agents_for_tests import TEST_AGENTS
from conftest import demo_input, submit, wait_run

PER_USER = {"identity_provider_class": "identity.HeaderIdentityProvider"}
ALICE = {"X-Test-User": "alice"}
BOB = {"X-Test-User": "bob"}


async def said(api, prompt, session=None, agent="demo", headers=None, **body):
    """A finished run: what was said in a conversation."""
    input = demo_input(prompt=prompt, chunks=1, tools=False) if agent == "demo" else {"n": 1}
    if session is not None:
        body["session"] = session
    response = await submit(api, agent, input, headers=headers, **body)
    assert response.status_code == 201, response.text
    return (await wait_run(api, response.json()["run_id"], headers=headers))["run_id"]


async def every_page(api, params, headers=None):
    """Every conversation, page after page, and the pages' sizes."""
    found, sizes, before = [], [], None
    while True:
        response = await api.get(
            "conversations", params={**params, "before": before or ""}, headers=headers
        )
        assert response.status_code == 200, response.text
        page = response.json()
        found += page["conversations"]
        sizes.append(len(page["conversations"]))
        before = page["next"]
        if before is None:
            return found, sizes


@pytest.mark.timeout(90)
@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_each_owner_lists_their_conversations_newest_first_page_by_page(api, engine):
    trip = [
        await said(api, "Plan a trip to Lisbon\nin June", "trip", headers=ALICE),
        await said(api, "and the hotel?", "trip", headers=ALICE),
    ]
    counted = await said(api, "", "trip", agent="counter", headers=ALICE)
    notes = await said(api, "Summarise", "notes.ipynb", headers=ALICE, metadata={"title": "Notes"})
    await said(api, "no session, no conversation", headers=ALICE)
    bobs = await said(api, "Bob's own", "trip", headers=BOB)
    trip.append(await said(api, "and the museums?", "trip", headers=ALICE))

    listed = (await api.get("conversations", headers=ALICE)).json()
    assert listed["next"] is None
    assert listed["conversations"] == [
        {
            "session": "trip",
            "agent": "demo",
            "title": "Plan a trip to Lisbon",
            "runs": 3,
            "last_run_id": trip[-1],
            "updated_at": (await api.get(f"runs/{trip[-1]}", headers=ALICE)).json()["created_at"],
        },
        {
            "session": "notes.ipynb",
            "agent": "demo",
            "title": "Notes",
            "runs": 1,
            "last_run_id": notes,
            "updated_at": listed["conversations"][1]["updated_at"],
        },
        {
            "session": "trip",
            "agent": "counter",
            "title": "counter",  # no prompt, no title: the agent's name
            "runs": 1,
            "last_run_id": counted,
            "updated_at": listed["conversations"][2]["updated_at"],
        },
    ]
    by_agent = (await api.get("conversations", params={"agent": "counter"}, headers=ALICE)).json()
    assert [c["last_run_id"] for c in by_agent["conversations"]] == [counted]
    # Bob sees his one conversation, never Alice's, with her cursor too.
    assert [c["last_run_id"] for c in (await every_page(api, {}, BOB))[0]] == [bobs]
    alices_cursor = (await api.get("conversations", params={"limit": 1}, headers=ALICE)).json()
    bobs_page = await api.get(
        "conversations", params={"before": alices_cursor["next"]}, headers=BOB
    )
    assert [c["last_run_id"] for c in bobs_page.json()["conversations"]] == [bobs]

    # Conversations whose newest runs were created in the same millisecond (later than any
    # other run) page by run id:
    # each comes once, whatever the page size.
    with_runs = [trip[-1], notes, counted]
    db = rawdb.connect(rawdb.target(engine))
    try:
        for run_id in with_runs:
            db.execute(
                "UPDATE runs SET created_at = ? WHERE run_id = ?",
                ["2099-01-01T00:00:00.000Z", run_id],
            )
    finally:
        db.close()
    newest = [c["last_run_id"] for c in (await every_page(api, {}, ALICE))[0]]
    assert newest == sorted(with_runs, reverse=True)  # byte for byte on both stores
    for limit in (1, 2):
        found, sizes = await every_page(api, {"limit": limit}, ALICE)
        assert [c["last_run_id"] for c in found] == newest
        assert max(sizes) == limit


@pytest.mark.timeout(60)
async def test_a_notebooks_conversations_are_its_own_and_those_its_runs_name(api, jp_root_dir):
    (jp_root_dir / "work").mkdir()
    absolute = str(jp_root_dir / "work" / "analysis.ipynb")
    # submit() from the notebook: its session is the notebook's path, absolute in the kernel.
    in_notebook = await said(api, "Plot the sales", absolute)
    # A chat started from the notebook under a session of its own names it in its metadata.
    chat = await said(api, "Explain the model", "chat-1", metadata={"notebook": absolute})
    chat_again = await said(api, "and its errors?", "chat-1")
    await said(api, "Elsewhere", "chat-2", metadata={"notebook": "other.ipynb"})
    await said(api, "Another notebook", "work/other.ipynb")

    found = (await api.get("conversations", params={"notebook": "work/analysis.ipynb"})).json()
    assert [(c["session"], c["runs"], c["title"]) for c in found["conversations"]] == [
        ("chat-1", 2, "Explain the model"),
        ("work/analysis.ipynb", 1, "Plot the sales"),  # shown relative to the root
    ]
    assert found["conversations"][0]["last_run_id"] == chat_again != chat
    assert found["conversations"][1]["last_run_id"] == in_notebook
    page = (
        await api.get("conversations", params={"notebook": "/work/analysis.ipynb", "limit": 1})
    ).json()
    rest = (
        await api.get(
            "conversations", params={"notebook": "work/analysis.ipynb", "before": page["next"]}
        )
    ).json()
    assert [c["session"] for c in page["conversations"] + rest["conversations"]] == [
        "chat-1",
        "work/analysis.ipynb",
    ]
    assert rest["next"] is None


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 501},
        {"limit": "ten"},
        {"before": "x"},
        {"before": "MjAyNi0wMS0wMVQwMDowMDowMC4wMDBafHg"},
        {"notebook": "../etc/x.ipynb"},
        {"notebook": "work/../../x.ipynb"},
    ],
)
async def test_bad_parameters_are_a_400_that_says_what_is_wrong(api, params):
    response = await api.get("conversations", params=params)
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid_request"
    assert next(iter(params)) in body["message"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize("agentruns_config", [{"owner_mode": "shared"}])
async def test_in_shared_mode_every_user_lists_the_one_owners_conversations(api):
    alices = await said(api, "Alice starts", "shared-chat", headers=ALICE)
    bobs = await said(api, "Bob follows up", "shared-chat", headers=BOB)
    for user in (ALICE, BOB):
        [listed] = (await api.get("conversations", headers=user)).json()["conversations"]
        assert (listed["runs"], listed["last_run_id"], listed["title"]) == (2, bobs, "Alice starts")
    assert alices != bobs
