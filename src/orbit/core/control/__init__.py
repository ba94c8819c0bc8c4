"""The control plane: CoreControlService, the one API that the CLI, the HTTP server, the
Python client and the web page call, and the records it hands back."""
