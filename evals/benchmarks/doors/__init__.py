"""Agent workloads driven through each API door (OpenAI chat, Responses, Anthropic Messages)."""
