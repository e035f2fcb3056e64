"""The wire protocol both the server and the client speak.

The wire protocol both the server and the client speak: `framing` (frame sets and limits), `auth`
(the token handshake), `declarations` (every server operation, declared once) and `requests` (the
request a client sends for each operation, and how its reply reads).
"""
