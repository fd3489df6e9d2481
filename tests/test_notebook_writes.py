"""A notebook written whole, as the cell edits that make it: the pure planning, without a server.

``plan_calls`` compares the text an agent wrote with what it read of the
notebook and with the notebook now; tests/test_acp_notebook.py runs the same
through a real server and a scripted ACP agent.
"""

from __future__ import annotations

import json

import pytest

from jupyter_agentruns.notebook_tools.writes import InvalidNotebook, parse, plan_calls


def notebook(*cells, minor=5) -> dict:
    return {
        "cells": [
            {"cell_type": "code", "id": cell_id, "metadata": {}, "execution_count": None,
             "source": source, "outputs": []}
            for cell_id, source in cells
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": minor,
    }  # fmt: skip


NOW = notebook(("a", "x = 1"), ("b", "print(x)"), ("c", "# c"))
READ = {"a": "x = 1", "b": "print(x)", "c": "# c"}


def planned(written, now=NOW, seen=READ):
    return plan_calls(parse(json.dumps(written)), now, seen)


def test_what_the_agent_read_and_left_alone_makes_no_edit():
    assert planned(NOW) == ([], [])


def test_a_cell_the_person_changed_and_the_agent_did_not_keeps_the_persons_text():
    now = notebook(("a", "x = 1"), ("b", "print('person')"), ("c", "# c"))
    assert planned(NOW, now=now) == ([], [])


def test_added_changed_and_removed_cells_are_inserts_edits_and_deletes_in_order():
    written = notebook(("n1", "# title"), ("a", "x = 2"), ("n2", "y = 1"), ("b", "print(x)"))
    written["cells"][0] = {"cell_type": "markdown", "id": "n1", "metadata": {}, "source": "# title"}
    calls, notes = planned(written)
    assert calls == [
        ("insert_cell", {"source": "# title", "cell_type": "markdown", "after": "start",
                         "cell_id": "n1"}),
        ("edit_cell", {"cell_id": "a", "source": "x = 2"}),
        ("insert_cell", {"source": "y = 1", "cell_type": "code", "after": "a", "cell_id": "n2"}),
        ("delete_cell", {"cell_id": "c"}),
    ]  # fmt: skip
    assert notes == []


def test_a_cell_a_person_added_since_the_read_is_kept_and_one_they_deleted_not_added_again():
    now = notebook(("a", "x = 1"), ("p", "mine"), ("c", "# c"))
    calls, notes = planned(NOW, now=now)
    assert calls == []
    assert notes == [
        "cell b was deleted from the notebook since you read it: it was not added again",
        "cell p was added to the notebook since you read it: it was kept",
    ]


def test_a_change_to_a_cell_a_person_deleted_is_an_edit_that_will_find_it_gone():
    written = notebook(("a", "x = 1"), ("b", "print(2)"), ("c", "# c"))
    now = notebook(("a", "x = 1"), ("c", "# c"))
    calls, notes = planned(written, now=now)
    assert calls == [("edit_cell", {"cell_id": "b", "source": "print(2)"})]
    assert notes == [
        "cell b was deleted from the notebook since you read it: it was not added again"
    ]


def test_a_write_without_a_read_replaces_the_cells_it_leaves_out():
    calls, _ = planned(notebook(("a", "x = 1")), seen={})
    assert calls == [("delete_cell", {"cell_id": "b"}), ("delete_cell", {"cell_id": "c"})]


def test_a_new_cell_without_an_id_gets_one_and_outputs_and_moves_are_said_not_taken():
    written = notebook(("c", "# c"), ("a", "x = 1"), ("b", "print(x)"))
    written["cells"].append({"cell_type": "code", "metadata": {}, "execution_count": 3,
                             "source": "z", "outputs": []})  # fmt: skip
    calls, notes = planned(written)
    [(tool, args)] = calls
    assert tool == "insert_cell" and args["after"] == "b" and args["cell_id"] not in READ
    assert notes == [
        "the cells already in the notebook keep their order: a write does not move cells",
        "only the cells' sources are taken from a written notebook: its outputs, execution "
        "counts and metadata were not",
    ]


def test_cells_without_ids_match_by_position_when_the_counts_agree_else_refused():
    written = notebook(("a", "x = 1"), ("b", "print(2)"), ("c", "# c"), minor=4)
    for cell in written["cells"]:
        del cell["id"]
    assert planned(written)[0] == [("edit_cell", {"cell_id": "b", "source": "print(2)"})]
    written["cells"].pop()
    with pytest.raises(InvalidNotebook, match="counts agree"):
        planned(written)


def test_a_notebook_whose_cells_have_no_ids_cannot_be_changed_cell_by_cell():
    now = notebook(("a", "x = 1"), minor=4)
    del now["cells"][0]["id"]
    with pytest.raises(InvalidNotebook, match="no ids"):
        planned(notebook(("a", "x = 2")), now=now)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "not a valid notebook"),
        ('{"cells": []}', "not a valid notebook"),
        (json.dumps(notebook(("a", "1"), ("a", "2"))), "two cells of the same id"),
    ],
)
def test_a_text_that_is_not_a_notebook_is_refused(text, why):
    with pytest.raises(InvalidNotebook, match=why):
        parse(text)
