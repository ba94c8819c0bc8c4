"""The server's alerts: the conditions it looks at on its own loop (conditions.py, pure), the
loop that raises and resolves them in the store (loop.py) and delivers them to webhooks with
retries (deliver.py), and the Prometheus rules for sites that run Alertmanager (rules.py).
Imports the control service and the store, as the server's other loops do."""
