"""SASL/OAUTHBEARER: tokens from an OAuth 2 token endpoint, by the client-credentials flow.

kafka-python asks a token provider for a token whenever it authenticates a connection. This
one POSTs ``grant_type=client_credentials`` (and the scope, if any) to the endpoint with the
client id and secret as HTTP Basic credentials, as Kafka's Java client does, and keeps the
token until shortly before its ``expires_in``. One provider serves every client of a process
with the same properties: settings cross process boundaries as JSON, a provider cannot.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from kafka.net.sasl.oauth import AbstractTokenProvider

from txstream.errors import BrokerUnavailable, ConfigError

__all__ = ["ClientCredentialsTokenProvider", "token_provider"]

# Refresh this long before the token expires (and at a tenth of a short lifetime at most), so
# that a connection made just before the end does not present an expired token.
REFRESH_MARGIN_S = 60.0


class ClientCredentialsTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # untyped base
    """Access tokens of one OAuth client, fetched when needed and cached until near expiry.

    A token whose response has no ``expires_in`` is fetched again at every use.
    """

    def __init__(self, url: str, client_id: str, client_secret: str, scope: str | None = None,
                 timeout_s: float = 10.0) -> None:
        super().__init__()
        self.url = url
        self.client_id = client_id
        self._secret = client_secret
        self.scope = scope or None
        self.timeout_s = timeout_s
        self.fetches = 0  # token requests made (for metrics and tests)
        self._token: str | None = None
        self._until = 0.0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ClientCredentialsTokenProvider({self.url!r}, client_id={self.client_id!r})"

    def token(self) -> str:
        with self._lock:
            if self._token is None or time.monotonic() >= self._until:
                self._token, lifetime = self._fetch()
                margin = min(REFRESH_MARGIN_S, lifetime / 10) if lifetime else 0.0
                self._until = time.monotonic() + (lifetime or 0.0) - margin
            return self._token

    def _fetch(self) -> tuple[str, float | None]:
        form = {"grant_type": "client_credentials"}
        if self.scope:
            form["scope"] = self.scope
        # RFC 6749 2.3.1: id and secret are form-encoded before they are joined.
        pair = f"{_quote(self.client_id)}:{_quote(self._secret)}"
        request = urllib.request.Request(
            self.url, data=urllib.parse.urlencode(form).encode("ascii"), method="POST",
            headers={"Authorization": "Basic " + base64.b64encode(pair.encode()).decode(),
                     "Content-Type": "application/x-www-form-urlencoded",
                     "Accept": "application/json"})
        self.fetches += 1
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            kind = ConfigError if 400 <= exc.code < 500 else BrokerUnavailable
            raise kind(f"OAUTHBEARER token endpoint {self.url} answered HTTP {exc.code} "
                       f"for client {self.client_id}") from None
        except (OSError, ValueError) as exc:
            raise BrokerUnavailable(f"no OAUTHBEARER token from {self.url}: "
                                    f"{type(exc).__name__}") from None
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise ConfigError(f"OAUTHBEARER token endpoint {self.url} answered without an "
                              "access_token")
        expires = body.get("expires_in")
        return token, float(expires) if isinstance(expires, int | float) and expires > 0 else None


def _quote(text: str) -> str:
    return urllib.parse.quote_plus(text, safe="")


_PROVIDERS: dict[tuple[str, ...], ClientCredentialsTokenProvider] = {}
_PROVIDERS_LOCK = threading.Lock()


def token_provider(props: Mapping[str, Any]) -> ClientCredentialsTokenProvider:
    """This process's provider for the ``sasl.oauthbearer.*`` properties in ``props``."""
    key = tuple(str(props.get(name) or "") for name in (
        "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.secret", "sasl.oauthbearer.scope"))
    with _PROVIDERS_LOCK:
        provider = _PROVIDERS.get(key)
        if provider is None:
            url, client_id, secret, scope = key
            provider = _PROVIDERS[key] = ClientCredentialsTokenProvider(url, client_id, secret,
                                                                        scope)
        return provider
