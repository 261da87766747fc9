"""Generation backends. Only this package (and server/) imports vllm."""
