"""The SageMaker training entrypoint: reads the /opt/ml contract and launches the job."""
