"""Talking to servers: HTTP helpers, the Kubernetes client, cluster submission, the TrainJob."""
