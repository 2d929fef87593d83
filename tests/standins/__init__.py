"""Stand-in servers that speak real wire protocols on 127.0.0.1, for tests and benchmarks."""
