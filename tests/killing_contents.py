"""A contents manager that kills its own server right after it saved a notebook, once told to:
the moment an edit is in the file and its ``applied`` is not yet recorded."""

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
