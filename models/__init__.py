"""Reference models built on refopt's autograd (the MLP, the GPT) and their offline data sets."""
