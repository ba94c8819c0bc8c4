"""SSH rental hosts: what a host is and has (hosts), and the ssh/rsync transport.

May import what orbit.core.execution may."""
