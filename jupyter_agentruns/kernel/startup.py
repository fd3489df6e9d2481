"""Run first in the notebooks' kernels a server with jupyter_agentruns starts (as PYTHONSTARTUP).

It loads ``%%agent`` (``%load_ext jupyter_agentruns``) where the kernel's
Python has the package, then runs the person's own PYTHONSTARTUP file, which
the server kept in ``AGENTRUNS_PYTHONSTARTUP``. IPython runs it in the
notebook's namespace: it leaves no name there.
"""


def _agentruns_startup(namespace):
    import os

    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            shell.extension_manager.load_extension("jupyter_agentruns")
    except Exception:  # another Python, without the package: the kernel goes on without %%agent
        pass
    own = os.environ.get("AGENTRUNS_PYTHONSTARTUP")
    if own:
        with open(own, encoding="utf-8") as file:
            exec(compile(file.read(), own, "exec"), namespace)


_agentruns_startup(globals())
del _agentruns_startup
