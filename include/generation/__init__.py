"""The generation stage: drive SGLang servers to answer a prompt shard, durably."""
