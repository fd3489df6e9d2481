"""The open pages: a JupyterLab page that has a notebook open makes an agent's edit on its model.

Without a live shared document, a page's notebook model is the notebook as
the person sees it, unsaved work included; an edit written into the file
would only show after "Reload from Disk", and saving the page would then
overwrite it. So each page keeps a link to the server (``GET pages``, a
WebSocket) and says which notebooks it has open; the :class:`PagePlace`
asks one of them for the notebook (``read``) and hands it a change to make
(``make``), which the page makes on its model and then saves.

A change is offered to every page that has the notebook open, with a claim
token; the first page to claim it with that token makes it, any other is
refused; once it is made and saved, the other pages holding the notebook
are told (``saved``, as they are when the server changes the file), and one
without unsaved work reads it again, so every open view shows the change.
An offer not claimed in time, or claimed but not made in time, expires: a
page that claims or answers it later is refused, so a change
the server gave up on is never made late. The page checks the change
against its model (by cell id, and the cell's source as the server read it)
and refuses one that no longer fits: the person's own changes are never
overwritten.

Messages are JSON objects with a ``type``. From the server: ``read``
``{request, notebook}``, ``make`` ``{claim, notebook, change}``,
``claimed`` and ``refused`` ``{claim, error?, message?}``, ``saved``
``{notebook}`` (its file changed: another page saved a change, or the
server changed the file), and ``error``
``{error, message}`` for a message it could not take (which changed
nothing). From a page: ``open`` ``{notebooks}`` (every path it has open
now), ``content`` ``{request, content}`` (the notebook, or null),
``claim`` ``{claim}`` and ``made`` ``{claim, ok, reason?}``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .places import Change

# How long a page has to answer a read (else the next place is read), to
# claim a change, and to make and save it once claimed.
READ_SECONDS = 3.0
CLAIM_SECONDS = 3.0
MAKE_SECONDS = 15.0
# The notebooks one page may say it has open, and the length of a path.
MAX_NOTEBOOKS = 500
MAX_PATH = 4096
# The reads of a notebook kept to check its changes by (see ``PagePlace.make``).
READS_KEPT = 4


class PageUnavailable(RuntimeError):
    """No page made the change: none took it in time, it was refused, or its page went away."""

    error_type = "page_unavailable"


class BadMessage(ValueError):
    """A page's message that is not one this link takes: answered with an ``error``, nothing changed."""

    def __init__(self, message: str, code: str = "invalid_message"):
        super().__init__(message)
        self.code = code


@dataclass(eq=False)
class Page:
    """One open page: the notebooks it has open, and how to send it a message."""

    send: Callable[[dict[str, Any]], None]
    notebooks: frozenset[str] = frozenset()


@dataclass(eq=False)
class _Offer:
    """A change offered to the pages holding its notebook, until one claims it and answers."""

    token: str
    path: str
    pages: set[Page]
    claimed: asyncio.Future[Page]
    made: asyncio.Future[None]
    taker: Page | None = None
    expired: bool = False


