"""Integrations with frameworks, each importable only when its extra is installed."""
