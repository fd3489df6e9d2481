"""A test IdentityProvider with several users.

The token authenticates; ``X-Test-User`` names the user.
"""

from __future__ import annotations

from jupyter_server.auth.identity import PasswordIdentityProvider, User


class HeaderIdentityProvider(PasswordIdentityProvider):
    # Subclassing keeps the token check and the XSRF bypass for token requests.
    async def get_user(self, handler):
        user = await super().get_user(handler)
        if user is None:
            return None
        name = handler.request.headers.get("X-Test-User")
        return User(username=name) if name else user