class PagePlace:
    """The notebooks the open pages hold (a :class:`~.places.Place`): read from a page, changed by one."""

    name = "page"

    def __init__(
        self,
        read_seconds: float = READ_SECONDS,
        claim_seconds: float = CLAIM_SECONDS,
        make_seconds: float = MAKE_SECONDS,
    ):
        self.read_seconds = read_seconds
        self.claim_seconds = claim_seconds
        self.make_seconds = make_seconds
        self.pages: set[Page] = set()
        self._reads: dict[str, tuple[set[Page], asyncio.Future[dict[str, Any]]]] = {}
        self._offers: dict[str, _Offer] = {}
        # path -> [(a notebook as handed out, its cells' ids and sources as the page answered)]
        self._answered: dict[str, list[tuple[dict[str, Any], list[tuple[str, str]]]]] = {}
        # path -> the page that took the last change of it: it is asked first, and alone,
        # so a notebook read again after a change is read where the change was made.
        self._taker: dict[str, Page] = {}

    # The link of one page.

    def connect(self, send: Callable[[dict[str, Any]], None]) -> Page:
        """A page linked (its notebooks told next, in an ``open`` message)."""
        page = Page(send)
        self.pages.add(page)
        return page

    def disconnect(self, page: Page) -> None:
        """The page went away: it holds nothing now, and what it was asked goes unanswered."""
        self.pages.discard(page)
        page.notebooks = frozenset()
        for pages, answer in self._reads.values():
            pages.discard(page)
            if not pages and not answer.done():
                answer.set_exception(PageUnavailable("no page that has the notebook open answered"))
        for offer in self._offers.values():
            offer.pages.discard(page)
            if offer.taker is page and not offer.made.done():
                offer.made.set_exception(PageUnavailable("the page went away while making it"))
            elif not offer.pages and not offer.claimed.done():
                offer.claimed.set_exception(PageUnavailable("the pages went away"))
        for path in [path for path, taker in self._taker.items() if taker is page]:
            del self._taker[path]
        for path in [path for path in self._answered if not self.holding(path)]:
            del self._answered[path]

    def receive(self, page: Page, message: Any) -> None:
        """A message from ``page``; :class:`BadMessage` (nothing changed) when it is not one it may send."""
        if not isinstance(message, dict):
            raise BadMessage("a message is a JSON object with a 'type'")
        kind = message.get("type")
        if kind == "open":
            page.notebooks = _notebooks(message)
        elif kind == "content":
            self._content(page, message)
        elif kind == "claim":
            self._claim(page, message)
        elif kind == "made":
            self._made(page, message)
        else:
            raise BadMessage(f"no message type {kind!r}: open, content, claim or made")

    def _content(self, page: Page, message: dict[str, Any]) -> None:
        request = message.get("request")
        content = message.get("content")
        asked = self._reads.get(request) if isinstance(request, str) else None
        if asked is None or page not in asked[0]:
            raise BadMessage(f"no read {request!r} is waiting for this page", "unknown_request")
        if content is not None and not _is_notebook(content):
            raise BadMessage("'content' is a notebook (nbformat 4, each cell with its id) or null")
        pages, answer = asked
        pages.discard(page)
        if answer.done():
            return
        if content is not None:
            answer.set_result(content)
        elif not pages:
            answer.set_exception(PageUnavailable("no page has the notebook open now"))

    def _offer_of(self, page: Page, message: dict[str, Any]) -> _Offer:
        token = message.get("claim")
        offer = self._offers.get(token) if isinstance(token, str) else None
        if offer is None or (page not in offer.pages and offer.taker is not page):
            raise BadMessage(
                "no such claim for this page: it expired or was never offered", "claim_expired"
            )
        return offer

    def _claim(self, page: Page, message: dict[str, Any]) -> None:
        offer = self._offer_of(page, message)
        refused = None
        if offer.taker is not None:
            refused = ("claim_taken", "another page makes this change")
        elif offer.expired:
            refused = ("claim_expired", "the server gave up on this change: do not make it")
        if refused is not None:
            page.send(
                {
                    "type": "refused",
                    "claim": offer.token,
                    "error": refused[0],
                    "message": refused[1],
                }
            )
            return
        offer.taker = page
        offer.claimed.set_result(page)
        self._taker[offer.path] = page
        page.send({"type": "claimed", "claim": offer.token})

    def _made(self, page: Page, message: dict[str, Any]) -> None:
        offer = self._offer_of(page, message)
        if offer.taker is not page:
            raise BadMessage("this page did not claim the change", "claim_taken")
        ok, reason = message.get("ok"), message.get("reason")
        if not isinstance(ok, bool) or not (reason is None or isinstance(reason, str)):
            raise BadMessage("'made' says 'ok' (true or false) and, when false, a 'reason' (text)")
        if offer.expired or offer.made.done():
            raise BadMessage("the server gave up on this change already", "claim_expired")
        if ok:
            offer.made.set_result(None)
        else:
            why = (reason or "no reason given")[:500]
            offer.made.set_exception(PageUnavailable(f"the page did not make the change: {why}"))

    def file_saved(self, path: str, but: Page | None = None) -> None:
        """The notebook ``path`` changed in its file: the pages holding it (``but`` one, which
        made the change) are told, and one without unsaved work reads it again."""
        for page in self.pages:
            if page is not but and path in page.notebooks:
                page.send({"type": "saved", "notebook": path})

    # The place.

    def holding(self, path: str) -> list[Page]:
        """The pages that have ``path`` open now: the one that took its last change alone, if it does."""
        taker = self._taker.get(path)
        if taker is not None and path in taker.notebooks:
            return [taker]
        return [page for page in self.pages if path in page.notebooks]

    async def read(self, path: str) -> dict[str, Any] | None:
        """The notebook as a page's model holds it now (unsaved changes too), or None.

        None when no page has it open, or none answered within ``read_seconds``.
        """
        pages = self.holding(path)
        if not pages:
            return None
        request = secrets.token_urlsafe(12)
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._reads[request] = (set(pages), answer)
        try:
            for page in pages:
                page.send({"type": "read", "request": request, "notebook": path})
            content = await asyncio.wait_for(answer, self.read_seconds)
        except (asyncio.TimeoutError, PageUnavailable):
            return None
        finally:
            del self._reads[request]
        answered = self._answered.setdefault(path, [])
        answered.append((content, [(cell["id"], _source(cell)) for cell in content["cells"]]))
        del answered[:-READS_KEPT]
        return content

    async def make(self, path: str, notebook: dict[str, Any], change: Change) -> None:
        """Offer ``change`` to the pages holding ``path``; one claims it, makes it on its model and saves.

        ``notebook`` is one this place's ``read`` answered (with the change
        made on it): the change is sent with what the page must still hold
        for it to fit (the cell it goes after, the source it replaces).
        Raises :class:`PageUnavailable` when no page made it in time.
        """
        cells = next(
            (was for given, was in self._answered.get(path, []) if given is notebook), None
        )
        if cells is None:
            raise PageUnavailable("the change was not worked out on a notebook a page answered")
        pages = self.holding(path)
        if not pages:
            raise PageUnavailable("no page has the notebook open now")
        loop = asyncio.get_running_loop()
        offer = _Offer(
            secrets.token_urlsafe(18), path, set(pages), loop.create_future(), loop.create_future()
        )
        self._offers[offer.token] = offer
        sent = {
            "type": "make",
            "claim": offer.token,
            "notebook": path,
            "change": page_change(cells, change),
        }
        try:
            for page in pages:
                page.send(sent)
            try:
                await asyncio.wait_for(asyncio.shield(offer.claimed), self.claim_seconds)
            except asyncio.TimeoutError:
                raise PageUnavailable("no page took the change in time") from None
            try:
                await asyncio.wait_for(asyncio.shield(offer.made), self.make_seconds)
            except asyncio.TimeoutError:
                raise PageUnavailable(
                    "the page did not say in time that it made the change"
                ) from None
            self.file_saved(path, but=offer.taker)
        finally:
            offer.expired = True
            for future in (offer.claimed, offer.made):
                if not future.done():
                    future.cancel()
            # Kept a while, so that a late page is told it expired rather than that it never existed.
            loop.call_later(60, self._offers.pop, offer.token, None)


