"""What a run's questions offer, in the words a person reads.

A permission question (kind ``permission``, asked by an ACP agent) offers the
agent's option ids as its choices and names each in ``details.options``
(``[{"optionId", "name", "kind"}]``): views show the names, and a person may
answer with a name where an id is expected.
"""

from __future__ import annotations

from typing import Any


def option_names(request: dict[str, Any]) -> dict[str, str]:
    """A permission question's option names by id; empty for any other question."""
    details = request.get("details")
    if request.get("kind") != "permission" or not isinstance(details, dict):
        return {}
    options = details.get("options")
    names = {}
    for option in options if isinstance(options, list) else []:
        if isinstance(option, dict) and isinstance(option.get("optionId"), str):
            name = option.get("name")
            names[option["optionId"]] = (
                name if isinstance(name, str) and name.strip() else option["optionId"]
            )
    return names


def choice_name(request: dict[str, Any], choice: Any) -> str:
    """What ``choice`` is called: a permission option's name, else the choice itself."""
    return option_names(request).get(choice, choice) if isinstance(choice, str) else str(choice)


def choice_for(request: dict[str, Any], answer: str) -> str:
    """The choice that ``answer`` means: one of the question's choices, or the id of the
    permission option it names (exactly, else ignoring case and spacing).

    Anything else is returned as it is, for the server to refuse (``invalid_choice``);
    a name that two options share is a ValueError that asks for the id.
    """
    choices = request.get("choices")
    if isinstance(choices, list) and answer in choices:
        return answer
    names = option_names(request)
    for same in (lambda name: name == answer, lambda name: _loose(name) == _loose(answer)):
        found = [option_id for option_id, name in names.items() if same(name)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ValueError(
                f"{len(found)} options are named {answer!r} ({', '.join(found)}): answer with an id"
            )
    return answer


def _loose(text: str) -> str:
    return " ".join(text.casefold().split())
