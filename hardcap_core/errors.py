"""Every error Hardcap raises, in one tree.

Lower-level errors are translated into these at one boundary each: redis-py's in
:mod:`hardcap_core.ledger.connection`, botocore's (DynamoDB) in :mod:`hardcap_core.rollup.table`
(the config table's in :mod:`hardcap_core.control.store`),
httpx's and providers' error statuses in :mod:`hardcap_core.providers.http`, bad bodies in the
wire format's parser. The app turns a
:class:`GatewayError` into the error body of the endpoint's wire format (for OpenAI chat:
:func:`hardcap_core.wire.openai_chat.error_body`), so the official SDKs raise the matching
exception (``AuthenticationError``, ``RateLimitError``, ...).
"""

from __future__ import annotations


class HardcapError(Exception):
    """Base of every error Hardcap raises on purpose."""


class ConfigError(HardcapError):
    """The configuration is invalid; the message names the field."""


class LedgerUnavailable(HardcapError):
    """The budget server (Valkey/Redis) could not be reached or did not answer in time."""


class ReservationReused(HardcapError):
    """An admission named a reservation id that was settled already; ids are single-use."""


class ConfigStale(HardcapError):
    """The caller's copy of the live config is older than the version an admin change published
    for the hierarchy (admit.lua's 'config' reply): nothing was reserved; reload and retry."""

    def __init__(self, version: int) -> None:
        super().__init__(f"the config changed (version {version})")
        self.version = version


class LedgerProtocolError(HardcapError):
    """A script answered something the client does not understand (a version mismatch)."""


class DurableStoreUnavailable(HardcapError):
    """The durable ledger (DynamoDB) could not be reached or refused the call."""


class ConfigStoreUnavailable(HardcapError):
    """The config table (DynamoDB) could not be read or written."""


class ConfigConflict(HardcapError):
    """The config table moved to another version since it was read: another change went
    first. Reload, rebuild the change on what is there now, and write again."""


class GatewayError(HardcapError):
    """An error the client gets as an OpenAI-shaped body with this status, type and code."""

    status = 500
    type = "server_error"
    code: str | None = None
    # The provider's own status, for an error made of one (providers/http.py): a trace's
    # attempt span names it (the client gets ``status``, which may differ).
    upstream_status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class InvalidToken(AuthenticationFailed):
    """401: a bearer JWT was refused (expired, wrong audience, unknown issuer, a signature that
    does not verify...). The message says what was wrong in words a client developer can act
    on, and never quotes the token."""

    code = "invalid_token"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class LeaseNotFound(NotFound):
    """404: the lease id names no live lease of the caller (another tenant's, closed, expired)."""

    code = "lease_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class TooManyRequests(GatewayError):
    """429: ``budget_busy``, ``budget_exceeded`` or ``rate_limited`` (the code says which)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limited"


class UpstreamFailed(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_error"


class UpstreamRefused(UpstreamFailed):
    """The provider answered a 4xx the client cannot fix (a wrong provider key, a model it does
    not serve): a 502 like any provider failure, and another target may serve; but the
    provider is up and answering, so its breaker does not count it."""


class UpstreamUnreachable(UpstreamFailed):
    """No connection to the provider could be opened: nothing of the request was sent, so no
    tenant's request shaped this failure."""


class UpstreamMalformed(UpstreamFailed):
    """The provider answered 200 but the reply is unusable: it generated (and bills) it."""


class ServiceUnavailable(GatewayError):
    status = 503
    type = "server_error"
    code = "ledger_unavailable"


class IssuerUnavailable(ServiceUnavailable):
    """503, not 401: the keys of a token's issuer could not be fetched, so the token is neither
    valid nor invalid yet. A 401 would tell the client its credential is bad (SDKs do not
    retry it); a 503 says retry later, which the SDKs do."""

    code = "issuer_unavailable"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


class Overloaded(GatewayError):
    """503: this gateway's event loop lags, so it sheds new requests (retry shortly)."""

    status = 503
    type = "overloaded_error"
    code = "overloaded"
