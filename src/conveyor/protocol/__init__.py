"""The wire protocol both the server and the client speak: framing, authentication, the message
model and the declaration of every server operation (`operations`)."""
