"""A command-line client of the Sophos API, over HTTP like any other client.

``python -m sophos_cli chat "message" [--conversation ID] [--resume]`` sends a
message (or resumes a conversation) and prints the answer as it streams, with
tool calls as they happen; ``python -m sophos_cli runs`` prints the queued and
running runs; ``python -m sophos_cli cancel RUN`` cancels one; ``python -m sophos_cli approve
CONVERSATION`` decides on the tool calls a conversation waits for (``chat`` asks them too).
"""