def page_change(cells: list[tuple[str, str]], change: Change) -> dict[str, Any]:
    """``change`` as a page makes it: by cell id, with what the cell must still hold.

    ``cells``: the ids and sources of the notebook's cells as the page
    answered them, before the change.
    """
    if change.kind == "insert":
        after = cells[change.index - 1][0] if change.index > 0 else None
        return {"kind": "insert", "index": change.index, "after": after, "cell": change.cell}
    cell_id, source = cells[change.index]
    if change.kind == "delete":
        return {"kind": "delete", "cell_id": cell_id, "source": source}
    return {"kind": "replace", "cell": change.cell, "source": source}


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source") or ""
    return "".join(source) if isinstance(source, list) else str(source)


def _notebooks(message: dict[str, Any]) -> frozenset[str]:
    paths = message.get("notebooks")
    if not isinstance(paths, list) or len(paths) > MAX_NOTEBOOKS:
        raise BadMessage(f"'notebooks' is a list of at most {MAX_NOTEBOOKS} paths")
    for path in paths:
        if not isinstance(path, str) or not path or len(path) > MAX_PATH:
            raise BadMessage("each of 'notebooks' is a notebook's path under the server's root")
    return frozenset(paths)


def _is_notebook(content: Any) -> bool:
    """nbformat 4's shape, as far as the edits read it: cells with an id, a type and a source."""
    if not isinstance(content, dict) or not isinstance(content.get("cells"), list):
        return False
    return all(_is_cell(cell) for cell in content["cells"])


def _is_cell(cell: Any) -> bool:
    if not isinstance(cell, dict) or not isinstance(cell.get("id"), str):
        return False
    source = cell.get("source", "")
    if not (
        isinstance(source, str)
        or (isinstance(source, list) and all(isinstance(line, str) for line in source))
    ):
        return False
    return cell.get("cell_type") in ("code", "markdown", "raw") and isinstance(
        cell.get("metadata", {}), dict
    )
