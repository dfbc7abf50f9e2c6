"""Verification: evidence machinery that works on executor objects typed by the contracts' protocols.

``admission`` (the gate), ``certification``, ``attestation`` (DSSE envelopes), ``cert_store``,
``capability`` (the harness's), ``keys`` (the trust store), ``strategies`` (hypothesis strategies for
every contract) and ``cli_commands`` sit here; ``harness/``, ``sdc/``, ``ledger/`` and ``conformance/`` are
one part each; ``health/`` holds the training-health monitor (FLOPs, MFU, anomalies).
Nothing here imports torch at import time; the harness, the workloads and the torch
helpers of the SDC audit import it when they run. The public names are those of the parts' ``__all__``.
"""

from . import (
    admission,
    attestation,
    capability,
    cert_store,
    certification,
    cli_commands,
    conformance,
    harness,
    health,
    keys,
    ledger,
    sdc,
)
from .admission import *  # noqa: F403 - re-exported through __all__
from .attestation import *  # noqa: F403
from .capability import *  # noqa: F403
from .cert_store import *  # noqa: F403
from .cli_commands import *  # noqa: F403
from .conformance import *  # noqa: F403
from .harness import *  # noqa: F403
from .health import *  # noqa: F403
from .keys import *  # noqa: F403
from .ledger import *  # noqa: F403
from .sdc import *  # noqa: F403
from .sdc.digest import digest

__all__ = sorted({
    *admission.__all__, *attestation.__all__, *capability.__all__, *cert_store.__all__,
    *cli_commands.__all__, *conformance.__all__, *harness.__all__, *health.__all__, *keys.__all__, *ledger.__all__,
    *sdc.__all__, "digest",
})
