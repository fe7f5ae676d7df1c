"""The agent: its loop, tools, prompts and the policies (models) that drive it."""
