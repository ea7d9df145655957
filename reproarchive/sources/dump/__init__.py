"""PyTorch's repro dumps (after_dynamo, after_aot) turned into archives, their data read without
inventing any."""
