"""Small differentiable tensor operations shared by models and data pipelines."""
