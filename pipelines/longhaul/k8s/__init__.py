"""Kubernetes operator logic: status mapping (pure), reconcile decisions, and a small async API client."""
