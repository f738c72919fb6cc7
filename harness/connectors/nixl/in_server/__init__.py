"""NIXL's part inside the vLLM servers (harness.serve.plugins.kv_events finds these modules by
their ``CONNECTOR_CLASSES``; ``idle`` is a vLLM general plugin of its own, pyproject.toml)."""
