"""`orbit agent`: the daemon on an in-house GPU server. It only ever connects out."""
