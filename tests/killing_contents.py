"""Contents managers whose save of a notebook a test controls: one kills its own server right
after it saved (the moment an edit is in the file and its ``applied`` is not yet recorded), one
holds the save until the test lets it go on or fail."""

import asyncio
import os
import signal

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager


class KillAfterSave(AsyncLargeFileManager):
    """Saves, then SIGKILLs its process if the file ``AGENTRUNS_TEST_KILL_AFTER_SAVE`` names exists."""

    async def save(self, model, path=""):
        saved = await super().save(model, path)
        marker = os.environ.get("AGENTRUNS_TEST_KILL_AFTER_SAVE")
        if marker and os.path.exists(marker) and path.endswith(".ipynb"):
            os.kill(os.getpid(), signal.SIGKILL)
        return saved


class HoldSave(AsyncLargeFileManager):
    """Holds each save of a notebook while the file ``AGENTRUNS_TEST_HOLD_SAVE`` names says ``hold``.

    It says so in a file beside, ending in ``.held``. Written ``fail`` meanwhile, the held save
    fails without writing; removed, it goes on.
    """

    async def save(self, model, path=""):
        marker = os.environ.get("AGENTRUNS_TEST_HOLD_SAVE")
        if marker and path.endswith(".ipynb") and os.path.exists(marker):
            open(marker + ".held", "w").close()  # the test knows the save waits
            for _ in range(1200):  # at most a minute
                try:
                    word = open(marker).read().strip()
                except FileNotFoundError:
                    break
                if word == "fail":
                    raise OSError("the disk said no")
                await asyncio.sleep(0.05)
        return await super().save(model, path)
