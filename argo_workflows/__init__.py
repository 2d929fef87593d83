"""argo_workflows."""
