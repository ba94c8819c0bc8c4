"""`orbit server`: the control service over HTTP for a team (users, tokens, loops that drive
runs). Routers stay thin: they resolve permissions and call CoreControlService.

May import the vocabulary, the store, the scheduler, forensics and the two planes."""
