"""`orbit server`: the control service over HTTP for a team (users, tokens, loops that drive
runs). Routers stay thin: they resolve permissions and call CoreControlService."""
