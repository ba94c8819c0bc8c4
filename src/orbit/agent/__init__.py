"""`orbit agent`: the daemon on an in-house GPU server. It only ever connects out.

May import the vocabulary (orbit.model, orbit.wire), the runtime and the execution plane."""
