"""Local stand-ins for what the SageMaker service does before ``train`` starts: /opt/ml trees."""
