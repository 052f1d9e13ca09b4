"""Chat: accepting a message, a resume or a decision as a run; relaying its events; branches."""
