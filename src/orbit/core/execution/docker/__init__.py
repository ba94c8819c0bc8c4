"""The docker launch mode: generated scripts, Docker host facts and the orphan sweep, image
provenance.

May import what orbit.core.execution may."""
