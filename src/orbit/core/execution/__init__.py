"""The execution plane as the control plane sees it: the bundle, the ExecutionService that
routes a request to its backend, one module per backend, launch modes, SSH hosts, Docker.

May import the vocabulary, the store, the scheduler, the runtime and core.tasks."""
