"""Thin routers: each endpoint validates, calls storage / rules / prompts, answers."""
