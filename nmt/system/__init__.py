"""What nmt needs of the machine: files read and written atomically (files.py), the process's
device, cores and memory (runtime.py), and the private PyTorch operators it keeps, behind one
probe (private_ops.py)."""
