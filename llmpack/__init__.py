"""llmpack."""
