"""The ``torch_native`` executor: DeviceMesh, DDP, FSDP2/HSDP, DTensor TP, context parallel, DCP.

``backend`` is the registered backend, ``parallelize`` the small ``apply_*`` functions applied in a
fixed order, ``session`` the training loop, ``checkpoint`` DCP save/load with its signed-later
``checkpoint_manifest``, ``sdc_audit`` the in-step replays, ``comm_meter``/``comm_taps`` the
observed collectives, ``verifiable`` the harness adapter. Importing this package imports no torch;
its modules do.
"""
