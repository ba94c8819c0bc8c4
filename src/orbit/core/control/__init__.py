"""The control plane: CoreControlService, the one API that the CLI, the HTTP server, the
Python client and the web page call (`api.ControlAPI`), and the records it hands back
(`views`). A client gets one from `orbit.client.connect`.

May import the vocabulary, the store, the scheduler, forensics and the execution plane."""
