"""`stgcnd bench`: every backend x precision against PyTorch eager fp32, on this machine."""
