"""SGLang's endpoints over ``urllib``, for code that is not async (the launcher, the monitor).

Every call returns an ``Answer`` (``include.sglang.contract``) and raises nothing for I/O.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from include.sglang.contract import (
    HEALTH,
    MODELS,
    Answer,
    Failure,
    bearer,
    health_probe_timeout_s,
)


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Refuse a redirect: a probe asks the deployment's server, nothing it points to."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


#: An opener that speaks HTTP only (no file://, no ftp://) and follows no redirect.
_NO_REDIRECTS = urllib.request.OpenerDirector()
for _handler in (urllib.request.HTTPHandler(), _RefuseRedirects(),
                 urllib.request.HTTPDefaultErrorHandler(), urllib.request.HTTPErrorProcessor()):
    _NO_REDIRECTS.add_handler(_handler)


def get(
    url: str,
    path: str,
    *,
    api_key: str | None = None,
    timeout: float = 5.0,
    follow_redirects: bool = True,
) -> Answer:
    """GET ``url`` + ``path`` once; an HTTP error status is an answer, not a failure."""
    req = urllib.request.Request(url.rstrip("/") + path, headers=bearer(api_key))
    opener = urllib.request.urlopen if follow_redirects else _NO_REDIRECTS.open
    try:
        with opener(req, timeout=timeout) as resp:
            return Answer(resp.status, resp.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read(), error=exc)
    except TimeoutError as exc:
        return Answer(failure=Failure.TIMEOUT, error=exc)
    except urllib.error.URLError as exc:
        refused = isinstance(exc.reason, ConnectionRefusedError)
        if isinstance(exc.reason, TimeoutError):
            return Answer(failure=Failure.TIMEOUT, error=exc)
        return Answer(failure=Failure.CONNECT, error=exc, refused=refused)
    except OSError as exc:
        return Answer(failure=Failure.CONNECT, error=exc,
                      refused=isinstance(exc, ConnectionRefusedError))


def models(url: str, api_key: str | None = None, timeout: float = 5.0) -> Answer:
    """GET ``/v1/models`` (the served model and its ``max_model_len``)."""
    return get(url, MODELS, api_key=api_key, timeout=timeout)


def health(url: str, timeout: float) -> Answer:
    """GET ``/health``, ``timeout`` never below the floor, following no redirect (the monitor
    probes servers named in run files: it must not be led elsewhere)."""
    return get(url, HEALTH, timeout=health_probe_timeout_s(timeout), follow_redirects=False)
