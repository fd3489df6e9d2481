"""A notebook's path in a run's session: relative to the server's root, found in either form."""

import os

import pytest

from jupyter_agentruns.sessions import SessionPaths

ROOT = os.path.abspath("/srv/home/ana")
paths = SessionPaths(ROOT)


@pytest.mark.parametrize(
    "sent,recorded",
    [
        (os.path.join(ROOT, "notebooks", "q.ipynb"), "notebooks/q.ipynb"),
        (os.path.join(ROOT, "q.ipynb"), "q.ipynb"),
        (os.path.join(ROOT, "a", "..", "b", "q.ipynb"), "b/q.ipynb"),
        ("notebooks/q.ipynb", "notebooks/q.ipynb"),  # already as JupyterLab names it
        ("chat", "chat"),  # a session that is no path
        (os.path.abspath("/srv/home/bob/q.ipynb"), os.path.abspath("/srv/home/bob/q.ipynb")),
        (
            os.path.abspath("/srv/home/ana-old/q.ipynb"),
            os.path.abspath("/srv/home/ana-old/q.ipynb"),
        ),
        (ROOT, ROOT),  # the root itself is no notebook
        (None, None),
    ],
)
def test_a_path_under_the_root_is_recorded_relative_and_anything_else_as_sent(sent, recorded):
    assert paths.relative(sent) == recorded


def test_a_notebook_is_looked_up_in_both_forms_and_another_session_in_its_own():
    absolute = os.path.join(ROOT, "notebooks", "q.ipynb")
    both = ("notebooks/q.ipynb", absolute)
    assert paths.forms("notebooks/q.ipynb") == both
    assert paths.forms(absolute) == both
    assert paths.forms("../q.ipynb") == ("../q.ipynb",)
    elsewhere = os.path.abspath("/elsewhere/q.ipynb")
    assert paths.forms(elsewhere) == (elsewhere,)


def test_the_notebook_in_metadata_is_made_relative_and_the_rest_kept():
    absolute = os.path.join(ROOT, "q.ipynb")
    assert paths.metadata({"notebook": absolute, "cell_id": "c1"}) == {
        "notebook": "q.ipynb",
        "cell_id": "c1",
    }
    kept = {"notebook": ["not", "a", "path"]}
    assert paths.metadata(kept) is kept and paths.metadata(None) is None


def test_without_a_root_every_session_stays_as_sent():
    none = SessionPaths(None)
    absolute = os.path.join(ROOT, "q.ipynb")
    assert none.relative(absolute) == absolute and none.forms("q.ipynb") == ("q.ipynb",)
