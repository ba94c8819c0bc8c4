"""The `orbit` command line: a thin layer over CoreControlService."""
