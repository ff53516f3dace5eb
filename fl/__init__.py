"""Lightning + Fabric framework for heterogeneous and personalized federated learning."""
__version__ = "0.1.0"
