"""The agent protocol: the messages an agent and the server exchange, and its version.

Imports nothing of ORBIT: both ends, and the store's node table, build on it.
"""
