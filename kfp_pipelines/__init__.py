"""kfp_pipelines."""
