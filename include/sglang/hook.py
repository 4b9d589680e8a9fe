"""The servers' API key connection, read through one hook, as Airflow's providers do.

``REGEN_SGLANG_CONN_ID`` names an Airflow connection whose password is the key every SGLang
server is started with (``--api-key``) and every request carries (``Authorization: Bearer``).
``SGLangHook`` is the one reader of it: the tasks (``api_key``, masked in the task log, via
``DeploymentSettings.api_key``) and the trigger in the triggerer (``async_api_key``: the async
connection read, which neither blocks the event loop nor deadlocks on the supervisor
channel). The headers that carry the key are ``contract.bearer``'s.
A missing connection means "no key": a deployment may run servers without one.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook


def _mask(secret: str) -> None:
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older task SDKs
        from airflow.sdk.execution_time.secrets_masker import mask_secret
    mask_secret(secret)


class SGLangHook(BaseHook):
    """Read the SGLang servers' API key from its connection (the password; None when absent)."""

    conn_name_attr = "sglang_conn_id"
    default_conn_name = "sglang_default"
    conn_type = "generic"
    hook_name = "SGLang servers"

    def __init__(self, sglang_conn_id: str | None = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sglang_conn_id = sglang_conn_id

    def api_key(self) -> str | None:
        """Return the key, registered with the process's secret masker (``***`` in logs)."""
        from airflow.sdk.exceptions import AirflowNotFoundException

        if not self.sglang_conn_id:
            return None
        try:
            key = self.get_connection(self.sglang_conn_id).password
        except AirflowNotFoundException:
            return None
        return self._masked(key)

    async def async_api_key(self) -> str | None:
        """Return the key, read the async way (for the triggerer's event loop)."""
        from airflow.sdk.exceptions import AirflowNotFoundException

        if not self.sglang_conn_id:
            return None
        try:
            conn = await self.aget_connection(self.sglang_conn_id)
        except AirflowNotFoundException:
            return None
        return self._masked(conn.password)

    @staticmethod
    def _masked(key: str | None) -> str | None:
        if key:
            _mask(key)
        return key or None
