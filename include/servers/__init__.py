"""GPU host lifecycle: launch SGLang servers, gate on their health, preflight, tear down.

Plain typed Python; Airflow is imported only by ``sensor``/``triggers`` and by the SSH
runner. Import from the submodules (``include.servers.launcher`` etc.) so that importing this
package stays cheap.
"""
