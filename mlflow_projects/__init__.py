"""mlflow_projects."""
