"""An agent with a bug in its v1 and the fix in its v2, for the replay-batch tests."""
