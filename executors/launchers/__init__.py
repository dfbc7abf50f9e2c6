"""Launchers that start training ranks and bind each one with a topology attestation.

``base`` holds the shared binding (``LaunchContext``, ``bind_launched_rank``); ``torchrun``,
``fabric`` (Lightning Fabric) and ``ray`` (Ray Train) are one launcher each. Importing this package
imports no torch; its modules do.
"""
