"""EM admission: the gate of ``encoded_data``, in-situ certification, the executor identity, the harness adapter."""
