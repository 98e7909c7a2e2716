"""Who may call which HTTP route (docs/SECURITY.md), for both HTTP paths (aiohttp's
middleware in ``services.http_api`` and the lean edge in ``services.http_edge``): the one
table of what each route needs, and the check of a request's ``Authorization: Bearer`` token
against it.

Routes that name a log need a grant on that log: append and append-batch ``append``;
records, tail, find-time and nodesets ``read``; trim ``trim``. Routes under
``ADMIN_PREFIXES`` (cluster operations) need ``admin`` on every log. Every other route (the
cluster view a client bootstraps from, the logs list, metrics, the console, the OpenAPI
document) needs a valid token and no grant. ``AuthConfig.open_paths`` (the probes) and
``CONSOLE_SHELL_PATHS`` (the console's page, script and stylesheet: code shipped in the
package, no data; a browser cannot send a token with a navigation, so the page loads first
and then asks for one) need nothing. Authentication comes first: without valid credentials
every route but those is 401, whatever else is wrong with the request.
"""

from __future__ import annotations

from shared.security.auth import Authenticator, Denied, Identity, bearer_token
from shared.security.permissions import Action
from shared.types import LOG_ID_MAX

LOG_ROUTE_ACTIONS: dict[str, Action] = {
    "/v1/logs/{log_id}/append": Action.APPEND,
    "/v1/logs/{log_id}/append-batch": Action.APPEND,
    "/v1/logs/{log_id}/records": Action.READ,
    "/v1/logs/{log_id}/tail": Action.READ,
    "/v1/logs/{log_id}/find-time": Action.READ,
    "/v1/logs/{log_id}/nodesets": Action.READ,
    "/v1/logs/{log_id}/trim": Action.TRIM,
}
ADMIN_PREFIXES: tuple[str, ...] = ("/v1/admin/",)
CONSOLE_SHELL_PATHS = frozenset({"/ui", "/ui/", "/ui/static/index.html",
                                 "/ui/static/console.js", "/ui/static/console.css"})


def _log_id(text: str | None) -> int | None:
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    value = int(text)
    return value if 1 <= value <= LOG_ID_MAX else None


def authorize(auth: Authenticator, path: str, route: str | None, log_id_text: str | None,
              authorization: str | None) -> Identity | Denied | None:
    """The identity a request runs as, why it is refused, or None (an open path)."""
    if path in auth.config.open_paths or path in CONSOLE_SHELL_PATHS:
        return None
    identity = auth.authenticate(bearer_token(authorization))
    if isinstance(identity, Denied):
        return identity
    action = LOG_ROUTE_ACTIONS.get(route) if route is not None else None
    if action is not None:
        log_id = _log_id(log_id_text)
        if log_id is None:
            # The handler answers the bad log id (400); there is nothing to grant on.
            return identity
        return auth.permit(identity, action, log_id) or identity
    if path.startswith(ADMIN_PREFIXES):
        return auth.permit_cluster(identity) or identity
    return identity
